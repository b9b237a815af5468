"""The validation report's fixes (issue 35, item 5): each test failed on the code before them.

- a cross-fitted (or any R >= 2) report names where its cost came from;
- the priced-gain target is pooled over every round, not taken from round 1;
- with ``--calibration`` the report does not claim a step-interval fit that never ran;
- a collapsed compute fit (coefficients about 0, 100 % error) is not printed as a real one;
- ``--repeats 1`` gives no floor: the report says so and decides nothing on a point value;
- ``validate --help`` lists ``--from-log``;
- priced engine time is not called load-independent.
"""

from __future__ import annotations

import pytest
from test_validate import TRUE, small_scenario

from aprilsim.engine.cost import CostModel
from aprilsim.validate import compare_runs, simulate_matched
from aprilsim.validate.costfit import CostFit
from aprilsim.validate.report import report_dict, report_markdown, targets
from aprilsim.validate.rounds import pooled
from aprilsim.validate.scaled import matched_engine


def _fit(**kw) -> dict:
    base = dict(cost=TRUE, wall=TRUE, overhead_s=0.0009, decode_median_err=0.05,
                prefill_median_err=0.1, n_decode=100, n_prefill=10, decode_share=0.8)
    return CostFit(**{**base, **kw}).to_dict()


def _runs(steps: int = 4):
    sc = small_scenario()
    eng = matched_engine(TRUE, max_running=64, kv_capacity=5120)
    return {s: simulate_matched(sc, s, eng, n_engines=2, scale=1 / 256, seed=1, steps=steps)
            for s in ("sync", "april")}


def _rounds(factors, priced=None):
    """One round per factor: live rollout times scaled by it; ``priced``: per round, the factor on
    APRIL's priced busiest-engine time (1: the simulated one)."""
    import copy

    sims = _runs()
    out = []
    for i, f in enumerate(factors):
        row = []
        for lab, sim in sims.items():
            live = copy.deepcopy(sim)
            for s in live.steps:
                s.rollout_time_s *= f
            busy = [max(s.busy_by_engine_s) for s in sim.steps]
            pf = (priced[i] if priced else 1.0) if lab == "april" else 1.0
            row.append(compare_runs(lab, sim, live, busy, [pf * b for b in busy]))
        out.append(row)
    return out


def test_a_report_of_several_rounds_says_where_its_cost_came_from():
    """``report_markdown`` reused ``m`` for each gain's interval: with R >= 2 it printed
    "From  (file ...)" and a cross-fitted report never said it was cross-fitted."""
    rounds = _rounds([1.0, 1.05, 0.95])
    meta = {"scenario": "x", "calibration_from": "cross-fitted: each of the 3 rounds is judged ..."}
    md = report_markdown(report_dict(rounds[0], meta, _fit(), pooled(rounds)))
    assert "From cross-fitted: each of the 3 rounds" in md


def test_the_priced_gain_target_pools_every_round():
    """Round 1 prices APRIL's work as simulated, round 2 10 % dearer: the target is the paired
    mean over both rounds (with its interval), not round 1's 0 pp."""
    from aprilsim.validate.compare import gains

    rounds = _rounds([1.0, 1.0], priced=[1.0, 1.1])
    per = [gains(r)["april"]["diff_priced_pp"] for r in rounds]
    assert per[0] == pytest.approx(0.0, abs=1e-9) and per[1] > 5
    t = targets(rounds[0], pooled(rounds))["gain_priced_pp"]
    assert t["worst"] == pytest.approx(abs(sum(per) / 2), rel=1e-6)
    assert t["met"] is not True


def test_a_given_calibration_is_not_reported_as_a_step_interval_fit(tmp_path):
    """``--calibration FILE``: the report names the file's cost; it does not claim the fit to
    step-end-to-step-end intervals nor a "Median gap between busy steps 0.000 ms"."""
    from aprilsim.metrics.trace import Trace
    from real.runner.options import EngineTarget
    from real.validate import LiveOutcome, ValidateOptions, judge, write_all

    cal = tmp_path / "cal.toml"
    cal.write_text("[cost]\na = 2e-3\nb = 1e-4\nc = 1e-6\np0 = 1e-3\np1 = 5e-4\n")
    sc = small_scenario()
    live = [LiveOutcome(lab, run, [[], []], Trace(scheduler=lab, n_engines=2), 1.0, 0.0)
            for lab, run in _runs(3).items()]
    opts = ValidateOptions(EngineTarget(engines=("saved",)), seed=1, steps=3, scale=1 / 256,
                           calibration=cal)
    v = judge(sc, ["sync", "april"], opts, live, {"max_running": 64, "kv_capacity": 5120},
              "synthetic", [], 0.0)
    write_all(v, tmp_path / "out", figures=False)
    md = (tmp_path / "out" / "report.md").read_text()
    assert "Median gap between busy steps" not in md
    assert "step-end-to-step-end" not in md
    assert str(cal) in md


def test_a_collapsed_compute_fit_is_not_printed_as_real():
    """Coefficients about 0 and a 100 % median error: the report says the fit collapsed."""
    zero = CostModel(a=1e-12, b=0.0, c=0.0, p0=1e-12, p1=0.0)
    md = report_markdown(report_dict(_rounds([1.0])[0], {"calibration_from": "rows"},
                                     _fit(cost=zero, decode_median_err=1.0,
                                          prefill_median_err=1.0)))
    assert "collapsed" in md
    assert "decode a 0.000 ms + b 0.0 us" not in md


def test_one_round_has_no_noise_floor_and_the_report_says_so():
    """``--repeats 1``: no floor; the report warns and no target reads met or missed on a point
    value that no interval qualifies."""
    rounds = _rounds([1.3])
    rep = report_dict(rounds[0], {"rounds": 1}, _fit(), pooled(rounds))
    md = report_markdown(rep)
    assert "one round" in md.lower() and "--repeats" in md
    for key in ("gain_vs_sync_pp", "step_rollout_error"):
        assert rep["targets"][key]["verdict"] == "undecided", rep["targets"][key]


def test_validate_help_lists_from_log():
    from click.testing import CliRunner

    from aprilsim.cli import main

    r = CliRunner().invoke(main, ["validate", "--help"])
    assert r.exit_code == 0 and "--from-log" in r.output


def test_priced_engine_time_is_not_called_load_independent():
    rounds = _rounds([1.0, 1.1])
    md = report_markdown(report_dict(rounds[0], {}, _fit(), pooled(rounds)))
    assert "load-independent" not in md
