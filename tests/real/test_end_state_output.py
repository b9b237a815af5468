"""The end-of-run ledger (in flight, buffered, trained, wasted) is written by every `simulate` and
`run` (issue 22): under `end_state` in `--json`, one line per scheduler under the table, and its
buckets add up to what the run created and what the engines generated."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from test_runner import TINY_TOML

from aprilsim.cli import main


def _check(view: dict) -> None:
    assert view["buffered_samples"] + view["trained_samples"] + view["wasted_samples"] \
        + view["pending_samples"] == view["samples_created"] > 0
    assert view["buffered_tokens"] + view["trained_tokens"] + view["wasted_tokens"] \
        == view["engine_tokens"]
    assert 0 <= view["in_flight_samples"] <= view["buffered_samples"]
    assert view["in_flight_tokens"] <= view["buffered_tokens"]


@pytest.mark.parametrize("command", ["simulate", "run"])
def test_end_state_in_json_and_table(tmp_path, command):
    scenario = tmp_path / "tiny.toml"
    scenario.write_text(TINY_TOML)
    extra = ["--local", "1"] if command == "run" else []
    names = ["-s", "sync", "-s", "fully_async"]
    res = CliRunner().invoke(main, [command, str(scenario), *names, *extra, "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    for row in rows:
        _check(row["end_state"])
    by = {r["scheduler"]: r["end_state"] for r in rows}
    assert by["sync"]["in_flight_samples"] == 0  # colocated: nothing is in flight after a step
    assert by["fully_async"]["trained_samples"] == by["sync"]["trained_samples"] > 0
    table = CliRunner().invoke(main, [command, str(scenario), *names, *extra])
    assert table.exit_code == 0, table.output
    lines = table.stdout.splitlines()
    at = lines.index("end of run (samples / tokens):")
    assert [line.split(":")[0].strip() for line in lines[at + 1:at + 3]] == ["sync", "fully_async"]
    assert f"{by['sync']['trained_samples']} trained" in lines[at + 1] or command == "run"
