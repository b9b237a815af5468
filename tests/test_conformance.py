"""The conformance suite: every registered scheduler (and a user's own) against DESIGN.md's
invariants.

Like scikit-learn's check_estimator: one set of checks, run over every scheduler and a few of
their settings, on two small scenarios (ordinary rewards, and U-shaped pass rates where most
groups have all-equal rewards). Then each scheduler's own promise is checked.
"""

from __future__ import annotations

import functools

import pytest
from sched_helpers import (
    USER_SCHEDULER,
    every_variant,
    run,
    small_scenario,
    variant_ids,
)

from aprilsim.conformance import (
    ConformanceError,
    check_batches,
    check_ledger,
    check_max_length,
    check_scheduler,
)
from aprilsim.policies.base import AbortAll, CloseBatch, SampleFinished, SchedulerError
from aprilsim.policies.registry import REGISTRY

# (scheduler, knob settings): every registered scheduler with its defaults, plus the options
CASES = every_variant()
IDS = variant_ids(CASES)
REWARDS = {"plain": (1.0, 1.0), "u_shaped": (0.3, 0.3)}


@functools.cache
def _scenario(rewards: str):
    a, b = REWARDS[rewards]
    return small_scenario(alpha=a, beta=b)


@functools.cache
def _run(case: int, rewards: str):
    name, settings = CASES[case]
    return run(_scenario(rewards), name, settings)


@pytest.fixture(params=range(len(CASES)), ids=IDS)
def case(request):
    return request.param


@pytest.fixture(params=sorted(REWARDS))
def rewards(request):
    return request.param


# --------------------------------------------------------------------------- shared invariants
# The public checks (aprilsim.conformance), run here on every case, with the scheduler's own
# sample_events opt-out (the production path) and with SampleFinished events forced on.
@pytest.mark.parametrize("events", ["own", "forced"])
def test_shared_invariants(case, rewards, events):
    name, settings = CASES[case]
    r = _run(case, rewards) if events == "own" else run(
        _scenario(rewards), name, settings, force_sample_events=True)
    assert r.recorder.sample_events == (events == "forced"
                                        or getattr(r.recorder.inner, "sample_events", True))
    check_ledger(r, rewards)
    check_batches(r, rewards)
    check_max_length(r, rewards)


def test_check_scheduler_passes_every_case(case):
    name, settings = CASES[case]
    passed = check_scheduler(name, settings)
    assert "another_seed" in passed and any(p.startswith("determinism") for p in passed)


def test_check_scheduler_catches_a_broken_scheduler():
    """The checks can fail: a scheduler that trains a group twice, or lies about sample events."""
    from aprilsim.policies.sync import SyncScheduler

    class TrainsTwice(SyncScheduler):
        def handle(self, event, ctx):
            acts = list(super().handle(event, ctx))
            out = []
            for a in acts:
                if isinstance(a, CloseBatch) and len(a.groups) > 1:
                    a = CloseBatch((a.groups[0], *a.groups[:-1]))
                out.append(a)
            return out

    with pytest.raises((ConformanceError, SchedulerError)):
        check_scheduler(TrainsTwice)

    class LiesAboutEvents(SyncScheduler):
        sample_events = False
        seen = 0

        def handle(self, event, ctx):
            if isinstance(event, SampleFinished):
                self.seen += 1
                if self.seen % 7 == 0:
                    return [AbortAll()]
            return super().handle(event, ctx)

    with pytest.raises(ConformanceError, match="opt-out"):
        check_scheduler(LiesAboutEvents)


# --------------------------------------------------------------------------- own promises
def _max_staleness(r) -> int:
    return max((k for s in r.result.steps for k, v in s.staleness.items() if v), default=0)


@pytest.mark.parametrize("rewards", sorted(REWARDS))
def test_promises(case, rewards):
    name, settings = CASES[case]
    r = _run(case, rewards)
    summary = r.result.summary()
    if name in ("sync", "dynamic_sampling", "tail_batching", USER_SCHEDULER):
        assert _max_staleness(r) == 0, "synchronous schedulers train on-policy only"
    if name == "async_one_step":
        assert set(r.result.steps[0].staleness) == {0}
        for s in r.result.steps[1:]:
            assert set(s.staleness) == {1}, "one-step off-policy: exactly one version old"
    if name == "fully_async":
        eta = settings.get("eta", 4)
        assert _max_staleness(r) <= eta
    if name in ("april", "april_ds"):
        if summary["mean_partial_samples"] > 0 and settings.get("recycle", True):
            assert _max_staleness(r) >= 1, "resumed partials must show up as off-policy tokens"
        if settings.get("recycle", True) and name == "april" and "max_staleness" not in settings:
            # discards: only the groups completing with the N-th, which slime drops
            dropped = sum(st.scheduler_stats["dropped_groups"] for st in r.result.steps)
            assert r.result.end_state["samples_discarded"] == dropped * r.scenario.group_size
        if "max_staleness" in settings:
            assert _max_staleness(r) <= settings["max_staleness"]
        budget = settings.get("token_budget")
        if budget is not None:
            for g in r.sim.groups.values():
                for s in g.samples:  # one segment = what one step generated (version = step)
                    assert all(seg.tokens <= budget for seg in s.segments)
            assert any(len(s.segments) > 1
                       for b in r.recorder.batches for g in b for s in g.samples)
    if name in ("dynamic_sampling", "april_ds"):
        kept = sum(s.scheduler_stats.get("kept_insufficient", 0) for s in r.result.steps)
        flat = sum(g.reward_std() <= 0 for batch in r.recorder.batches for g in batch)
        if settings.get("keep_when_insufficient"):  # slime's fallback: kept ones may be flat
            assert flat <= kept, "a trained flat group the fallback did not keep"
        else:
            assert flat == 0, "a trained group without reward variance"
        filtered = sum(s.scheduler_stats.get("filtered_groups", 0) for s in r.result.steps)
        if rewards == "u_shaped":
            assert filtered > 0 and summary["wasted_tokens"] > 0


def test_scheduler_metrics_in_step_records(case):
    name, _ = CASES[case]
    r = _run(case, "u_shaped")
    keys = {
        "april": {"resumed_groups", "buffered_groups", "capped_samples", "stale_discarded_groups"},
        "april_ds": {"filtered_groups", "buffered_groups"},
        "dynamic_sampling": {"rounds", "filtered_groups", "surplus_groups"},
        "tail_batching": {"long_round", "deferred_prompts", "deferred_queue"},
        "fully_async": {"staleness_pauses", "stale_dropped_groups", "interrupted_samples"},
        "async_one_step": {"update_waits_for_rollout"},
    }.get(name, set())
    for s in r.result.steps:
        assert keys <= set(s.scheduler_stats)
        assert all(isinstance(v, float) for v in s.scheduler_stats.values())
    if name == "dynamic_sampling":
        assert all(s.scheduler_stats["rounds"] >= 1 for s in r.result.steps)
        assert any(s.scheduler_stats["rounds"] > 1 for s in r.result.steps)


def test_every_knob_is_varied():
    """Every knob of every registered scheduler (from the registry) takes a non-default value in
    some option variant of a scheduler that has it, so a new knob cannot go untested."""
    from aprilsim.policies.registry import knobs

    varied = {(n, k) for n, s in CASES for k in s}
    names_with = {}
    for name, cls in REGISTRY.items():
        for k in knobs(cls):
            names_with.setdefault(k.name, set()).add(name)
    missing = [(name, k.name) for name, cls in sorted(REGISTRY.items()) for k in knobs(cls)
               if not any((other, k.name) in varied for other in names_with[k.name])]
    assert not missing, f"knobs no option variant sets: {missing}"
