"""Speculative decoding's acceptance models with sourced parameters (issue 38 item 2): a global,
group-aware draft (Seer's), history drafts (RhymeRL, SPEC-RL), a draft model (EAGLE-3 at
NeMo-RL's measured accept lengths) and its staleness, the warning outside published figures,
and fast == reference over whole runs with each."""

from __future__ import annotations

import math

import pytest
from sched_helpers import run, small_scenario
from test_engine_speculative import _with_spec
from test_whole_run_equivalence import _assert_same_run, _tight

from aprilsim.config import ScenarioError, scenario_from_dict
from aprilsim.engine.cost import CostModel, EngineSpec
from aprilsim.engine.draft_board import DraftBoard, Stamp
from aprilsim.engine.fast import FastEngine
from aprilsim.engine.reference import ReferenceEngine
from aprilsim.engine.request import Request
from aprilsim.engine.speculative import Q, attach_board, tokens_per_step
from aprilsim.engine.speculative_spec import SpeculativeSpec, acceptance_notes

COST = CostModel(a=0.005, b=1e-4, c=2e-7, p0=0.01, p1=1e-5, p2=1e-8)


def _spec(**kw) -> SpeculativeSpec:
    return scenario_from_dict({"lengths": {"family": "lognormal", "mu": 6, "sigma": 1},
                               "cluster": {"speculative": kw}}).engine_spec().speculative


# ---------------------------------------------------------------- sourced defaults
def test_model_acceptance_defaults_to_nemo_rls_eagle3_accept_length():
    """2.26 tokens per verify step at k_max: the middle of NeMo-RL's 2.05 and 2.47."""
    sp = _spec(acceptance="model")
    assert tokens_per_step(sp.k_max, sp.p) == pytest.approx((2.05 + 2.47) / 2)
    own = _spec(acceptance="model", accept_len=2.05, k_max=3)
    assert tokens_per_step(3, own.p) == pytest.approx(2.05)
    assert _spec(acceptance="model", p=0.3).p == 0.3  # a p given wins


def test_group_and_history_default_to_seers_accept_lengths():
    """p0 and p_max give Seer's 1.70 (no group context) and 2.85 (the group's) at k_max."""
    for acc in ("group", "history"):
        sp = _spec(acceptance=acc, k_max=5)
        assert tokens_per_step(5, sp.p0) == pytest.approx(1.70)
        assert tokens_per_step(5, sp.p_max) == pytest.approx(2.85)
    # the plain models keep their plain defaults (runs configured before keep their figures)
    assert _spec(acceptance="siblings") == SpeculativeSpec(acceptance="siblings")
    assert _spec() == SpeculativeSpec()


@pytest.mark.parametrize(("bad", "msg"), [
    ({"acceptance": "model", "staleness": 1.0}, "staleness"),
    ({"acceptance": "model", "retrain_every": -1}, "retrain_every"),
    ({"acceptance": "model", "accept_len": 0.5}, "accept_len"),
    ({"acceptance": "group", "k_max": 1000}, "k_max"),
])
def test_bad_model_keys_give_one_line_errors(bad, msg):
    with pytest.raises(ScenarioError, match=msg) as got:
        _spec(**bad)
    assert "\n" not in str(got.value)


def test_a_setting_outside_the_published_figures_is_said():
    """The issue's case: siblings p_max 0.9 at k 6 is 5.2 tokens per verify step, where the
    published RL figures stop at 2.85; the sourced defaults say nothing."""
    (note,) = acceptance_notes(_spec(acceptance="siblings", k_max=6))
    assert "up to 5.22 tokens per verify step" in note and "1.70-2.85" in note
    for acc in ("model", "group", "history"):
        assert acceptance_notes(_spec(acceptance=acc)) == []
    (low,) = acceptance_notes(_spec(acceptance="model", accept_len=1.3))
    assert "below the published 2.05-2.47" in low


# ---------------------------------------------------------------- the board
def _stamp(board, rid, uid, *, group=0, n=4, prompt=-1, version=0, carried=0, left=1000):
    board.stamp(rid, Stamp(group, n, uid, prompt, version, carried, left))


def test_group_acceptance_counts_siblings_text_wherever_it_runs():
    sp = _spec(acceptance="group")
    lo, hi = round(sp.p0 * Q), round(sp.p_max * Q)
    b = DraftBoard(sp)
    for uid in range(4):
        _stamp(b, uid, uid)
    assert b.units(0) == lo  # nothing generated yet
    b.report(1, 1000, "stop")  # sibling 1 finished
    assert b.units(0) == sp.group_units(1 / 3)
    b.report(2, 400, "length")  # sibling 2: a piece of 400 tokens came back
    _stamp(b, 10, 2, carried=400, left=600)  # ... and goes on
    _stamp(b, 20, 0, carried=800, left=200)  # sample 0's next piece, at 800 tokens
    # sibling 2 covers half of sample 0's position, sibling 3 nothing
    assert b.units(20) == sp.group_units((1 + 0.5 + 0) / 3)
    assert b.units(10) == sp.group_units((1 + 1 + 0) / 3)  # sample 0 is ahead of sample 2
    b.report(3, 1000, "stop")
    b.report(10, 600, "stop")
    assert b.units(20) == hi  # every sibling finished
    b.report(20, 50, "abort")  # an aborted piece finishes nothing
    assert 0 not in b.groups[0].finished


def test_history_acceptance_ages_with_the_policy():
    sp = _spec(acceptance="history", staleness=0.1)
    b = DraftBoard(sp)
    _stamp(b, 0, 0, prompt=7, version=0, left=100)
    assert b.units(0) == round(sp.p0 * Q)  # never seen
    b.report(0, 100, "stop")
    _stamp(b, 1, 1, prompt=7, version=0)  # the same step: not history
    assert b.units(1) == round(sp.p0 * Q)
    _stamp(b, 2, 2, prompt=7, version=1)  # the next epoch, one version later: fresh
    assert b.units(2) == round(sp.p_max * Q)
    _stamp(b, 3, 3, prompt=7, version=3)  # three versions later: two lost to staleness
    assert b.units(3) == round(sp.p_max * 0.9 ** 2 * Q)
    b.report(2, 10, "length")  # a capped piece is not a finished response
    assert b.seen[7] == (0, -1)


@pytest.mark.parametrize(("every", "version", "age"), [(0, 5, 5), (2, 5, 1), (3, 6, 0)])
def test_a_draft_model_loses_acceptance_until_it_is_retrained(every, version, age):
    sp = _spec(acceptance="model", staleness=0.05, retrain_every=every)
    b = DraftBoard(sp)
    _stamp(b, 0, 0, version=version)
    assert b.units(0) == round(sp.p * 0.95 ** age * Q)


def test_an_engine_sees_a_sibling_finish_on_another_engine_at_its_next_event():
    """Seer's draft server is global: a sibling finishing on engine 0 raises the acceptance of
    its sibling on engine 1 from engine 1's next event on (not within its decode span)."""
    spec = EngineSpec(cost=COST, kv_capacity=100_000, speculative=_spec(acceptance="group"))
    sp = spec.speculative
    engines = [FastEngine(spec, 0), FastEngine(spec, 1)]
    board = DraftBoard(sp)
    attach_board(engines, board)
    # group 0: sample 0 (short) on engine 0, sample 1 (long) on engine 1; engine 1 also runs a
    # short request of another group, whose end is engine 1's next event
    _stamp(board, 0, 0, n=2, left=50)
    _stamp(board, 1, 1, n=2, left=400)
    _stamp(board, 2, 2, group=1, n=2, left=120)
    engines[0].submit([Request(0, 10, 50, 50)], 0.0)
    engines[1].submit([Request(1, 10, 400, 400), Request(2, 10, 120, 120)], 0.0)
    sib1 = engines[1].speculative.sib
    assert sib1.own[1] == round(sp.p0 * Q)
    while not any(c.rid == 0 for c in engines[0].advance()):
        pass
    assert sib1.own[1] == round(sp.p0 * Q)  # not yet: engine 1 is inside a span
    while not any(c.rid == 2 for c in engines[1].advance()):
        pass
    assert sib1.own[1] == round(sp.p_max * Q)  # read at engine 1's event


# ---------------------------------------------------------------- whole runs
MODELS = {
    "group": {"acceptance": "group", "k_max": 6, "draft_budget": 48},
    "history": {"acceptance": "history", "k_max": 4, "staleness": 0.05},
    "model": {"acceptance": "model", "k_max": 3, "staleness": 0.1, "retrain_every": 2},
}


@pytest.mark.parametrize("acc", sorted(MODELS))
@pytest.mark.parametrize("name", ["sync", "april", "seer"])
def test_whole_runs_agree_with_each_acceptance_model(name, acc):
    """fast == reference over whole runs on a tight KV cache (retractions), with the prompts
    repeating every step (history has material) and seer's pieces reporting mid-response; the
    acceptance moves (several levels) and saves decode time."""
    sc = small_scenario(engines=2, batch=6, group=4, max_len=3072, steps=4, seed=4)
    sc = sc.model_copy(update={"workload": sc.workload.model_copy(
        update={"dataset_prompts": 6})})
    sc = _with_spec(_tight(sc), MODELS[acc])
    settings = {"chunk": 300} if name == "seer" else {}
    fast = run(sc, name, settings)
    ref = run(sc, name, settings, engine_factory=ReferenceEngine)
    _assert_same_run(fast, ref)
    for fe, re_ in zip(fast.sim.engines, ref.sim.engines, strict=True):
        assert fe.stats == re_.stats
    steps = fast.result.steps
    assert sum(r.retractions for r in steps) > 0
    assert sum(r.speculative_time_s for r in steps) < 0
    levels = {u for e in fast.sim.engines for _, u in e.cost._cache}
    assert len(levels) > 1, levels  # the acceptance moved (with the board, the batch or age)


def test_group_acceptance_does_not_depend_on_where_siblings_run():
    """The artefact issue 38 found: engine-local sibling counts made the speculative gain depend
    on the routing (round robin spreads a group, its engines see few sibling finishes). With the
    global board, sync's speed-up under round robin is not below the one under veRL's group
    dispatch; with the engine-local count, at the same p0 and p_max, it is well below (1.51x
    against 1.84x here), and under group dispatch the two models agree (every sibling is local)."""
    base = small_scenario(engines=4, batch=16, group=8, max_len=3072, steps=3, seed=1)
    grouped = MODELS["group"]
    sp = _spec(**grouped)
    local = {**grouped, "acceptance": "siblings", "p0": sp.p0, "p_max": sp.p_max}

    def speedup(spec: dict, dispatch: str) -> float:
        plain = run(base, "sync", {"dispatch": dispatch}).result.steps
        fast = run(_with_spec(base, spec), "sync", {"dispatch": dispatch}).result.steps
        return sum(r.rollout_time_s for r in plain[1:]) / sum(r.rollout_time_s for r in fast[1:])

    board = {d: speedup(grouped, d) for d in ("router", "group")}
    engine_local = {d: speedup(local, d) for d in ("router", "group")}
    assert board["router"] >= 0.97 * board["group"] > 1.5, board
    assert engine_local["router"] < 0.9 * engine_local["group"], engine_local
    assert math.isclose(engine_local["group"], board["group"], rel_tol=1e-9)
