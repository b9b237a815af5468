"""Whole runs on the fast engine equal whole runs on the per-iteration reference engine.

Every registered scheduler, the disaggregated ones and option variants included (token budget,
interrupting and pausing fully_async, staleness caps, dynamic sampling), on a KV cache tight enough
to retract: the engines' equivalence must survive everything a runtime asks of them. Each case also
asserts that it reached what it is there for (retractions, aborts with partial output, ...).
"""

from __future__ import annotations

import math

import pytest
from sched_helpers import every_variant, run, small_scenario, variant_ids

from aprilsim.engine.reference import ReferenceEngine
from aprilsim.policies.registry import REGISTRY

# The simpler engine rules (constant ratio 0.1, no clip, retractions at the head, aborts landing at
# once, no chunking): the KV pressure these cases need to retract under every scheduler. The
# presets' SGLang rules admit more cautiously; they have their own whole-run test below.
SIMPLE = {"new_token_ratio": 0.1, "new_token_ratio_decay_steps": 0, "clip_max_new_tokens": 0,
          "retract_to": "head", "abort_steps": -1, "chunked_prefill_size": 0}


def _base():
    """The one scenario of this module: 2 engines, 6 groups of 4, 3,072-token cap, 3 steps."""
    return small_scenario(engines=2, batch=6, group=4, max_len=3072, steps=3, seed=4, alpha=0.5,
                          beta=0.5)


def _tight(sc, **cluster):
    """The scenario on a tight KV cache (5,000 tokens) with the simpler rules and `cluster`."""
    return sc.model_copy(update={"cluster": sc.cluster.model_copy(
        update={**SIMPLE, "kv_capacity": 5000, **cluster})})


CASES = every_variant()  # every registered scheduler and option variant (the registry's)
IDS = variant_ids(CASES)


def _fingerprint(r):
    out = []
    for rec in r.result.steps:
        d = rec.to_dict()
        times = {k: d.pop(k) for k in list(d) if k.endswith("_s")}
        out.append((d, times))
    return out, r.result.end_state


def _assert_same_run(fast, ref):
    """Both runs' step records equal (times to 1e-9) and their end states equal; returns the fast
    run's fingerprint."""
    (f_steps, f_end), (r_steps, r_end) = _fingerprint(fast), _fingerprint(ref)
    assert f_end == r_end
    for (fd, ft), (rd, rt) in zip(f_steps, r_steps, strict=True):
        assert fd == rd
        for k, v in ft.items():
            w = rt[k]
            if v is None or w is None:  # a figure not measured (e.g. no queue wait): on both
                assert v is w, k
            elif isinstance(v, list):
                assert all(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9) for a, b in zip(v, w))
            else:
                assert math.isclose(v, w, rel_tol=1e-9, abs_tol=1e-9), k
    return f_steps, f_end


@pytest.mark.parametrize(("name", "settings"), CASES, ids=IDS)
def test_fast_and_reference_engines_give_the_same_run(name, settings):
    sc = _base()
    tight = _tight(sc)
    fast = run(tight, name, settings)
    ref = run(tight, name, settings, engine_factory=ReferenceEngine)
    f_steps, f_end = _assert_same_run(fast, ref)
    assert sum(r.retractions for r in fast.result.steps) > 0, "the KV cache never ran out"



@pytest.mark.parametrize("k", [0, 1])
@pytest.mark.parametrize("name", ["april", "tail_batching"])
def test_aborts_that_land_after_the_step_in_flight_agree_on_both_engines(name, k):
    """`abort_steps` (the abort lands after the step in flight and k more decode steps, as on a
    live engine): fast == reference over whole runs, the aborts found steps in flight, and the
    first rollout ends later than with aborts that land at once. (Requests finishing while an abort
    lands are reached by the engine-level property test, tests/test_engine_equivalence.py.)"""
    from aprilsim.engine.fast import FastEngine

    sc = _base()
    sc = _tight(sc, abort_steps=k)
    made_f: list = []
    fast = run(sc, name, {}, engine_factory=_recording(FastEngine, made_f))
    ref = run(sc, name, {}, engine_factory=ReferenceEngine)
    f_steps, f_end = _assert_same_run(fast, ref)
    assert sum(e.stats.abort_steps_run for e in made_f) > 0, "no abort found a step in flight"
    base = run(sc.model_copy(update={"cluster": sc.cluster.model_copy(
        update={"abort_steps": -1})}), name, {})  # -1: the abort lands at once
    # the runs are the same up to the first abort, which lands later; after it they part ways
    assert fast.result.steps[0].rollout_time_s > base.result.steps[0].rollout_time_s
    assert _fingerprint(base) != (f_steps, f_end)


def _recording(factory, made):
    def make(spec, i):
        e = factory(spec, i)
        made.append(e)
        return e
    return make


CHUNKED = [("sync", {}, {}), ("april", {}, {}), ("fully_async", {"eta": 0, "interrupt": True}, {}),
           ("async_one_step", {}, {}), ("april", {}, {"abort_steps": 1})]


@pytest.mark.parametrize(("name", "settings", "cluster"), CHUNKED,
                         ids=[n + "".join(f"-{k}={v}" for k, v in c.items())
                              for n, _, c in CHUNKED])
def test_whole_runs_agree_with_chunked_prefill(name, settings, cluster):
    """Chunked prefill (passes of 256 tokens, at most 1,000 input tokens a pass): fast ==
    reference over whole runs, requests do span several passes and passes that end one begin
    others, and it changes the run (also with aborts that land after the step in flight:
    `abort_steps`)."""
    sc = _base()
    tight = _tight(sc, max_prefill_tokens=1000, **cluster)
    chunked = _tight(sc, max_prefill_tokens=1000, **cluster, chunked_prefill_size=256)
    fast = run(chunked, name, settings)
    ref = run(chunked, name, settings, engine_factory=ReferenceEngine)
    f_steps, f_end = _assert_same_run(fast, ref)
    for fe, re_ in zip(fast.sim.engines, ref.sim.engines, strict=True):
        assert fe.stats == re_.stats
    if "abort_steps" in cluster:  # an abort found a request's chunked prefill unfinished
        assert sum(e.stats.abort_chunked for e in fast.sim.engines) > 0
    assert sum(e.stats.chunked_requests for e in fast.sim.engines) > 0
    assert sum(e.stats.chunk_tail_passes for e in fast.sim.engines) > 0
    assert _fingerprint(run(tight, name, settings)) != (f_steps, f_end)


@pytest.mark.parametrize("router", ["group_affinity", "round_robin"])
@pytest.mark.parametrize("name", ["sync", "april", "fully_async"])
def test_prefix_sharing_runs_agree_on_both_engines(name, router):
    """Prefix sharing (a group's prompt held once per engine): fast == reference over whole runs
    on the tight KV cache, prompts actually shared (hits), and for sync (the same work either way)
    fewer prefill tokens than the same run without sharing."""
    from aprilsim.engine.fast import FastEngine

    sc = _base()
    shared = _tight(sc, prefix_sharing=True, router=router)
    cl = shared.cluster
    made: list = []
    fast = run(shared, name, {}, engine_factory=_recording(FastEngine, made))
    ref = run(shared, name, {}, engine_factory=ReferenceEngine)
    f_steps, f_end = _assert_same_run(fast, ref)
    assert sum(e.stats.prefix_hits for e in made) > 0
    if name != "sync":  # other schedulers' work changes with the timing (what gets aborted)
        return
    plain: list = []
    run(sc.model_copy(update={"cluster": cl.model_copy(update={"prefix_sharing": False})}),
        name, {}, engine_factory=_recording(FastEngine, plain))
    assert sum(e.stats.prefill_tokens for e in made) < sum(e.stats.prefill_tokens for e in plain)


def test_whole_runs_agree_under_the_presets_sglang_rules():
    """The presets' SGLang rules (decaying ratio 0.7, clip 4,096, retractions at the tail, aborts
    landing one decode step late, chunked prefill 8,192): fast == reference for every registered
    scheduler on a tight KV cache, and some of them retract (SGLang reserves cautiously: at 5,000
    tokens sync, april, fully_async and dynamic_sampling do, tail_batching does not)."""
    sc = _base()
    tight = sc.model_copy(update={"cluster": sc.cluster.model_copy(update={"kv_capacity": 5000})})
    assert tight.engine_spec().sglang_ratio and tight.engine_spec().abort_steps == 1
    retracted = 0
    for name in sorted(REGISTRY):
        fast, ref = run(tight, name, {}), run(tight, name, {}, engine_factory=ReferenceEngine)
        f_steps, f_end = _assert_same_run(fast, ref)
        retracted += sum(r.retractions for r in fast.result.steps) > 0
    assert retracted >= 3, "the SGLang rules never ran out of KV"
