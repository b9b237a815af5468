"""`async_one_step`: one-step off-policy training (slime's train_async.py; verl's
one-step-off-policy).

Disaggregated: the trainer has its own GPUs. While the trainer trains on step k, the engines
generate the batch of step k+1 under the weights of step k-1. Before the weights of step k are
synced, the generation in flight (the batch of step k+1) is waited for (slime: "sync generate
before update weights"), so the generation of step k+2 starts under the weights of step k. Every
batch after the first is therefore exactly one version old: staleness 1, never more.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from aprilsim.policies.base import (
    Action,
    CloseBatch,
    Context,
    Event,
    GroupFinished,
    Mode,
    RolloutStarted,
    Submit,
    TrainStepDone,
    UpdateWeights,
    WeightsUpdated,
)
from aprilsim.types import Group, samples_of


@dataclass
class AsyncOneStepScheduler:
    """Generate step k+1 while training step k; sync weights between rollouts (staleness 1)."""

    name: ClassVar[str] = "async_one_step"
    mode: ClassVar[Mode] = "disaggregated"
    sample_events: ClassVar[bool] = False  # only group completions matter
    _done: list[Group] = field(default_factory=list, repr=False)
    _step: int = field(default=-1, repr=False)  # the rollout step open, -1: none
    _deferred: bool = field(default=False, repr=False)  # open, waiting for its weights
    _update_pending: bool = field(default=False, repr=False)
    _waits: int = field(default=0, repr=False)

    def handle(self, event: Event, ctx: Context) -> Sequence[Action]:
        if isinstance(event, RolloutStarted):
            self._step, self._done = event.step, []
            if ctx.version >= event.step - 1:
                return self._submit(ctx)
            self._deferred = True  # step s is generated under version s-1: wait for its sync
            return ()
        if isinstance(event, WeightsUpdated):
            if self._deferred and ctx.version >= self._step - 1:
                return self._submit(ctx)
            return ()
        if isinstance(event, GroupFinished):
            self._done.append(event.group)
            if len(self._done) < ctx.batch_size:
                return ()
            self._step = -1
            actions: list[Action] = [CloseBatch(tuple(self._done))]
            if self._update_pending:
                self._update_pending = False
                actions.append(UpdateWeights())
            return actions
        if isinstance(event, TrainStepDone):
            if self._step >= 0 and not self._deferred:
                self._update_pending = True  # wait for the generation in flight
                self._waits += 1
                return ()
            return [UpdateWeights()]
        return ()

    def _submit(self, ctx: Context) -> list[Action]:
        self._deferred = False
        groups = ctx.new_groups(ctx.batch_size)
        return [Submit(samples_of(groups))]

    def step_stats(self) -> dict[str, float]:
        out = {"update_waits_for_rollout": float(self._waits)}
        self._waits = 0
        return out
