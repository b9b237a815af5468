"""Parity: the live asyncio driver on simulated engines in virtual time gives `aprilsim simulate`'s
records, for every registered scheduler and option variant and the example user scheduler.

Both drivers run the same rollout core (`aprilsim.rollout`); the live one here is the real
`LiveRuntime`, its cluster, router, replay source and trainer stand-in, with the simulator's
FastEngines behind the live `Engine` protocol (`real.runner.virtual`). So any behaviour that one
driver adds or orders differently (when an abort lands, what a weight sync holds, routing, how
requests that end together are credited) shows up here as a record that differs.

Compared: every StepRecord field (floats to 1e-9, relative or absolute), the end-of-run ledger
and the run's total time. Not compared: `RunResult.peak_tokens_per_s`, which the live driver
measures from its records (the best tokens per busy engine-second of any step) where the simulator
computes it from the cost model; and, live, the runner's own overhead (`overhead_s`, wall clock).

The cases come from the registry (`sched_helpers.every_variant`: every registered scheduler, the
example user one, and every option variant each class declares), so a scheduler or variant added
tomorrow is covered without editing this file.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import event, given, settings, target
from hypothesis import strategies as st
from runner_helpers import TESTS  # noqa: F401 - puts tests/ on sys.path
from sched_helpers import USER_SCHEDULER, every_variant, variant_ids
from test_engine_equivalence import no_mined_constants

from aprilsim.conformance import (
    agentic_scenario,
    check_scheduler,
    conformance_scenario,
    small_scenario,
)
from aprilsim.engine.fast import FastEngine
from aprilsim.engine.router import ROUTERS, make_router
from aprilsim.metrics.records import RunResult, StepRecord
from aprilsim.policies.base import (
    AbortAll,
    CloseBatch,
    GroupFinished,
    RolloutStarted,
    SamplesReturned,
    SchedulerError,
    Submit,
)
from aprilsim.policies.registry import make_scheduler
from aprilsim.sim.run import simulate
from aprilsim.types import FinishReason
from real.protocol import Engine, GenerateRequest, WeightSync
from real.runner.cluster import Cluster
from real.runner.live_conformance import run_under_live
from real.runner.runtime import LiveRuntime
from real.runner.virtual import VirtualEngine, VirtualLoop, run_virtual

TOL = 1e-9
FIELDS = [f.name for f in dataclasses.fields(StepRecord)]

# the cluster variants each registered scheduler (defaults) also runs on: an abort that lands at
# once, or 400 decode steps later, a KV cache small enough to retract, the load-aware routers
# (prefix sharing on one, a retained LRU prefix cache on another, at vLLM's block grain on a
# third), a client overhead per request
CLUSTERS: dict[str, dict[str, Any]] = {
    "abort_at_once": {"abort_steps": -1},
    "slow_abort": {"abort_steps": 400},  # the trainer finishes while an abort is on its way
    # clip 64: SGLang's admission reserves a candidate's whole clipped max_new (and a refused head
    # holds admission), so with the full clip this cache never retracts
    "small_kv": {"kv_capacity": 8_000, "new_token_ratio": 0.0, "min_new_token_ratio_factor": 0.0,
                 "clip_max_new_tokens": 64},
    "least_loaded": {"router": "least_loaded"},
    "prefix_sharing": {"router": "group_affinity", "prefix_sharing": True},
    "lru_prefix_cache": {"router": "group_affinity", "prefix_cache": "lru"},
    # vLLM's whole KV blocks (16 tokens, its GPU default)
    "block_prefix_cache": {"router": "group_affinity", "prefix_cache": "lru", "prefix_cache_block": 16},
    "client_overhead": {"client_overhead_s": 0.05},  # requests reach their engine 50 ms later
    "unequal_speed": {"engine_slowdown": [1.0, 1.6]},  # engine 1's steps take 1.6x as long
}


def _close(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(a, b, rel_tol=TOL, abs_tol=TOL)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    return a == b


def differences(sim: RunResult, live: RunResult) -> list[str]:
    """Every field where the two runs differ (empty: parity)."""
    out = []
    if len(sim.steps) != len(live.steps):
        out.append(f"{len(sim.steps)} simulated steps, {len(live.steps)} live")
    for a, b in zip(sim.steps, live.steps):
        out += [f"step {a.step} {f}: sim {getattr(a, f)!r}, live {getattr(b, f)!r}"
                for f in FIELDS if not _close(getattr(a, f), getattr(b, f))]
        ea, eb = getattr(a, "agent", None), getattr(b, "agent", None)  # agentic runs' figures
        if (ea is None) != (eb is None) or (ea is not None and not _close(
                dataclasses.asdict(ea), dataclasses.asdict(eb))):
            out.append(f"step {a.step} agent: sim {ea!r}, live {eb!r}")
    if sim.end_state != live.end_state:
        out.append(f"end state: sim {sim.end_state}, live {live.end_state}")
    if not _close(sim.total_time_s, live.total_time_s):
        out.append(f"total time: sim {sim.total_time_s}, live {live.total_time_s}")
    return out


def _assert_parity(scenario, name: str, settings: dict[str, Any]) -> RunResult:
    sim = simulate(scenario, name, settings=settings)
    live = run_virtual(scenario, name, settings=settings)
    assert isinstance(live.runtime, LiveRuntime) and live.runtime.requests > 0
    diff = differences(sim, live.result)
    assert not diff, "\n".join(diff[:10])
    return sim


CASES = every_variant()


@pytest.mark.parametrize("case", CASES, ids=variant_ids(CASES))
def test_every_scheduler_and_variant_gives_the_simulated_records(case):
    name, settings = case
    sim = _assert_parity(conformance_scenario(), name, settings)
    assert sum(s.trained_samples for s in sim.steps) > 0


REGISTERED = [(name, {}) for name, settings in CASES if not settings]  # each one's defaults


@pytest.mark.parametrize("cluster", sorted(CLUSTERS))
@pytest.mark.parametrize("case", REGISTERED, ids=variant_ids(REGISTERED))
def test_every_scheduler_on_other_clusters_and_rewards(case, cluster):
    name, settings = case
    rewards = (0.3, 0.3) if cluster == "abort_at_once" else (1.0, 1.0)  # U-shaped pass rates once
    _assert_parity(conformance_scenario(rewards=rewards, **CLUSTERS[cluster]), name, settings)


# agentic episodes (turns, tool timers, aborts mid-tool, the per-turn barrier) on the clusters
# where the drivers' orders could differ: an abort on its way while tools return, an
# interrupting sync's abort landing late, retractions, requests reaching engines late
AGENTIC_CLUSTERS = {"default": {}, "slow_abort": {"abort_steps": 400},
                    "small_kv": CLUSTERS["small_kv"],
                    "client_overhead": CLUSTERS["client_overhead"]}


@pytest.mark.parametrize("case", CASES, ids=variant_ids(CASES))
def test_every_scheduler_and_variant_runs_episodes_as_simulated(case):
    name, settings = case
    sim = _assert_parity(agentic_scenario(), name, settings)
    assert sum(s.agent.tool_calls for s in sim.steps) > 0


@pytest.mark.parametrize("cluster", sorted(AGENTIC_CLUSTERS))
@pytest.mark.parametrize("name", ["sync", "sync_turns", "april", "fully_async", "env_async"])
def test_the_agentic_schedulers_on_other_clusters(name, cluster):
    _assert_parity(agentic_scenario(**AGENTIC_CLUSTERS[cluster]), name, {})


def test_the_variants_reach_what_they_are_for():
    """The cluster variants exercise what they name (else parity there proves nothing)."""
    small = simulate(conformance_scenario(**CLUSTERS["small_kv"]), "april")
    assert sum(s.retractions for s in small.steps) > 0
    plain = conformance_scenario()
    assert plain.engine_spec().abort_steps == 1  # AbortAll lands a decode step later
    assert conformance_scenario(**CLUSTERS["abort_at_once"]).engine_spec().aborts_at_once
    assert make_scheduler("fully_async").interrupt  # its default: an interrupting weight sync
    assert sum(s.offpolicy_tokens for s in simulate(plain, "fully_async").steps) > 0


def test_differences_finds_a_difference():
    """The comparison can fail: another seed, or one record field changed, is reported."""
    sc = conformance_scenario()
    a = simulate(sc, "sync")
    b = run_virtual(sc, "sync", seed=sc.seed + 1).result
    assert any("generated_tokens" in d for d in differences(a, b))
    c = run_virtual(sc, "sync").result
    assert differences(a, c) == []
    c.steps[2].kv_peak_tokens += 1
    c.steps[1].rollout_time_s *= 1 + 1e-6
    assert [d.split(":")[0] for d in differences(a, c)] == [
        "step 1 rollout_time_s", "step 2 kv_peak_tokens"]


def test_virtual_time_costs_no_wall_time():
    sc = conformance_scenario()
    t0 = time.monotonic()
    live = run_virtual(sc, "april").result
    assert live.total_time_s > 10 * (time.monotonic() - t0)


def test_check_scheduler_runs_a_user_scheduler_on_the_live_driver():
    passed = check_scheduler(USER_SCHEDULER, run=run_under_live)
    assert "another_seed" in passed and "determinism[plain]" in passed


# --------------------------------------------------------------------------- any small scenario
PROPERTY_EXAMPLES = 24
REACHED: dict[str, int] = {}
MIN_REACH = {"several engines": 0.3, "aborted and resumed": 0.1,
             "abort landing after the step in flight": 0.05, "retracted": 0.1, "disaggregated": 0.05,
             "interrupting weight sync": 0.04, "prefix sharing": 0.2}


@st.composite
def _scenarios(draw):
    name = draw(st.sampled_from([n for n, _ in REGISTERED]))
    small_kv = draw(st.booleans())
    cluster: dict[str, Any] = {
        "abort_steps": draw(st.sampled_from([-1, 0, 1, 30])),
        "router": draw(st.sampled_from(sorted(ROUTERS))),
        "prefix_sharing": draw(st.booleans()),
        **({"kv_capacity": 5_000, "new_token_ratio": 0.0, "min_new_token_ratio_factor": 0.0}
           if small_kv else {}),
    }
    sc = small_scenario(seed=draw(st.integers(0, 10_000)), steps=draw(st.integers(2, 4)), warmup=0,
                        batch=draw(st.integers(2, 6)), group=draw(st.integers(2, 4)),
                        engines=draw(st.integers(1, 3)), cluster=cluster,
                        rewards=draw(st.sampled_from([(1.0, 1.0), (0.3, 0.3)])))
    return name, sc


@settings(max_examples=PROPERTY_EXAMPLES, deadline=None, derandomize=True)  # reach is asserted
@given(_scenarios())
def _parity_on_any_small_scenario(case) -> None:
    name, sc = case
    try:
        sim = simulate(sc, name)
    except SchedulerError:  # e.g. a filter no group of this tiny batch passes: nothing to compare
        event("no trained sample")
        return
    live = run_virtual(sc, name).result
    diff = differences(sim, live)
    assert not diff, "\n".join(diff[:10])
    spec, policy = sc.engine_spec(), make_scheduler(name, sc.settings_for(name))
    reached = {
        "several engines": sc.cluster.engines > 1,
        "aborted and resumed": sum(s.resumed_tokens for s in sim.steps) > 0,
        "abort landing after the step in flight": not spec.aborts_at_once
                                                  and sum(s.resumed_tokens for s in sim.steps) > 0,
        "retracted": sum(s.retractions for s in sim.steps) > 0,
        "disaggregated": policy.mode == "disaggregated",
        "interrupting weight sync": bool(getattr(policy, "interrupt", False)),
        "prefix sharing": spec.prefix_sharing,
    }
    REACHED["examples"] = REACHED.get("examples", 0) + 1
    for what, hit in reached.items():
        if hit:
            event(what)
            REACHED[what] = REACHED.get(what, 0) + 1
    target(float(sum(s.generated_tokens for s in sim.steps)), label="generated tokens")


def test_parity_on_any_small_scenario_and_it_reaches_its_cases():
    REACHED.clear()
    with no_mined_constants():
        _parity_on_any_small_scenario()
    n = REACHED["examples"]
    assert n >= PROPERTY_EXAMPLES // 2, REACHED
    shares = {k: REACHED.get(k, 0) / n for k in MIN_REACH}
    print("parity examples reached:", {k: round(v, 2) for k, v in sorted(shares.items())})
    for what, least in MIN_REACH.items():
        assert shares[what] >= least, (what, shares)


# --------------------------------------------------------------------------- the pieces
def _virtual_engines(n: int, **cluster: Any) -> tuple[VirtualLoop, list[VirtualEngine]]:
    spec = conformance_scenario(**cluster).engine_spec()
    loop = VirtualLoop()
    return loop, [VirtualEngine(FastEngine(spec, i), loop, 0.5, f"sim-{i}") for i in range(n)]


def test_a_virtual_engine_is_a_live_engine_on_virtual_time():
    loop, (ve,) = _virtual_engines(1)
    try:
        assert isinstance(ve, Engine) and isinstance(ve, WeightSync)
        req = GenerateRequest(prompt_ids=(5,) * 100, max_new_tokens=50, replay_len=20)
        res = loop.run_until_complete(ve.generate(req))
        assert res.generated == 20 and res.finish_reason is FinishReason.STOP
        assert res.timings.finished == loop.time() > 0  # the engine's finish time, not the wall's
        capped = loop.run_until_complete(ve.generate(replace(req, max_new_tokens=20, replay_len=30)))
        assert capped.finish_reason is FinishReason.LENGTH
    finally:
        loop.close()


def test_the_live_router_sees_a_batch_s_earlier_picks():
    """As the simulator's `send` counts each request it routes: a least-loaded router spreads a
    batch that is picked before any of its requests has started."""
    loop, engines = _virtual_engines(3)
    try:
        cluster = Cluster(engines, progress_deadline_s=None)
        cluster.router = make_router("least_loaded")
        assert [cluster.pick().index for _ in range(5)] == [0, 1, 2, 0, 1]
        assert [s.picked for s in cluster.slots] == [2, 2, 1]
        cluster.slots[0].started()  # the request reached its engine: outstanding, no longer picked
        assert (cluster.slots[0].picked, cluster.slots[0].outstanding) == (1, 1)
    finally:
        loop.close()


@dataclasses.dataclass
class AbortTwice:
    """A probe of the abort's edges: every rollout submits its batch and aborts it twice in the
    same list (the second finds the first on its way, and lands after it); when the first lands
    it resubmits what came back and one more group (they wait for the second), aborts them when
    the second lands (empty), resubmits them again, then trains the first N groups."""

    name = "abort_twice"
    mode = "colocated"

    def __post_init__(self) -> None:
        self.done: list = []
        self.returns = 0

    def handle(self, ev, ctx):
        if isinstance(ev, RolloutStarted):
            self.done, self.returns = [], 0
            groups = ctx.new_groups(ctx.batch_size)
            return [Submit(tuple(s for g in groups for s in g.samples)), AbortAll(), AbortAll()]
        if isinstance(ev, SamplesReturned):
            self.returns += 1
            if self.returns == 1:
                assert ev.samples, "the first abort lands first"
                return [Submit(ev.samples), Submit(tuple(ctx.new_groups(1)[0].samples))]
            if self.returns == 2:
                assert not ev.samples, "the second abort found nothing of its own"
                return [AbortAll()]
            return [Submit(ev.samples)] if ev.samples else []
        if isinstance(ev, GroupFinished) and len(self.done) < ctx.batch_size:
            self.done.append(ev.group)
            if len(self.done) == ctx.batch_size:
                return [CloseBatch(tuple(self.done))]
        return []

    def step_stats(self) -> dict[str, float]:
        return {"returns": float(self.returns)}


@pytest.mark.parametrize("abort_steps", [-1, 30])
def test_aborts_on_top_of_aborts_and_sends_behind_them(abort_steps):
    sc = conformance_scenario(abort_steps=abort_steps)
    sim = simulate(sc, AbortTwice())
    live = run_virtual(sc, AbortTwice()).result
    assert not differences(sim, live), "\n".join(differences(sim, live)[:10])
    assert all(s.scheduler_stats["returns"] >= 3 for s in sim.steps)
    assert sim.end_state["samples_trained"] > 0
    if abort_steps > 0:  # what the aborts brought back had tokens (at once, it had none yet)
        assert sum(s.resumed_tokens for s in sim.steps) > 0
