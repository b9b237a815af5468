"""slime's rollout loop, replayed event by event, against the schedulers that model it.

`SlimeLoop` below is written after slime's own code, variable for variable (THUDM/slime
`slime/rollout/sglang_rollout.py`: `GenerateState.submit_generate_tasks`, `generate_rollout_async`,
`abort`; the data buffer's `pop_first`), not after aprilsim's schedulers. One GroupFinished is one
task out of `asyncio.wait(..., FIRST_COMPLETED)`; the GroupFinished events that arrive after the
N-th valid group and before the abort's SamplesReturned are the rest of that wake-up's `done` set.
The abort returns the pending groups in submission order (slime: in the order their tasks end).
The schedulers must train the same groups, step by step, and generate and waste the same tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import pytest
from sched_helpers import run, small_scenario

from aprilsim.policies.base import (
    AbortAll,
    Action,
    CloseBatch,
    Context,
    Discard,
    Event,
    GroupFinished,
    RolloutStarted,
    SamplesReturned,
    Submit,
)
from aprilsim.types import Group


@dataclass
class SlimeLoop:
    """slime's generate_rollout_async + abort with the zero-std filter, one event per wake-up."""

    name: ClassVar[str] = "slime_loop"
    mode: ClassVar[str] = "colocated"
    sample_events: ClassVar[bool] = False
    over_sampling_batch_size: int = 12
    dynamic_filter: bool = True  # check_reward_nonzero_std
    keep_when_insufficient: bool = False  # ..._with_fallback: DynamicFilterOutput's flag
    partial_rollout: bool = True
    buffer: list[Group] = field(default_factory=list)  # RolloutDataSource's buffer
    remaining_batch_size: int = 0
    pendings: dict[int, Group] = field(default_factory=dict)
    aborted: bool = False
    data: list[Group] = field(default_factory=list)

    def reset(self) -> None:
        self.remaining_batch_size, self.pendings, self.aborted, self.data = 0, {}, False, []

    def data_source(self, num_samples: int, ctx: Context) -> list[Group]:
        """get_samples: the buffer first (pop_first), then the dataset."""
        samples = self.buffer[:num_samples]
        del self.buffer[:num_samples]
        if len(samples) < num_samples:
            samples += ctx.new_groups(num_samples - len(samples))
        return samples

    def submit_generate_tasks(self, samples: list[Group]) -> list[Action]:
        for group in samples:
            self.pendings[group.gid] = group
        self.remaining_batch_size += len(samples)
        return [Submit(tuple(s for g in samples for s in g.unfinished))]

    def keep(self, group: Group) -> bool:
        return not self.dynamic_filter or group.reward_std() > 1e-6

    def handle(self, event: Event, ctx: Context) -> Sequence[Action]:
        if isinstance(event, RolloutStarted):
            self.reset()
            return self.wake([], ctx)
        if isinstance(event, GroupFinished) and event.group.gid in self.pendings:
            return self.wake([event.group], ctx)
        if isinstance(event, SamplesReturned):  # abort(): `while state.pendings: ...`
            left, self.pendings = list(self.pendings.values()), {}
            if self.partial_rollout:
                self.buffer.extend(left)  # data_buffer.add_samples(group)
                return []
            return [Discard(tuple(s for g in left for s in g.samples))]
        return []

    def wake(self, done: list[Group], ctx: Context) -> list[Action]:
        target_data_size = ctx.batch_size
        actions: list[Action] = []
        while True:
            for group in done:  # `for task in done:`
                del self.pendings[group.gid]
                # should_drop_dynamic_filter_output: a rejected group with the fallback flag is
                # kept while remaining_batch_size <= target_data_size
                if not self.keep(group) and not (self.keep_when_insufficient and
                                                 self.remaining_batch_size <= target_data_size):
                    self.remaining_batch_size -= 1
                    actions.append(Discard(tuple(group.samples)))
                    continue
                if len(self.data) < target_data_size:
                    self.data.append(group)
                else:  # completed in the same wake-up as the N-th: in no batch, no buffer
                    actions.append(Discard(tuple(group.samples)))
            if self.aborted:
                return actions
            if len(self.data) >= target_data_size:  # the while loop ends: abort the rest
                self.aborted = True
                return [*actions, AbortAll(), CloseBatch(tuple(self.data))]
            done = []
            while self.remaining_batch_size < target_data_size:
                samples = self.data_source(self.over_sampling_batch_size, ctx)
                actions += self.submit_generate_tasks(samples)
                done += [g for g in samples if g.finished]  # their tasks return at once
            if not done:
                return actions

    def step_stats(self) -> dict[str, float]:
        return {}


CASES = {
    "april_ds": ({"ratio": 2.0}, {"dynamic_filter": True, "partial_rollout": True}),
    "april": ({"ratio": 2.0}, {"dynamic_filter": False, "partial_rollout": True}),
    "slime_dapo": ({}, {"dynamic_filter": True, "partial_rollout": False, "osbs_ratio": 1.0}),
    "slime_dapo@1.5": ({"ratio": 1.5}, {"dynamic_filter": True, "partial_rollout": False,
                                         "osbs_ratio": 1.5}),
    # check_reward_nonzero_std_with_fallback (issue 36 item 4)
    "april_ds@fallback": ({"ratio": 2.0, "keep_when_insufficient": True},
                          {"dynamic_filter": True, "partial_rollout": True,
                           "keep_when_insufficient": True}),
    "slime_dapo@fallback1.5": ({"ratio": 1.5, "keep_when_insufficient": True},
                               {"dynamic_filter": True, "partial_rollout": False,
                                "osbs_ratio": 1.5, "keep_when_insufficient": True}),
    "slime_dapo@fallback": ({"keep_when_insufficient": True},
                            {"dynamic_filter": True, "partial_rollout": False, "osbs_ratio": 1.0,
                             "keep_when_insufficient": True}),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("seed", [0, 1])
def test_scheduler_replays_slimes_loop_group_by_group(case, seed):
    name = case.split("@")[0]
    knobs, loop = CASES[case]
    loop = dict(loop)
    sc = small_scenario(batch=6, group=4, steps=6, seed=seed, alpha=0.5, beta=0.5)
    ratio = loop.pop("osbs_ratio", knobs.get("ratio", 2.0))
    mirror = run(sc, SlimeLoop, {"over_sampling_batch_size": int(ratio * sc.batch_size), **loop})
    ours = run(sc, name, knobs)
    assert len(ours.recorder.batches) == len(mirror.recorder.batches) == sc.steps
    for k, (a, b) in enumerate(zip(ours.recorder.batches, mirror.recorder.batches)):
        assert sorted(g.gid for g in a) == sorted(g.gid for g in b), f"step {k}"
    for a, b in zip(ours.result.steps, mirror.result.steps):
        assert (a.generated_tokens, a.wasted_tokens, a.trained_tokens, a.rollout_time_s) == (
            b.generated_tokens, b.wasted_tokens, b.trained_tokens, b.rollout_time_s)
    if loop["partial_rollout"]:
        assert [g.gid for g in ours.sim.scheduler.inner.buffer] == [
            g.gid for g in mirror.sim.scheduler.inner.buffer]
    stats = [s.scheduler_stats for s in ours.result.steps]
    if loop.get("keep_when_insufficient"):  # the fallback kept groups the filter rejected
        assert sum(s.get("kept_insufficient", 0) for s in stats) > 0
        if ratio == 1.0:  # remaining never exceeds N: nothing dropped, one chunk a step
            assert sum(s["filtered_groups"] for s in stats) == 0
            assert sum(s["chunks"] for s in stats) == len(stats)
        return
    if loop["dynamic_filter"]:
        assert sum(s["filtered_groups"] for s in stats) > 0  # the filter was exercised
    if name == "slime_dapo":
        assert sum(s["chunks"] for s in stats) > len(stats)  # a filtered group started a chunk


def test_one_for_one_refill_keeps_more_in_flight_than_slime():
    sc = small_scenario(batch=6, group=4, steps=6, seed=0, alpha=0.5, beta=0.5)
    chunk = run(sc, "april_ds", {"ratio": 2.0})
    one = run(sc, "april_ds", {"ratio": 2.0, "refill": "one_for_one"})
    fresh = [sum(s.scheduler_stats["fresh_groups"] for s in r.result.steps) for r in (chunk, one)]
    assert fresh[1] > fresh[0]  # each filtered group replaced at once: more fresh groups drawn


def test_async_april_is_aprils_rollout_in_the_one_step_async_pipeline():
    sc = small_scenario(batch=6, group=4, steps=6, seed=0, alpha=0.5, beta=0.5)
    plain = run(sc, "async_one_step", {})
    ours = run(sc, "async_april", {"ratio": 2.0, "dynamic_filter": True})
    assert all(len(b) == sc.batch_size for b in ours.recorder.batches)
    assert all(g.reward_std() > 0 for b in ours.recorder.batches for g in b)  # the filter ran
    stats = [s.scheduler_stats for s in ours.result.steps]
    assert sum(s["buffered_groups"] for s in stats) > 0  # partials carried across rollouts
    assert sum(s["update_waits_for_rollout"] for s in stats) > 0  # the sync waits for it
    # step s is generated under the weights of step s-1 at the earliest: staleness >= 1 after 0
    assert all(min(k for k, v in rec.staleness.items() if v) >= 1 for rec in ours.result.steps[1:])
    a, p = ours.result.summary(), plain.result.summary()
    assert a["rollout_throughput_tok_s"] > p["rollout_throughput_tok_s"]
