"""`sync`: the synchronous baseline. Submit N groups, wait for all of them, train."""

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
)
from aprilsim.types import Group, samples_of


@dataclass
class SyncScheduler:
    """Every step waits for its longest response: the long-tail bubble APRIL attacks."""

    name: ClassVar[str] = "sync"
    mode: ClassVar[Mode] = "colocated"
    sample_events: ClassVar[bool] = False  # only group completions matter
    _done: list[Group] = field(default_factory=list, repr=False)

    def handle(self, event: Event, ctx: Context) -> Sequence[Action]:
        """Submit N groups at the rollout's start; close the batch when all are complete."""
        if isinstance(event, RolloutStarted):
            self._done = []
            groups = ctx.new_groups(ctx.batch_size)
            return [Submit(samples_of(groups))]
        if isinstance(event, GroupFinished):
            self._done.append(event.group)
            if len(self._done) == ctx.batch_size:
                return [CloseBatch(tuple(self._done))]
        return ()

    def step_stats(self) -> dict[str, float]:
        """None: sync has no figures of its own."""
        return {}
