"""`aprilsim simulate --scheduler X --json` for every scheduler; `aprilsim schedulers`."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from sched_helpers import EXAMPLES, ROOT, USER_SCHEDULER

from aprilsim.cli import main
from aprilsim.policies.registry import REGISTRY, knobs

DS_SCENARIO = str(ROOT / "experiments" / "scenarios" / "dynamic_sampling.toml")


@pytest.mark.parametrize("scenario", [None, DS_SCENARIO], ids=["default", "dynamic_sampling"])
@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_simulate_json_every_scheduler(name, scenario):
    args = ["simulate", "--scheduler", name, "--json", "--steps", "2"]
    if scenario:
        args.insert(1, scenario)
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.output)
    assert row["scheduler"] == name and row["steps"] == 1 and row["warmup_steps"] == 1
    assert row["trained_samples"] == 1 * 32 * 8  # one summarised step of N groups x 8
    assert row["rollout_throughput_tok_s"] > 0


def test_steps_out_carries_scheduler_figures(tmp_path):
    out = tmp_path / "steps.jsonl"
    res = CliRunner().invoke(
        main, ["simulate", DS_SCENARIO, "-s", "dynamic_sampling", "--steps", "2", "--json",
               "--steps-out", str(out)]
    )
    assert res.exit_code == 0, res.output
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(recs) == 2
    assert all(r["scheduler"] == "dynamic_sampling" and r["scheduler_stats"]["rounds"] >= 1
               and "filtered_groups" in r["scheduler_stats"] for r in recs)
    assert sum(r["wasted_tokens"] for r in recs) > 0  # filtered groups are waste


def test_schedulers_lists_every_scheduler_with_knobs():
    res = CliRunner().invoke(main, ["schedulers"])
    assert res.exit_code == 0
    for name, cls in REGISTRY.items():
        assert f"{name} ({cls.mode}): " in res.output
        for k in knobs(cls):
            assert f"  {k.name} = " in res.output
    rows = json.loads(CliRunner().invoke(main, ["schedulers", "--json"]).output)
    assert {r["name"] for r in rows} == set(REGISTRY)
    fa = next(r for r in rows if r["name"] == "fully_async")
    assert fa["mode"] == "disaggregated"
    assert {k["name"]: k["default"] for k in fa["knobs"]} == {
        "eta": 4, "inflight_ratio": 2.0, "interrupt": True
    }


def test_user_scheduler_by_module_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    res = CliRunner().invoke(main, ["schedulers", USER_SCHEDULER])
    assert res.exit_code == 0 and "ratio = 1.5" in res.output
    res = CliRunner().invoke(main, ["simulate", "-s", USER_SCHEDULER, "--json", "--steps", "2"])
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.output)
    assert row["scheduler"] == "early_stop" and row["max_staleness"] == 0
    assert row["discarded_samples"] > 0


@pytest.mark.parametrize("bad", ["nope", "no_such_module:X", "aprilsim.types:Nothing"])
def test_unknown_scheduler_is_a_one_line_error(bad):
    res = CliRunner().invoke(main, ["schedulers", bad])
    assert res.exit_code == 2
    assert res.output.count("\n") == 1 and "error" in res.output
