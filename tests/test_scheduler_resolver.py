"""One scheduler resolver (`NAME`, `module:Class`, `NAME@knob=v`) behind every command and API,
and one accessor per derived scenario value (issue 33, deliverable 3; issue 36, item 23).

Every way of setting a knob (a scenario's table, `--set`, `-s NAME@knob=v`, Python) meets the
same checks: the same error for the same bad value, whichever way it came in.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from cli_helpers import aprilsim

from aprilsim.config import ScenarioError, load_scenario, scenario_from_dict
from aprilsim.scheduler_spec import SchedulerSpec, build_scheduler, check_schedulers
from aprilsim.sweep.keys import apply, scenario_dict

ROOT = Path(__file__).resolve().parents[1]

# (scheduler, knob, value): values the bounds or the types refuse, and values they accept
BAD = [
    ("april", "ratio", 1e9),  # 238 GiB of prompt keys (issue 36 item 23)
    ("april_ds", "max_new_groups", 1e9),  # its refill submits fresh groups
    ("tail_batching", "extra_responses", 100_000_000),
    ("dynamic_sampling", "gen_batch_size", 1_000_000_000),
    ("fully_async", "inflight_ratio", 1e9),
    ("seer", "chunk", 1),  # 16k pieces a response: hours of CPU
    ("april", "ratio", "high"),  # a type error
    ("sync", "nope", 1),  # an unknown knob
]
GOOD = [("april", "ratio", 1.5), ("seer", "chunk", 512), ("fully_async", "eta", 2)]


def _via_set(name: str, knob: str, value: object) -> str | None:
    """The error of `--set schedulers.NAME.KNOB=V` (the scenario's own check), or None."""
    sc = load_scenario(None)
    d = apply(scenario_dict(sc), [(f"schedulers.{name}.{knob}", value)])
    d["compare"] = [name]
    try:
        scenario_from_dict(d, sc.base_dir)
    except (ScenarioError, ValueError) as e:
        return str(e)
    return None


def _via_spec(name: str, knob: str, value: object) -> str | None:
    """The error of `-s NAME@KNOB=V` (the resolver), or None."""
    shown = value if isinstance(value, str) else repr(value)
    try:
        build_scheduler(load_scenario(None), f"{name}@{knob}={shown}")
    except ValueError as e:
        return str(e)
    return None


@pytest.mark.parametrize(("name", "knob", "value"), BAD + GOOD)
def test_every_way_of_setting_a_knob_meets_the_same_checks(name, knob, value):
    via_set, via_spec = _via_set(name, knob, value), _via_spec(name, knob, value)
    assert (via_set is None) == ((name, knob, value) in GOOD)
    assert via_spec == via_set  # the same check, the same line
    via_python = None
    try:
        build_scheduler(load_scenario(None), name, {knob: value})
    except ValueError as e:
        via_python = str(e)
    assert via_python == via_set


def test_simulate_refuses_a_spec_past_the_bounds_in_one_line():
    r = aprilsim("simulate", "-s", "april@ratio=1e9", "--steps", "2")
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "1,000,000 one step may simulate" in r.stderr
    r = aprilsim("simulate", "-s", "seer@chunk=1", "--steps", "2")
    assert r.returncode == 2 and "raise its chunk" in r.stderr


def test_every_api_takes_a_spec():
    """build_simulation, aprilsim.simulate, the validate and live builders: one spelling."""
    import aprilsim as api
    from aprilsim.sim.build import build_simulation
    from aprilsim.validate.scaled import make_policy
    from real.runner.api import make_policy as live_policy

    sc = load_scenario(None)
    for build in (lambda s: build_simulation(sc, s).scheduler, lambda s: make_policy(sc, s),
                  lambda s: live_policy(sc, s)):
        p = build("april@ratio=1.5")
        assert (p.name, p.ratio) == ("april", 1.5)
    res = api.simulate(schedulers=["april@ratio=1.5"], steps=2)
    assert {r["scheduler"] for r in res.rows()} == {"april@ratio=1.5"}
    with pytest.raises(ValueError, match="1,000,000 one step"):
        api.simulate(schedulers=["sync", "april@ratio=1e9"], steps=2)


def test_a_spec_names_its_run_and_parses_once():
    s = SchedulerSpec.parse(" april@ratio=1.5, recycle=false ")
    assert (s.label, s.name, s.knobs) == ("april@ratio=1.5, recycle=false", "april",
                                          {"ratio": 1.5, "recycle": False})
    assert SchedulerSpec.parse("pkg.mod:Cls@x=1").name == "pkg.mod:Cls"
    for bad in ("@ratio=1", "april@ratio", "april@=2"):
        with pytest.raises(ValueError):
            SchedulerSpec.parse(bad)
    sc = load_scenario(None)
    assert [s.label for s in check_schedulers(sc, ["sync", "april@ratio=3", "sync"])] == \
        ["sync", "april@ratio=3"]


def test_a_sweep_of_a_spec_reads_the_schedulers_table():
    """`-s april@ratio=3` in a sweep: the run's identity includes `[schedulers.april]`."""
    from aprilsim.sweep.plan import Plan

    sc = load_scenario(None)
    d = {**scenario_dict(sc), "warmup_steps": 1}
    d["schedulers"] = {"april": {"recycle": False}}
    base = scenario_from_dict(d, sc.base_dir)
    plan = Plan.build(base, [(("steps",), [2])], schedulers=["april@ratio=3"], seeds=1)
    d2 = {**scenario_dict(sc), "warmup_steps": 1}
    d2["schedulers"] = {"april": {"recycle": True}}
    other = Plan.build(scenario_from_dict(d2, sc.base_dir), [(("steps",), [2])],
                       schedulers=["april@ratio=3"], seeds=1)
    assert plan.run_key(plan.runs()[0]) != other.run_key(other.runs()[0])


def test_derived_values_have_one_accessor(tmp_path):
    """`prompts.max_len` (2048 unless set) and every knob as it runs (class defaults under the
    scenario's table under the spec's) are read in one place each."""
    sc = load_scenario(None)
    d = scenario_dict(sc)
    d["prompts"] = {"family": "lognormal", "mu": 5.0, "sigma": 0.5}  # no max_len
    d["schedulers"] = {"april": {"ratio": 2.5}}
    bare = scenario_from_dict(d, sc.base_dir)
    assert bare.max_prompt_len == 2048
    assert bare.knobs_of("april")["ratio"] == 2.5
    assert bare.knobs_of("april@ratio=3")["ratio"] == 3
    assert bare.knobs_of("slime_dapo")["ratio"] == 1.0  # the class default, not restated
    from aprilsim.interop.slime import to_slime

    argv, _ = to_slime(bare, "april")
    assert argv[argv.index("--rollout-max-prompt-len") + 1] == "2048"
    assert argv[argv.index("--over-sampling-batch-size") + 1] == str(int(2.5 * bare.batch_size))
    # no module restates the default or reads the raw key
    restated = [str(p.relative_to(ROOT)) for pkg in ("aprilsim", "real")
                for p in (ROOT / pkg).rglob("*.py")
                if re.search(r"prompts\.get\(\s*[\"']max_len", p.read_text())
                and p.name != "config.py"]  # the accessor itself
    assert restated == []


@pytest.mark.slow
def test_run_takes_a_spec_on_live_engines(tmp_path):
    """`aprilsim run -s april@ratio=1.5 --local 1 --steps 2` (it said: unknown scheduler)."""
    r = aprilsim("run", "-s", "april@ratio=1.5", "--local", "1", "--steps", "2", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [row["scheduler"] for row in rows] == ["april@ratio=1.5"]
