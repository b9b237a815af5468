"""Verdicts that respect the noise (issue 35, item 1) and the exact split of a step's error into
its causes: met / missed / undecided, with reasons, pooled over rounds."""

from __future__ import annotations

import copy
import random

import pytest
from hypothesis import event, given, target
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st
from test_validate import TRUE, small_scenario

from aprilsim.validate import compare_runs, simulate_matched
from aprilsim.validate.causes import TERMS, cause_text, pooled_terms, step_terms
from aprilsim.validate.compare import SchedulerComparison
from aprilsim.validate.rounds import pooled
from aprilsim.validate.scaled import matched_engine
from aprilsim.validate.targets import targets
from aprilsim.validate.verdict import (
    MET,
    MISSED,
    NOISE_BAND,
    UNDECIDED,
    error_verdict,
    interval_verdict,
    ranking_verdict,
)


def test_an_error_is_met_below_its_bound_missed_only_beyond_its_noise():
    assert error_verdict(0.08, 0.30, 0.10).state == MET  # noise only inflates a median |error|
    v = error_verdict(0.25, 0.10, 0.10)
    assert v.state == UNDECIDED and "within 2x its noise floor 10.0%" in v.reason
    v = error_verdict(0.40, 0.10, 0.10, cause="cost per iteration")
    assert v.state == MISSED and "cause: cost per iteration" in v.reason
    assert "cause not measured" in error_verdict(0.40, 0.10, 0.10).reason
    v = error_verdict(0.40, None, 0.10)  # one round: nothing tells model error from noise
    assert v.state == UNDECIDED and "--repeats" in v.reason
    assert error_verdict(None, 0.1, 0.1) is None


def test_a_gain_error_is_judged_by_its_interval():
    """The issue's example: +2 +- 60 pp used to read "yes"; it straddles the bound."""
    assert interval_verdict(2.0, 60.0, 3.0).state == UNDECIDED
    assert interval_verdict(1.0, 1.5, 3.0).state == MET
    v = interval_verdict(13.8, 7.8, 3.0, cause="APRIL's cost")
    assert v.state == MISSED and "wholly outside" in v.reason and "APRIL's cost" in v.reason
    assert interval_verdict(-9.0, 2.0, 3.0).state == MISSED
    assert interval_verdict(0.1, None, 3.0).state == UNDECIDED  # one round: no interval


def test_decision_agreement_is_read_beside_the_live_rounds_own_agreement():
    from aprilsim.validate.verdict import agreement_verdict

    assert agreement_verdict(None, 1.0, 0.95) is None
    assert agreement_verdict(0.95, None, 0.95).state == "met"
    assert agreement_verdict(0.9, None, 0.95).state == "undecided"  # one round: no live floor
    v = agreement_verdict(0.9, 0.9, 0.95)
    assert v.state == "undecided" and "as often as they do among themselves" in v.reason
    v = agreement_verdict(0.8, 0.9, 0.95, "april round 2, step 1: surplus dropped")
    assert v.state == "missed" and v.reason.endswith("first mismatch: april round 2, step 1: "
                                                     "surplus dropped")


def test_a_ranking_is_missed_only_when_a_pair_is_reversed_beyond_the_noise():
    keep = {"a": "april", "b": "sync", "mean": 0.20, "half_width": 0.05}
    assert ranking_verdict([keep], 0.02).state == MET
    tie = {**keep, "mean": -0.01, "half_width": 0.005}
    assert ranking_verdict([tie], 0.02).state == MET
    assert ranking_verdict([{**keep, "mean": -0.10, "half_width": 0.05}], 0.02).state == MISSED
    assert ranking_verdict([{**keep, "mean": -0.03, "half_width": 0.05}], 0.02).state == UNDECIDED
    assert ranking_verdict([{**keep, "half_width": None}], 0.02).state == UNDECIDED
    assert ranking_verdict([], 0.02) is None


REACH: dict[str, int] = {}


@hyp_settings(max_examples=300, derandomize=True, deadline=None)
@given(err=st.floats(0.0, 2.0), floor=st.one_of(st.none(), st.floats(0.0, 1.0)),
       bound=st.sampled_from([0.05, 0.10]))
def _error_properties(err, floor, bound):
    v = error_verdict(err, floor, bound)
    REACH["examples"] = REACH.get("examples", 0) + 1
    REACH[v.state] = REACH.get(v.state, 0) + 1
    event(v.state)
    assert (v.state == MET) == (err <= bound)
    if v.state == MISSED:  # beyond the bound even after the whole noise band is taken off
        assert floor is not None and err - NOISE_BAND * floor > bound
        target(err - NOISE_BAND * floor - bound, label="margin of a miss")
    # a larger floor never turns an undecided or met verdict into a miss
    if floor is not None and v.state != MISSED:
        assert error_verdict(err, 2 * floor + 0.01, bound).state != MISSED


def test_error_verdict_properties():
    REACH.clear()
    _error_properties()
    n = REACH["examples"]
    assert n >= 250, REACH
    for state in (MET, MISSED, UNDECIDED):
        assert REACH.get(state, 0) >= 0.05 * n, (state, REACH)


def _pair(factor_live: float, priced: float = 1.0, logged: float = 1.0, steps: int = 4):
    sc = small_scenario()
    eng = matched_engine(TRUE, max_running=64, kv_capacity=5120)
    sim = simulate_matched(sc, "sync", eng, n_engines=2, scale=1 / 256, seed=1, steps=steps)
    live = copy.deepcopy(sim)
    for s in live.steps:
        s.rollout_time_s *= factor_live
    busy = [max(s.busy_by_engine_s) for s in sim.steps]
    return compare_runs("sync", sim, live, [logged * b for b in busy], [priced * b for b in busy])


def test_the_three_terms_add_up_to_each_step_s_error():
    """Live 30 % slower, its iterations taking 1.2x their price: the cost term is -0.2 x the
    busy share, the rules term 0, the rest outside the engines; their sum is the step's error."""
    r = _pair(1.3, priced=1.0, logged=1.2)
    terms = step_terms(r)
    assert terms is not None
    for k, e in enumerate(r.step_errors):
        assert sum(terms[t][k] for t in TERMS) == pytest.approx(e, abs=1e-12)
    assert all(x == pytest.approx(0.0, abs=1e-12) for x in terms["rules"])
    pt = pooled_terms([r])
    assert "cost per iteration" in cause_text(pt) or "outside" in cause_text(pt)
    assert step_terms(SchedulerComparison("x", {}, {}, [1.0], [1.0], 0)) is None


@hyp_settings(max_examples=200, derandomize=True, deadline=None)
@given(st.lists(st.tuples(*(st.floats(0.01, 100.0),) * 5), min_size=1, max_size=8))
def _split_is_exact(steps):
    pred = [s[0] for s in steps]
    meas = [s[1] for s in steps]
    busy, priced, logged = ([s[i] for s in steps] for i in (2, 3, 4))
    r = SchedulerComparison("x", {}, {}, pred, meas, 0, busy, logged, priced)
    t = step_terms(r)
    event(f"{len(steps)} steps")
    worst = 0.0
    for k, e in enumerate(r.step_errors):
        worst = max(worst, abs(sum(t[x][k] for x in TERMS) - e))
    target(worst, label="largest split residual")
    assert worst <= 1e-9 * max(1.0, max(abs(e) for e in r.step_errors))


def test_the_split_is_exact_for_any_step_times():
    _split_is_exact()


def test_verdicts_pool_every_round_and_say_why():
    """Three rounds whose measured times move +-10 % around a 30 % slower live run: the step
    error is judged against the rounds' mean beside the floor of that mean; the summary reasons
    name each scheduler."""
    rng = random.Random(3)
    rounds = []
    for _ in range(3):
        rounds.append([_pair(1.3 * (1 + rng.uniform(-0.1, 0.1)), logged=1.25)])
    t = targets(rounds[0], pooled(rounds))
    s = t["step_rollout_error"]
    assert s["against"] == "mean of the rounds" and s["floor_judged"]["sync"] is not None
    assert s["verdict"] == MISSED and "sync:" in s["reason"] and "cause:" in s["reason"]
    assert s["by_scheduler_verdict"]["sync"]["verdict"] == MISSED and s["met"] is False
