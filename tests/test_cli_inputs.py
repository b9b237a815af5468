"""Issue 22, inputs: no silent wrong answer, no traceback, no hang; each bad input is one line,
exit 2.

Every scenario here is tiny (a few groups, a few steps), run in-process through click's CliRunner.
"""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import event, given, settings
from hypothesis import strategies as st

from aprilsim.cli import main
from aprilsim.config import ScenarioError, scenario_from_dict
from aprilsim.policies.registry import make_scheduler
from aprilsim.sim.run import simulate
from aprilsim.sim.runtime import SchedulerError

TINY = """name = "tiny"
steps = 3
batch_size = 4
group_size = 2
max_response_len = 512
compare = COMPARE
[cluster]
CLUSTER
[lengths]
family = "lognormal"
mu = 5.0
sigma = 0.5
[prompts]
family = "lognormal"
mu = 4.0
sigma = 0.3
max_len = MAXLEN
"""


def tiny(extra: str = "", compare: str = '["sync", "april"]', cluster: str = "",
         max_len: str = "256") -> str:
    cluster = cluster if "engines" in cluster else "engines = 2\n" + cluster
    return (TINY.replace("COMPARE", compare).replace("CLUSTER", cluster)
            .replace("MAXLEN", max_len) + extra)


def run(tmp_path, text: str, *args: str, name: str = "s.toml"):
    p = tmp_path / name
    p.write_text(text)
    t0 = time.perf_counter()
    r = CliRunner().invoke(main, ["simulate", str(p), *args])
    r.took = time.perf_counter() - t0
    return r


def one_line_error(r, *needles: str) -> str:
    """The result is exit 2 with exactly one `aprilsim: error:` line holding every needle."""
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    assert r.exit_code == 2, (r.exit_code, r.output)
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("aprilsim")]
    assert len(lines) == 1 and lines[0].startswith("aprilsim: error: "), r.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


# ------------------------------------------------------------------ W1: strict knob types
@pytest.mark.parametrize("table,knob,value,words", [
    ("april", "recycle", '"false"', "expected true or false, got the string 'false'"),
    ("fully_async", "interrupt", '"no"', "expected true or false, got the string 'no'"),
    ("april", "token_budget", "100.0", "expected an integer (or unset), got 100.0"),
    ("april", "ratio", '"2"', "expected a finite number, got the string '2'"),
    ("dynamic_sampling", "max_rounds", "true", "expected an integer, got True"),
])
def test_knob_values_checked_by_declared_type(tmp_path, table, knob, value, words):
    r = run(tmp_path, tiny(f"[schedulers.{table}]\n{knob} = {value}\n", compare=f'["{table}"]'))
    one_line_error(r, f"schedulers.{table}.{knob}", words)


def test_knob_types_hold_for_the_library_and_the_command_line(tmp_path):
    with pytest.raises(ValueError, match="expected true or false"):
        make_scheduler("april", {"recycle": "false"})
    make_scheduler("april", {"recycle": False, "ratio": 2})  # an int is a number
    # `-s NAME@knob=v` gives a real boolean: recycle=false wastes tokens, recycle=true none
    r = run(tmp_path, tiny(), "-s", "april@recycle=false", "-s", "april", "--json")
    assert r.exit_code == 0, r.output
    rows = {row["scheduler"]: row for row in json.loads(r.stdout)}
    assert rows["april@recycle=false"]["wasted_tokens"] > 0 == rows["april"]["wasted_tokens"]


def test_scenario_fields_are_strict(tmp_path):
    r = run(tmp_path, tiny("[trainer]\nbase_s = false\n"))
    one_line_error(r, "trainer.base_s")
    r = run(tmp_path, tiny().replace("mu = 5.0", 'mu = "5.0"'))
    one_line_error(r, "lengths.mu", "expected a finite number")


# ------------------------------------------------------------------ W2: zero trained samples
@pytest.mark.parametrize("table,knob", [("april", "token_budget = 1"),
                                        ("april_ds", "std_threshold = 1e9")])
def test_zero_trained_samples_is_an_error(tmp_path, table, knob):
    r = run(tmp_path, tiny(f"[schedulers.{table}]\n{knob}\n", compare=f'["{table}"]'), "--json")
    one_line_error(r, f"{table}: trained no samples")
    assert r.stdout == ""  # no table row of zeros


def test_zero_trained_samples_raises_in_the_library():
    sc = scenario_from_dict({**_tiny_dict(), "schedulers": {"april": {"token_budget": 1}}})
    with pytest.raises(SchedulerError, match="trained no samples"):
        simulate(sc, "april")


def _tiny_dict() -> dict:
    import tomllib

    return tomllib.loads(tiny())


# ------------------------------------------------------------------ W3-W4: what cannot be simulated
@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_empty_compare_is_refused(tmp_path, json_flag):
    one_line_error(run(tmp_path, tiny(compare="[]"), *json_flag), "compare", "empty")


@pytest.mark.parametrize("extra,cluster,needle", [
    ("[trainer]\nbase_s = 1e18\n", "", "float64 seconds"),
    ("[trainer]\nsync_s = 1e12\n", "", "simulated clock"),
    ("", "abort_steps = 1000000000000000000", "cluster.abort_steps"),
])
def test_unsimulatable_values_are_bounded(tmp_path, extra, cluster, needle):
    one_line_error(run(tmp_path, tiny(extra, cluster=cluster)), needle)


def test_total_steps_and_run_size_are_bounded():
    """`steps` had no bound (10 million steps ran for days); nor had steps x requests a step."""
    from aprilsim.config import with_overrides
    from aprilsim.scenario_limits import MAX_RUN_REQUESTS, MAX_STEPS

    d = _tiny_dict()
    with pytest.raises(ScenarioError, match=r"^steps: 10,000,000 training steps .* at least ~2 ms"):
        scenario_from_dict({**d, "steps": 10_000_000})
    per_step = d["batch_size"] * d["group_size"]
    steps = MAX_RUN_REQUESTS // per_step + 1
    big = {**d, "steps": steps, "batch_size": d["batch_size"], "compare": ["sync"]}
    if steps > MAX_STEPS:  # a tiny step: reach the run-size bound with bigger steps instead
        big = {**big, "steps": 1000, "batch_size": MAX_RUN_REQUESTS // (1000 * d["group_size"]) + 1}
    with pytest.raises(ScenarioError, match=r"^steps: about [\d,]+ requests in the run"):
        scenario_from_dict(big)
    with pytest.raises(ScenarioError, match=r"^schedulers.april: about [\d,]+ requests in the run"):
        scenario_from_dict({**d, "steps": 1000, "batch_size": 1024, "group_size": 64,
                            "compare": ["sync", "april"], "schedulers": {"april": {"ratio": 4.0}}})
    sc = scenario_from_dict(d)  # --steps meets the same bound as the file's key
    with pytest.raises(ScenarioError, match="^steps: "):
        with_overrides(sc, steps=MAX_STEPS + 1)
    assert with_overrides(sc, steps=MAX_STEPS).steps == MAX_STEPS


def test_cli_steps_past_the_bound_is_one_line(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text(tiny())
    r = CliRunner().invoke(main, ["simulate", str(p), "--steps", "10000000000"])
    one_line_error(r, "steps: 10,000,000,000 training steps")


# ------------------------------------------------------------------ tracebacks and hangs
@pytest.mark.parametrize("extra,compare,cluster,max_len,needle", [
    ("[schedulers.april]\nratio = inf\n", '["april"]', "", "256", "schedulers.april.ratio"),
    ("[schedulers.april]\nratio = 1e308\n", '["april"]', "", "256", "requests per step"),
    ("[schedulers.april]\nratio = 1e9\n", '["april"]', "", "256", "requests per step"),
    ("", '["sync"]', "", "inf", "prompts.max_len"),
    ("", '["sync"]', "engines = 1000000000000000000", "256", "cluster.engines"),
    ("[schedulers.dynamic_sampling]\ngen_batch_size = 10000000\n", '["dynamic_sampling"]', "",
     "256", "requests per step"),
    ("[schedulers.tail_batching]\nextra_responses = 1000000\n", '["tail_batching"]', "", "256",
     "requests per step"),
])
def test_huge_or_infinite_values_are_refused_at_once(tmp_path, extra, compare, cluster, max_len,
                                                     needle):
    r = run(tmp_path, tiny(extra, compare=compare, cluster=cluster, max_len=max_len))
    one_line_error(r, needle)
    assert r.took < 2.0


def test_huge_batch_size_is_refused(tmp_path):
    text = tiny().replace("batch_size = 4", "batch_size = 9223372036854775807")
    one_line_error(run(tmp_path, text), "batch_size")


@pytest.mark.parametrize("shape", ["{a=", "["])
def test_deep_nesting_is_one_line(tmp_path, shape):
    close = "}" if shape == "{a=" else "]"
    text = tiny() + f"x = {shape * 500}1{close * 500}\n"
    one_line_error(run(tmp_path, text), "nested")


@pytest.mark.parametrize("target,needle", [("/etc", "is a folder"),
                                           ("/dev/zero", "not a regular file")])
def test_lengths_from_a_folder_or_device(tmp_path, target, needle):
    text = tiny().replace('family = "lognormal"\nmu = 5.0\nsigma = 0.5', f'from = "{target}"')
    r = run(tmp_path, text)
    one_line_error(r, "lengths.from", needle)
    assert r.took < 2.0


@pytest.mark.parametrize("module,suffix", [("matplotlib", ".png"), ("plotly", ".html")])
def test_timeline_extra_checked_before_simulating(tmp_path, monkeypatch, module, suffix):
    import sys

    monkeypatch.setitem(sys.modules, module, None)  # import MODULE -> ImportError
    r = run(tmp_path, tiny(), "--timeline", str(tmp_path / f"t{suffix}"),
            "--steps-out", str(tmp_path / "steps.jsonl"))
    one_line_error(r, "--timeline", module)
    assert "simulating" not in r.stderr  # refused before the first scheduler ran


def test_sweep_grid_seed_is_one_line(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text(tiny())
    r = CliRunner().invoke(main, ["sweep", str(p), "--grid", "seed=0,1", "-j", "1",
                                  "-o", str(tmp_path / "r.parquet")])
    one_line_error(r, "--seeds")


# ------------------------------------------------------------------ W6: tune
def test_tune_needs_three_seeds(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text(tiny())
    r = CliRunner().invoke(main, ["tune", str(p), "--knob", "schedulers.april.ratio=1:2",
                                  "--maximize", "rollout_throughput_tok_s", "--seeds", "2"])
    assert r.exit_code == 2 and "2 is not in the range x>=3" in r.stderr


def test_tune_constraint_takes_one_percent_sign():
    from aprilsim.sweep.tune import Constraint

    assert math.isclose(Constraint.parse("offpolicy_token_fraction<=5%").bound, 0.05)
    with pytest.raises(ScenarioError, match="not a number"):
        Constraint.parse("offpolicy_token_fraction<=5%%")


def test_sweep_point_that_trains_nothing_is_named(tmp_path):
    pytest.importorskip("pandas")
    p = tmp_path / "s.toml"
    p.write_text(tiny())
    r = CliRunner().invoke(main, ["sweep", str(p), "--grid", "schedulers.april.token_budget=1,100",
                                  "--seeds", "1", "-j", "1", "-o", str(tmp_path / "r.parquet")])
    one_line_error(r, "april: trained no samples", "at schedulers.april.token_budget=1, seed 0")


def test_large_but_real_setups_pass_the_bounds():
    """The bounds refuse what cannot run, not big clusters: 1,024 groups x 64 samples on 512
    engines with APRIL at ratio 4 (262k requests a step) validates."""
    data = {**_tiny_dict(), "batch_size": 1024, "group_size": 64, "compare": ["sync", "april"],
            "cluster": {"engines": 512}, "max_response_len": 32768,
            "schedulers": {"april": {"ratio": 4.0}}}
    sc = scenario_from_dict(data)
    assert sc.batch_size * sc.group_size == 65_536
    with pytest.raises(ScenarioError, match="requests per step"):
        scenario_from_dict({**data, "schedulers": {"april": {"ratio": 8.0, "token_budget": 512}}})


@pytest.mark.parametrize(("sets", "needle"), [
    (["lengths.mu=4611686018427387904"], "its median is inf tokens"),  # issue 36 item 5
    (["lengths.sigma=1e30"], "its largest draws overflow float64"),
    (["lengths.mu=40"], "its median is 2.35e+17 tokens"),
    (['lengths={family="lognormal_mixture", weights=[0.5, 0.5], mus=[8, 1e300], '
      'sigmas=[1, 1]}'], "lengths: lognormal_mixture"),
    (['lengths={family="gamma", shape=1e-300, scale=1e300}'], "its median is 0 tokens"),
    (["prompts.sigma=1e30"], "prompts: lognormal"),
])
def test_absurd_length_parameters_are_one_line_not_overflow_warnings(sets, needle):
    """`lengths.mu = 2^62` and `sigma = 1e30` ran under numpy's overflow warnings."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not one RuntimeWarning on the way to the refusal
        r = CliRunner().invoke(main, ["simulate", "--steps", "2",
                                      *[a for s in sets for a in ("--set", s)]])
    assert r.exit_code == 2, r.output
    assert r.stderr.count("\n") == 1 and needle in r.stderr


@pytest.mark.parametrize(("table", "needle"), [
    ("[workload.drift.a.b.c]\nd = 1", "workload.drift.a: a drift has no such table"),
    ("[workload.drift]\nslope = 0.01", "workload.drift.kind: missing"),  # item 24: no kind
    ('[workload.drift]\nkind = "linear"\nslope = 0.01\nsteps = [1]',
     "workload.drift.steps: a linear drift has no such key"),
    ('[workload.drift]\nkind = "linear"', "workload.drift.slope: missing"),
    ('[workload.drift]\nkind = "table"\nsteps = [0, 5]\nmean_lengths = [1, "x"]',
     "workload.drift.mean_lengths: expected finite numbers"),
])
def test_a_drift_table_is_typed(tmp_path, table, needle):
    """`[workload.drift.a.b.c] d = 1` was accepted, and a drift table without `kind` meant no
    drift, silently."""
    from aprilsim.config import default_scenario_text

    p = tmp_path / "s.toml"
    p.write_text(default_scenario_text() + "\n" + table + "\n")
    r = CliRunner().invoke(main, ["simulate", str(p), "--steps", "2"])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and needle in r.stderr, r.stderr
    p.write_text(default_scenario_text() + '\n[workload.drift]\nkind = "linear"\nslope = 0.01\n')
    assert CliRunner().invoke(main, ["simulate", str(p), "--steps", "2"]).exit_code == 0


def test_any_length_model_either_runs_without_warnings_or_is_refused():
    """Property: over wide parameters (log-scale mu up to 1e6, spreads from 1e-6 to 1e6), a
    length model is refused in one line or its draws are computed without a floating-point
    warning (what a run does with it); both outcomes are reached."""
    import warnings

    from aprilsim.workload.lengths import PARAMETRIC_PARAMS, check_drawable, length_model_from_dict

    seen = {"refused": 0, "accepted": 0}

    @settings(max_examples=150, deadline=None)
    @given(st.sampled_from(["lognormal", "gamma", "weibull", "loglogistic"]),
           st.floats(-1e6, 1e6, allow_nan=False), st.floats(1e-6, 1e6, allow_nan=False))
    def check(family, a, b):
        keys = PARAMETRIC_PARAMS[family]
        d = {"family": family, keys[0]: a if family == "lognormal" else abs(a) or 1.0,
             keys[1]: b}
        try:
            model = length_model_from_dict(d)
            check_drawable(model)
        except ValueError:
            event("refused")
            seen["refused"] += 1
            return
        event("accepted")
        seen["accepted"] += 1
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            x = model.ppf(np.linspace(1e-6, 1 - 1e-6, 64))
        assert np.all(np.isfinite(x))

    check()
    assert seen["refused"] >= 10 and seen["accepted"] >= 10, seen


@pytest.mark.parametrize("args", [
    ["advise", "--max-offpolicy", "nan"], ["advise", "--max-length-bias", "inf"],
    ["run", "--local", "1", "--scale", "nan"],
    ["run", "--local", "1", "--progress-deadline", "inf"],
])
def test_nan_and_inf_options_are_refused(tmp_path, args):
    """Issue 36 item 24: `advise --max-offpolicy nan` was accepted (nan passes every range
    check, so every run met the limit)."""
    r = CliRunner().invoke(main, [*args, *(["--out", str(tmp_path / "o")] if args[0] == "advise"
                                           else [])])
    assert r.exit_code == 2 and "is not a finite number" in r.stderr, r.output
    assert r.stderr.count("\n") == 1


def test_json_outputs_are_strict():
    """`advise --json` wrote bare NaN; every JSON an output writes is strict (null instead)."""
    from aprilsim.report.run_output import strict_json

    text = strict_json({"gain": math.nan, "interval": [1.0, math.inf], "label": "x"})
    assert json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c}")) == \
        {"gain": None, "interval": [1.0, None], "label": "x"}
