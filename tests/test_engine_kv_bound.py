"""Regression: FastEngine under the presets' SGLang rules when the KV cache binds (issue 17).

The default scenario (4 engines, 16k cap, clip 4,096, decaying new-token ratio) on a KV cache of
150k or 300k tokens per engine: requests far above the clip cross it while the queue waits, are
retracted and re-admitted. FastEngine once admitted requests that ReferenceEngine (and SGLang's
PrefillAdder) refuse: a retracted request left a stale entry in the clipped reserve's heap, which
later moved it to the "near" side with its old remaining length, so the reserve drifted down.
"""

from __future__ import annotations

import pytest
from sched_helpers import USER_SCHEDULER, run
from test_whole_run_equivalence import _assert_same_run

from aprilsim.config import default_scenario
from aprilsim.engine.reference import ReferenceEngine
from aprilsim.policies.registry import REGISTRY
from aprilsim.sim.run import simulate

RETRACTED: dict[str, int] = {}  # scheduler -> retractions in its users'-scale whole run


def _on_kv(kv: int):
    sc = default_scenario()
    return sc.model_copy(update={"cluster": sc.cluster.model_copy(update={"kv_capacity": kv})})


class _Run:
    """What `_assert_same_run` reads of a conformance run."""

    def __init__(self, result):
        self.result = result


@pytest.mark.parametrize(("kv", "name", "steps", "retracts"),
                         [(300_000, "april", 1, True), (150_000, "april", 2, True),
                          (150_000, "sync", 1, True), (300_000, "sync", 1, False)])
def test_kv_bound_default_scenario_agrees_per_step(kv, name, steps, retracts):
    """The issue's reproduction: fast == reference per step to 1e-9 under the presets' default
    SGLang rules, sync and APRIL (ratio 2) at 150k and 300k KV tokens per engine; the cache binds
    (retractions) except for sync at 300k, which only queues."""
    sc = _on_kv(kv)
    spec = sc.engine_spec()
    assert spec.sglang_ratio and spec.clip_max_new_tokens == 4096 and spec.new_token_ratio_decay
    settings = {"ratio": 2.0} if name == "april" else {}
    fast = simulate(sc, name, seed=0, steps=steps, settings=settings)
    ref = simulate(sc, name, seed=0, steps=steps, settings=settings,
                   engine_factory=ReferenceEngine)
    _assert_same_run(_Run(fast), _Run(ref))
    assert (sum(r.retractions for r in fast.steps) > 0) == retracts


def _small_kv_bound(kv: int = 100_000):
    """The default scenario cut to 1 engine x 4 groups x 8 samples (16k cap, the presets' SGLang
    rules), on `kv` tokens per engine: few requests, but enough to fill the cache."""
    sc = default_scenario()
    return sc.model_copy(update={
        "batch_size": 4, "group_size": 8, "steps": 3,
        "cluster": sc.cluster.model_copy(update={"engines": 1, "kv_capacity": kv})})


@pytest.mark.parametrize("name", [*sorted(REGISTRY), USER_SCHEDULER])
def test_every_scheduler_agrees_when_kv_binds_at_users_scale(name):
    """Whole runs, fast == reference, for every registered scheduler (and the example user
    scheduler) under the presets' rules on a 100k-token cache; the runs retract (asserted over
    all schedulers: those with more requests in flight do)."""
    sc = _small_kv_bound()
    fast, ref = run(sc, name, {}), run(sc, name, {}, engine_factory=ReferenceEngine)
    _assert_same_run(fast, ref)
    RETRACTED[name] = sum(r.retractions for r in fast.result.steps)


def test_the_users_scale_runs_retract():
    """Runs after the whole-run cases above: most schedulers retracted on the 100k cache."""
    missing = {*REGISTRY, USER_SCHEDULER} - set(RETRACTED)
    if missing:
        pytest.skip(f"the whole-run cases did not all run first: {sorted(missing)}")
    assert sum(v > 0 for v in RETRACTED.values()) >= len(RETRACTED) // 2, RETRACTED


def test_seers_migrated_kv_agrees_when_kv_binds_at_users_scale():
    """Seer's pieces with migrated KV (priorities, routing to the engine with most room) on the
    100k-token cache under the presets' rules: fast == reference, and both the migration and the
    retractions happen (pieces of 8,192 tokens: shorter ones hold too little KV to retract)."""
    sc = _small_kv_bound()
    settings = {"migrate_kv": True, "chunk": 8192}
    fast, ref = run(sc, "seer", settings), run(sc, "seer", settings, engine_factory=ReferenceEngine)
    _assert_same_run(fast, ref)
    assert sum(e.stats.migrated_tokens for e in fast.sim.engines) > 0
    assert sum(r.retractions for r in fast.result.steps) > 0


def _two_engines_kv_bound(seed: int, **cluster):
    """The default scenario cut to 2 engines of 100k KV tokens x 8 groups x 8 samples x 3 steps
    under the presets' rules, its prompts repeating every two steps (seer_history's epochs)."""
    sc = default_scenario()
    return sc.model_copy(update={
        "batch_size": 8, "group_size": 8, "steps": 3, "seed": seed,
        "workload": sc.workload.model_copy(update={"dataset_prompts": 16}),
        "cluster": sc.cluster.model_copy(update={"engines": 2, "kv_capacity": 100_000,
                                                 **cluster})})


SEER_KV = {"migrated KV": ({"migrate_kv": True}, {}),
           "re-prefill, retained cache": ({}, {"prefix_cache": "lru", "router": "group_affinity"})}


@pytest.mark.parametrize("kv_mode", sorted(SEER_KV))
@pytest.mark.parametrize("route", ["most_room", "router"])
@pytest.mark.parametrize("name", ["seer", "seer_history"])
def test_seer_whole_runs_agree_on_two_kv_bound_engines(name, route, kv_mode):
    """seer and seer_history with both route modes (the engine with most room, or the
    scenario's router), migrated KV or re-prefill over the retained prefix cache, on two
    100k-token engines under the presets' rules: fast == reference on two paired seeds, and
    each run retracts, resends pieces and migrates (or hits the cache); seer_history's second
    epoch is estimated from the first (no probe)."""
    knobs, cluster = SEER_KV[kv_mode]
    settings = {"chunk": 8192, "route": route, **knobs}
    for seed in (0, 1):
        sc = _two_engines_kv_bound(seed, **cluster)
        fast = run(sc, name, settings)
        ref = run(sc, name, settings, engine_factory=ReferenceEngine)
        _assert_same_run(fast, ref)
        for fe, re_ in zip(fast.sim.engines, ref.sim.engines, strict=True):
            assert fe.stats == re_.stats
        stats = [e.stats for e in fast.sim.engines]
        assert sum(r.retractions for r in fast.result.steps) > 0, seed
        assert sum(r.to_dict()["scheduler_stats"].get("pieces_resent", 0)
                   for r in fast.result.steps) > 0
        if knobs.get("migrate_kv"):
            assert sum(s.migrated_tokens for s in stats) > 0
        else:
            assert sum(s.cache_hits for s in stats) > 0
        if name == "seer_history":
            assert sum(r.to_dict()["scheduler_stats"].get("history_groups", 0)
                       for r in fast.result.steps) > 0
