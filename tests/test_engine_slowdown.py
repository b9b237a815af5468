"""Engines of unequal speed (`[cluster] engine_slowdown`): each engine's steps scaled, the rules
unchanged, in the fast and the reference engine alike."""

from __future__ import annotations

import math

import pytest

from aprilsim.config import ScenarioError, scenario_from_dict
from aprilsim.conformance import small_scenario
from aprilsim.engine.cost import CostModel, EngineSpec, TabulatedCost, slowed
from aprilsim.engine.reference import ReferenceEngine
from aprilsim.sim.run import simulate


def _scenario(slowdown, **cluster):
    return small_scenario(steps=3, engines=len(slowdown) if slowdown else 2,
                          cluster={"engine_slowdown": slowdown, **cluster})


def test_a_slowed_spec_scales_every_cost_term_and_nothing_else():
    lin = EngineSpec(cost=CostModel(a=1e-3, b=2e-5, c=3e-8, p0=4e-3, p1=5e-5, p2=6e-9, pr=7e-4))
    s = slowed(lin, 1.5)
    assert s.cost.decode_time(8, 1000) == pytest.approx(1.5 * lin.cost.decode_time(8, 1000))
    assert s.cost.prefill_time(300, 20_000, requests=3) == pytest.approx(
        1.5 * lin.cost.prefill_time(300, 20_000, requests=3))
    assert (s.kv_capacity, s.max_running, s.label) == (lin.kv_capacity, lin.max_running, lin.label)
    tab = EngineSpec(cost=TabulatedCost(table_b=(1, 8, 64), table_f=(1e-3, 2e-3, 9e-3),
                                        table_g=(1e-8, 2e-8, 3e-8), p0=1e-3, p1=1e-5))
    for b in (1, 5, 40, 64):
        assert slowed(tab, 0.5).cost.decode_time(b, 777) == pytest.approx(0.5 * tab.cost.decode_time(b, 777))
    assert slowed(lin, 1.0) is lin
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="positive"):
            slowed(lin, bad)


def test_one_positive_slowdown_per_engine_or_one_line_error():
    for bad, msg in (([1.0], "1 values for 2 engines"), ([1.0, 0.0], "positive"), ([1.0, -2.0], "positive")):
        with pytest.raises(ScenarioError, match=msg):
            small_scenario(engines=2, cluster={"engine_slowdown": bad})
    assert small_scenario(engines=2).cluster.engine_slowdown is None


def test_sync_s_work_is_the_same_and_the_slow_engine_s_time_scales():
    """Round robin gives sync the same requests on each engine whatever their speed (sync waits
    for all of them): per step, every engine's busy time is its slowdown times the nominal one."""
    nominal = simulate(_scenario([1.0, 1.0, 1.0]), "sync")
    slow = simulate(_scenario([1.0, 2.5, 0.8]), "sync")
    for a, b in zip(nominal.steps, slow.steps, strict=True):
        assert a.generated_tokens == b.generated_tokens
        for f, x, y in zip((1.0, 2.5, 0.8), a.busy_by_engine_s, b.busy_by_engine_s, strict=True):
            assert y == pytest.approx(f * x, rel=1e-9)
        assert b.rollout_time_s > a.rollout_time_s


def test_april_moves_work_to_the_faster_engine():
    """APRIL stops at the first groups done: with group-hash placement (the same requests on each
    engine whatever the order) the faster engine generates a larger share of the tokens."""
    from aprilsim.metrics.trace import Trace

    def share_of_engine_0(slowdown):
        tr = Trace(scheduler="april", n_engines=2)
        simulate(_scenario(slowdown, router="group_hash"), "april", trace=tr)
        tok = [sum(r.tokens for r in tr.requests if r.engine == i) for i in (0, 1)]
        return tok[0] / sum(tok)

    assert share_of_engine_0([1.0, 1.8]) > share_of_engine_0([1.0, 1.0]) + 0.02


KV = 4_000  # small enough that every one of these schedulers retracts


@pytest.mark.parametrize("name", ["sync", "april", "async_one_step"])
def test_fast_equals_reference_on_engines_of_unequal_speed(name):
    """Both engines take the same slowed spec: step records equal, where the KV cache binds too."""
    # clip 64: SGLang's admission reserves each new request's whole max_new_tokens (clipped) and
    # a refusal holds admission until a request leaves, so with the full clip nothing retracts
    sc = _scenario([1.0, 1.7, 0.6], kv_capacity=KV, new_token_ratio=0.0,
                   min_new_token_ratio_factor=0.0, clip_max_new_tokens=64)
    fast = simulate(sc, name)
    ref = simulate(sc, name, engine_factory=ReferenceEngine)
    assert sum(s.retractions for s in fast.steps) > 0
    for a, b in zip(fast.steps, ref.steps, strict=True):
        da, db = a.to_dict(), b.to_dict()
        for k, v in da.items():
            w = db[k]
            if isinstance(v, float):
                assert math.isclose(v, w, rel_tol=1e-9, abs_tol=1e-9), (k, v, w)
            elif isinstance(v, list) and v and isinstance(v[0], float):
                assert all(math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9) for x, y in zip(v, w)), k
            else:
                assert v == w, (k, v, w)


def test_scenario_dict_round_trip_keeps_the_slowdown():
    sc = _scenario([1.0, 1.25])
    back = scenario_from_dict(sc.model_dump(exclude={"base_dir"}))
    assert back.cluster.engine_slowdown == [1.0, 1.25]
