"""Each scheduler's mechanics, and the runtime's errors for schedulers that misbehave."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest
from sched_helpers import USER_SCHEDULER, run, small_scenario

from aprilsim.config import ScenarioError
from aprilsim.policies.base import (
    CloseBatch,
    GroupFinished,
    RolloutStarted,
    SchedulerError,
    Submit,
    UpdateWeights,
)
from aprilsim.policies.registry import make_scheduler
from aprilsim.sim.runtime import SchedulerError as RuntimeSchedulerError


def test_scheduler_error_is_one_class():
    assert RuntimeSchedulerError is SchedulerError


@pytest.mark.parametrize(
    "name, knobs",
    [
        ("april", {"ratio": 0.5}),
        ("april", {"resume_order": "lifo"}),
        ("april", {"stale_action": "keep"}),
        ("april", {"token_budget": 0}),
        ("dynamic_sampling", {"on_cap": "retry"}),
        ("dynamic_sampling", {"max_rounds": 0}),
        ("fully_async", {"eta": -1}),
        ("tail_batching", {"prompt_ratio": 0.9}),
        ("async_one_step", {"eta": 1}),  # no such knob
    ],
)
def test_bad_knobs_are_scenario_errors(name, knobs):
    with pytest.raises(ScenarioError, match=f"schedulers.{name}"):
        small_scenario(schedulers={name: knobs})


def test_dynamic_sampling_round_cap_error_or_train():
    # pass rates ~ Beta(0.02, 0.02): nearly every group is all-correct or all-wrong
    sc = small_scenario(alpha=0.02, beta=0.02, steps=2)
    with pytest.raises(SchedulerError, match="max_rounds=1"):
        run(sc, "dynamic_sampling", {"max_rounds": 1})
    r = run(sc, "dynamic_sampling", {"max_rounds": 1, "on_cap": "train"})
    for rec, batch in zip(r.result.steps, r.recorder.batches):
        assert rec.scheduler_stats["rounds"] == 1 and rec.scheduler_stats["short_batch"] == 1.0
        assert len(batch) < sc.batch_size and all(g.reward_std() > 0 for g in batch)
        assert rec.wasted_tokens > 0


def test_dynamic_sampling_keeps_n_and_drops_surplus():
    sc = small_scenario(alpha=0.5, beta=0.5, steps=3)
    r = run(sc, "dynamic_sampling", {"gen_batch_size": 10})
    for rec in r.result.steps:
        s = rec.scheduler_stats
        assert s["valid_groups"] == sc.batch_size + s["surplus_groups"]
        assert s["filtered_groups"] + s["valid_groups"] == 10 * s["rounds"]
        assert rec.discarded_samples == sc.group_size * (s["filtered_groups"] + s["surplus_groups"])


def test_async_one_step_overlaps_training():
    sc = small_scenario(steps=6)
    sync, one = run(sc, "sync").result, run(sc, "async_one_step").result
    assert one.total_time_s < sync.total_time_s  # generation hides the trainer's time
    # every weight sync comes after the rollout in flight finished: version = step - 1 in steps >= 1
    for rec in one.steps[1:]:
        assert rec.staleness and set(rec.staleness) == {1}


def test_fully_async_pauses_at_the_staleness_bound():
    # a slow trainer: generation runs ahead and must pause at eta versions
    sc = small_scenario(steps=6)
    sc = sc.model_copy(update={"trainer": sc.trainer.model_copy(update={"base_s": 30.0})})
    r = run(sc, "fully_async", {"eta": 1})
    pauses = sum(rec.scheduler_stats["staleness_pauses"] for rec in r.result.steps)
    assert pauses >= 1
    assert max(k for rec in r.result.steps for k in rec.staleness) <= 1
    loose = run(sc, "fully_async", {"eta": 3}).result
    assert max(k for rec in loose.steps for k in rec.staleness) > 1


def test_fully_async_interrupt_resubmits_under_new_weights():
    sc = small_scenario(steps=5)
    r = run(sc, "fully_async", {"interrupt": True})
    assert sum(rec.scheduler_stats["interrupted_samples"] for rec in r.result.steps) > 0
    multi = [s for b in r.recorder.batches for g in b for s in g.samples if len(s.segments) > 1]
    assert multi and all(
        s.segments[i].version < s.segments[i + 1].version
        for s in multi
        for i in range(len(s.segments) - 1)
    )
    cont = run(sc, "fully_async", {"interrupt": False})
    assert all(len(s.segments) == 1 for b in cont.recorder.batches for g in b for s in g.samples)


def test_tail_batching_keeps_first_to_finish_and_runs_long_rounds():
    sc = small_scenario(steps=8)
    r = run(sc, "tail_batching", {"prompt_ratio": 1.5, "long_round_size": 3})
    kinds = [rec.scheduler_stats["long_round"] for rec in r.result.steps]
    assert 0.0 in kinds and 1.0 in kinds
    short = [b for b, k in zip(r.recorder.batches, kinds) if not k]
    # short rounds train the first group_size of group_size + 2 responses: shorter than the rest
    for batch in short:
        for g in batch:
            orig = r.sim.groups[g.gid]
            assert orig.size == sc.group_size + 2
            kept = {s.uid for s in g.samples}
            others = [s for s in orig.samples if s.uid not in kept]
            assert max(s._target_len for s in g.samples) <= max(s._target_len for s in others)
    assert r.result.summary()["length_bias"] < run(sc, "sync").result.summary()["length_bias"]


def test_april_token_budget_parks_and_resumes():
    sc = small_scenario(steps=5)
    r = run(sc, "april", {"token_budget": 500})
    assert sum(rec.scheduler_stats["capped_samples"] for rec in r.result.steps) > 0
    long = [s for b in r.recorder.batches for g in b for s in g.samples if s._target_len > 500]
    assert long and all(len(s.segments) >= -(-s._target_len // 500) for s in long)


def test_april_staleness_cap_forces_old_partials():
    sc = small_scenario(steps=6)
    free = run(sc, "april").result
    capped = run(sc, "april", {"max_staleness": 1}).result
    assert max(k for rec in free.steps for k in rec.staleness) > 1
    assert max(k for rec in capped.steps for k in rec.staleness) == 1
    assert sum(rec.scheduler_stats["forced_groups"] for rec in capped.steps) > 0


def test_resume_orders_differ():
    sc = small_scenario(steps=5, batch=4)
    hist = {
        o: run(sc, "april", {"resume_order": o}).result.summary()["staleness_histogram"]
        for o in ("fifo", "most_progress", "oldest_version")
    }
    assert len({str(h) for h in hist.values()}) > 1


# ---------------------------------------------------------------- misbehaving schedulers
@dataclass
class _NeverCloses:
    name: ClassVar[str] = "never_closes"
    mode: ClassVar[str] = "colocated"

    def handle(self, event, ctx):
        if isinstance(event, RolloutStarted):
            return [Submit(tuple(s for g in ctx.new_groups(1) for s in g.samples))]
        return ()

    def step_stats(self):
        return {}


@dataclass
class _UpdatesWhenColocated(_NeverCloses):
    name: ClassVar[str] = "bad_update"

    def handle(self, event, ctx):
        return [UpdateWeights()] if isinstance(event, GroupFinished) else super().handle(event, ctx)


@dataclass
class _NeverUpdates:
    name: ClassVar[str] = "never_updates"
    mode: ClassVar[str] = "disaggregated"
    _done: list = None  # type: ignore[assignment]

    def handle(self, event, ctx):
        if isinstance(event, RolloutStarted):
            self._done = []
            return [Submit(tuple(s for g in ctx.new_groups(ctx.batch_size) for s in g.samples))]
        if isinstance(event, GroupFinished):
            self._done.append(event.group)
            if len(self._done) == ctx.batch_size:
                return [CloseBatch(tuple(self._done))]
        return ()

    def step_stats(self):
        return {}


@pytest.mark.parametrize(
    "sched, match",
    [
        (_NeverCloses(), "stalled"),
        (_UpdatesWhenColocated(), "colocated"),
        (_NeverUpdates(), "stalled"),
    ],
)
def test_misbehaving_scheduler_raises_scheduler_error(sched, match):
    from aprilsim.sim.build import build_simulation

    sim = build_simulation(small_scenario(steps=2), sched)
    with pytest.raises(SchedulerError, match=match):
        sim.run()


def test_make_scheduler_rejects_unknown_knob():
    with pytest.raises(ValueError, match="unknown knob"):
        make_scheduler("tail_batching", {"speed": 2})


def test_registry_variants_are_every_scheduler_then_its_own_settings():
    """`registry.variants()`: each registered name (sorted), then the extra ones, with `{}` first
    and then the settings its class declares; each variant sets knobs of its own scheduler, at
    least one of them away from its default, and no case repeats."""
    from aprilsim.policies.registry import REGISTRY, knobs, resolve, variants

    cases = variants(USER_SCHEDULER)
    order = [*sorted(REGISTRY), USER_SCHEDULER]
    assert [n for n, s in cases if not s] == order
    assert [n for n, _ in cases] == sorted((n for n, _ in cases), key=order.index)  # grouped
    assert len({(n, tuple(sorted(s.items()))) for n, s in cases}) == len(cases)
    for name, settings in cases:
        defaults = {k.name: k.default for k in knobs(resolve(name))}
        assert settings.keys() <= defaults.keys()
        assert not settings or any(settings[k] != defaults[k] for k in settings), (name, settings)
        make_scheduler(name, settings)  # and of the declared types
    assert sum(bool(s) for _, s in cases) >= len(REGISTRY)  # most schedulers have knobs to vary


def test_registry_variants_are_not_inherited_and_must_name_knobs():
    from aprilsim.policies.april import AprilScheduler
    from aprilsim.policies.registry import declared_variants

    @dataclass
    class Child(AprilScheduler):
        name: ClassVar[str] = "child"

    @dataclass
    class Typo(AprilScheduler):
        name: ClassVar[str] = "typo"
        variants: ClassVar[tuple[dict[str, object], ...]] = ({"ratoi": 3.0},)

    assert AprilScheduler.variants and declared_variants(Child) == ()
    with pytest.raises(TypeError, match="ratoi"):
        declared_variants(Typo)


def test_samples_of_and_unfinished_of_keep_group_order_and_status():
    """The schedulers' Submit/Discard builders: every sample (or every unfinished one: not DONE
    nor TRAINED) of the groups, group by group, as the generators they replace gave them."""
    from aprilsim.types import Group, Sample, SampleStatus, samples_of, unfinished_of

    groups = [Group(g, 10, [Sample(4 * g + i, g, i, 10, 5, 100, 1.0) for i in range(4)], 0, 0.5)
              for g in range(3)]
    statuses = [SampleStatus.DONE, SampleStatus.PARTIAL, SampleStatus.TRAINED,
                SampleStatus.RUNNING, SampleStatus.PENDING, SampleStatus.DISCARDED]
    for k, s in enumerate(s for g in groups for s in g.samples):
        s.status = statuses[k % len(statuses)]
    assert samples_of(groups) == tuple(s for g in groups for s in g.samples)
    assert samples_of(iter(groups[1:])) == (*groups[1].samples, *groups[2].samples)
    want = tuple(s for g in groups for s in g.unfinished)
    assert unfinished_of(groups) == want
    assert [s.uid for s in want] == [1, 3, 4, 5, 7, 9, 10, 11]
    assert samples_of([]) == () == unfinished_of([])
