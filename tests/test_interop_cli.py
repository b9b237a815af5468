"""`aprilsim scenario --from-slime/--from-verl/--to-slime` as a user runs them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from aprilsim.cli import main

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DATA = Path(__file__).parent / "data"


def test_from_slime_prints_a_scenario_and_one_warning(tmp_path):
    r = CliRunner().invoke(main, ["scenario", "--from-slime",
                                  str(DATA / "april-grpo-run-qwen3-4B-dapo-partial.sh")])
    assert r.exit_code == 0, r.stderr
    data = tomllib.loads(r.stdout)
    assert data["batch_size"] == 32 and data["schedulers"]["april"]["ratio"] == 2.0
    warns = [line for line in r.stderr.splitlines() if "warning" in line]
    assert len(warns) == 1 and "--lr" in warns[0]
    out = tmp_path / "s.toml"
    out.write_text(r.stdout)
    back = CliRunner().invoke(main, ["scenario", "--to-slime", str(out)])
    assert back.exit_code == 0, back.stderr
    assert "--over-sampling-batch-size 64" in back.stdout and "--partial-rollout" in back.stdout


def test_from_slime_accepts_an_argument_string():
    r = CliRunner().invoke(main, ["scenario", "--from-slime", "--rollout-batch-size 8 --colocate"])
    assert r.exit_code == 0, r.stderr
    assert tomllib.loads(r.stdout)["batch_size"] == 8
    assert "warning" not in r.stderr


def test_from_verl_and_bad_input():
    pytest.importorskip("yaml")
    r = CliRunner().invoke(main, ["scenario", "--from-verl", str(DATA / "verl-dapo-e2e.yaml")])
    assert r.exit_code == 0, r.stderr
    assert tomllib.loads(r.stdout)["compare"] == ["sync", "dynamic_sampling"]
    bad = CliRunner().invoke(main, ["scenario", "--from-slime", "--rollout-batch-size many"])
    assert bad.exit_code == 2 and "--rollout-batch-size" in bad.stderr
    typo = CliRunner().invoke(main, ["scenario", "--from-slime", "no-such-script.sh"])
    assert typo.exit_code == 2 and "no slime flags found" in typo.stderr
    both = CliRunner().invoke(main, ["scenario", "--from-slime", "x", "--to-slime", "y"])
    assert both.exit_code == 2
