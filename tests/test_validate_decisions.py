"""Decisions apart from costs (issue 35, item 2): live vs simulated, step by step; a mismatch is
reported with the step where it starts and named as the cause, not blamed on the cost."""

from __future__ import annotations

import copy
import json

import pytest
from test_validate import TRUE, small_scenario

from aprilsim.metrics.trace import RequestSpan, Trace
from aprilsim.validate import simulate_matched
from aprilsim.validate.scaled import matched_engine


def _april(steps: int = 4):
    sc = small_scenario()
    eng = matched_engine(TRUE, max_running=64, kv_capacity=5120)
    tr = Trace(scheduler="april", n_engines=2)
    run = simulate_matched(sc, "april", eng, n_engines=2, scale=1 / 256, seed=1, steps=steps,
                           trace=tr)
    return sc, run, tr


def test_a_run_agrees_with_itself_and_its_decisions_are_read_from_steps_and_traces():
    from aprilsim.validate.decisions import agreement, step_decisions

    _, run, tr = _april()
    a = agreement(run, tr, run, tr)
    assert a["agree_steps"] == a["compared"] == 4 and a["first_mismatch"] is None
    rows = step_decisions(run, tr)
    assert [r["groups trained"] for r in rows] == [s.trained_groups for s in run.steps]
    aborted = sum(sp.reason == "abort" for sp in tr.requests)
    assert sum(r["requests aborted"] for r in rows) == aborted > 0
    assert all(len(r["in flight per engine"]) == 2 for r in rows)
    assert step_decisions(run, None)[0]["requests aborted"] is None  # no trace: not compared


def test_the_first_mismatch_is_the_step_where_it_starts():
    from aprilsim.validate.decisions import agreement, pooled_agreement

    _, run, tr = _april()
    live = copy.deepcopy(run)
    live.steps[1].scheduler_stats["dropped_groups"] = 4
    live.steps[2].offpolicy_tokens = 0
    a = agreement(live, tr, run, tr)
    assert a["first_mismatch"]["step"] == 1
    assert "surplus dropped 4 live" in a["first_mismatch"]["what"]
    assert a["agree_steps"] == 4 - 2
    bad = next(r for r in a["steps"] if r["step"] == 2)
    assert bad["cells"]["off-policy share"]["agree"] is False
    p = pooled_agreement([(0, agreement(run, tr, run, tr)), (1, a)])
    assert p["share"] == pytest.approx(6 / 8) and p["first_mismatch"]["round"] == 1
    assert p["rounds_with_mismatch"] == 1


def test_tolerances_absorb_an_abort_landing_an_iteration_later():
    """An abort that lands one iteration later resumes a few more tokens: within tolerance; a
    request more in flight on an engine is too."""
    from aprilsim.validate.decisions import TOLERANCE, agreement

    _, run, tr = _april()
    live = copy.deepcopy(run)
    s = next(s for s in live.steps if s.resumed_tokens > 0)
    s.resumed_tokens += int(TOLERANCE["tokens resumed"][0])
    extra = Trace(scheduler="april", n_engines=2, requests=list(tr.requests))
    st = live.steps[0]
    extra.requests.append(RequestSpan(0, 10**6, 10**6, 0, 0, st.rollout_start_s,
                                      st.rollout_start_s + st.rollout_time_s, 1, "stop"))
    assert agreement(live, extra, run, tr)["first_mismatch"] is None


def test_a_decision_mismatch_is_the_cause_not_the_cost(tmp_path):
    """The issue's case: live APRIL drops surplus groups and trains no off-policy tokens where the
    simulation does, and its rollouts are 40 % slower. The report names the decisions from the
    step where they differ, and does not blame the cost per iteration."""
    from real.runner.options import EngineTarget
    from real.validate import LiveOutcome, ValidateOptions, judge, write_all

    sc, run, tr = _april()
    cal = tmp_path / "cal.toml"
    cal.write_text("[cost]\na = 2e-3\nb = 1e-4\nc = 1e-6\np0 = 1e-3\np1 = 5e-4\n")
    live = copy.deepcopy(run)
    for i, s in enumerate(live.steps):
        s.rollout_time_s *= 1.4
        if i >= 2:
            s.scheduler_stats["dropped_groups"] = 3
            s.offpolicy_tokens = 0
    outs = [LiveOutcome("april", live, [[], []], copy.deepcopy(tr), 1.0, 0.0, round=r)
            for r in range(2)]
    opts = ValidateOptions(EngineTarget(engines=("saved",)), seed=1, steps=4, scale=1 / 256,
                           calibration=cal, repeats=2)
    limits = {"max_running": 64, "kv_capacity": 5120}
    v = judge(sc, ["april"], opts, outs, limits, "synthetic", [], 0.0)
    rep = write_all(v, tmp_path / "out", figures=False)
    text = " ".join(rep["explanations"])
    assert "decisions differ from step 2" in text and "not the cost" in text
    assert "Cause: cost per iteration" not in text
    assert rep["decisions"]["april"]["pooled"]["first_mismatch"]["step"] == 2
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## Decision agreement" in md and "round 1, step 2: surplus dropped 3 live vs" in md
    back = json.loads((tmp_path / "out" / "report.json").read_text())
    assert back["targets"]["step_rollout_error"]["verdict"] in ("missed", "undecided")
    assert "decisions differ from step 2" in back["targets"]["step_rollout_error"]["reason"] or \
        back["targets"]["step_rollout_error"]["verdict"] == "undecided"


def _judged(tmp_path, changed_rounds: tuple[int, ...]):
    """Two live rounds of APRIL, each the simulation's own run except the rounds in
    ``changed_rounds``, whose steps 2 and 3 drop three surplus groups."""
    from real.runner.options import EngineTarget
    from real.validate import LiveOutcome, ValidateOptions, judge, write_all

    sc, run, tr = _april()
    cal = tmp_path / "cal.toml"
    cal.write_text("[cost]\na = 2e-3\nb = 1e-4\nc = 1e-6\np0 = 1e-3\np1 = 5e-4\n")
    outs = []
    for r in range(2):
        live = copy.deepcopy(run)
        if r in changed_rounds:
            for s in live.steps[2:]:
                s.scheduler_stats["dropped_groups"] = 3
        outs.append(LiveOutcome("april", live, [[], []], copy.deepcopy(tr), 1.0, 0.0, round=r))
    opts = ValidateOptions(EngineTarget(engines=("saved",)), seed=1, steps=4, scale=1 / 256,
                           calibration=cal, repeats=2)
    v = judge(sc, ["april"], opts, outs, {"max_running": 64, "kv_capacity": 5120}, "synthetic",
              [], 0.0)
    return write_all(v, tmp_path / f"out{len(changed_rounds)}{changed_rounds}", figures=False)


def test_the_decision_target_reads_the_share_beside_the_live_rounds_own_agreement(tmp_path):
    """95 % of the steps must agree; below that, the live rounds' agreement with one another
    decides: a simulation that agrees with them as often as they do among themselves is
    undecided (a race the rounds settle differently), one that agrees less is missed."""
    t = _judged(tmp_path, ())["targets"]["decision_agreement"]
    assert (t["verdict"], t["share"], t["live_share"], t["steps"]) == ("met", 1.0, 1.0, 8)
    # one round off: the simulation agrees with 6 of 8 steps, the rounds with each other in 2 of 4
    rep = _judged(tmp_path, (1,))
    t = rep["targets"]["decision_agreement"]
    assert t["share"] == pytest.approx(0.75) and t["live_share"] == pytest.approx(0.5)
    assert t["verdict"] == "undecided" and "agree with one another in only 50.0%" in t["reason"]
    assert rep["decisions"]["april"]["pooled"]["live_floor"]["pairs"] == 1
    # both rounds off alike: they agree with each other, not with the simulation
    rep = _judged(tmp_path, (0, 1))
    t = rep["targets"]["decision_agreement"]
    assert (t["share"], t["live_share"], t["verdict"]) == (0.5, 1.0, "missed")
    assert "first mismatch: april round 1, step 2: surplus dropped 3 live" in t["reason"]
    assert rep["verdict"] == "missed"
    md = (tmp_path / "out2(0, 1)" / "report.md").read_text()
    assert "| steps whose decisions agree, live vs simulated" in md and "50.0% of 8" in md
