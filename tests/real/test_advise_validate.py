"""`aprilsim advise` to `aprilsim validate` (issue 21): the recommendation's validate command, as
printed, runs on bundled in-process engines, for a slime launch script and for a verl config.

Kept small: advise on 8 groups x 3 steps and two candidates, so that its printed command
validates a small advised scenario (4 steps on two engines, lengths scaled down).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from aprilsim.advise_format import VERL_HINTS
from aprilsim.cli import main

pytest.importorskip("pandas")
DATA = Path(__file__).resolve().parents[1] / "data"
SETUPS = {
    "slime": ["--slime", str(DATA / "april-grpo-run-qwen3-4B-dapo-partial.sh")],
    "verl": ["--verl", str(DATA / "verl-dapo-e2e.yaml")],
}
SMALL = ["--set", "batch_size=8", "--steps", "3", "--seeds", "3", "--rounds", "1", "--grid", "2",
         "-j", "1", "--candidates", "april,async_one_step", "--log",
         str(DATA / "replay" / "table.csv")]


def _printed_validate(output: str) -> list[str]:
    """The arguments of the `aprilsim validate ...` line advise printed."""
    (line,) = [ln.strip() for ln in output.splitlines()
               if ln.strip().startswith("aprilsim validate ")]
    return shlex.split(line)[1:]


@pytest.mark.slow
@pytest.mark.parametrize("setup", sorted(SETUPS))
def test_advises_validate_command_runs_on_bundled_engines(tmp_path, setup):
    out = tmp_path / "advice"
    r = CliRunner().invoke(main, ["advise", *SETUPS[setup], *SMALL, "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert f"launch config: {setup}" in r.output
    advice = json.loads((out / "advice.json").read_text())
    args = _printed_validate(r.output)
    assert args[:4] == ["validate", str(out / "advised.toml"), "--local", "2"]
    base = advice["baseline"]  # what the config runs: april (slime), dynamic_sampling (verl)
    want = [base] if advice["winner"] == base else [base, advice["winner"]]
    assert [a for i, a in enumerate(args) if i and args[i - 1] == "-s"] == want
    v = CliRunner().invoke(main, [*args, "--no-figures"])
    assert v.exit_code == 0, v.output
    rep = json.loads((out / "validate" / "report.json").read_text())
    by = {s["label"]: s for s in rep["schedulers"]}
    assert list(by) == want
    for s in by.values():  # both sides ran every step of the advised scenario
        assert s["measured"]["steps"] == s["predicted"]["steps"]
    # and what verl offers for the winner (sync: verl's own default trainer)
    assert f"verl: {VERL_HINTS[advice['winner'].split('@')[0]]}" in r.output
