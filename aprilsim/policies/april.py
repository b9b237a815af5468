"""`april`: active partial rollouts (arXiv 2509.18521; slime's --partial-rollout).

Keep ceil(ratio * N) groups in flight; as soon as N groups are complete, abort the rest, keep the
unfinished groups (finished samples keep their output) in a buffer and resume them first (FIFO) in
the next step, their max_new_tokens reduced by what they already generated. Groups that complete
between the N-th one and the abort go to the buffer too (complete: they need no more work). With
`recycle=False` everything left at the abort is discarded (slime without --partial-rollout).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from aprilsim.policies.base import (
    AbortAll,
    Action,
    CloseBatch,
    Context,
    Discard,
    Event,
    GroupFinished,
    Mode,
    RolloutStarted,
    SamplesReturned,
    Submit,
)
from aprilsim.types import Group


@dataclass
class AprilScheduler:
    """Over-provision, stop at N complete groups, recycle the partial ones."""

    name: ClassVar[str] = "april"
    ratio: float = 2.0
    recycle: bool = True
    mode: ClassVar[Mode] = "colocated"
    buffer: deque[Group] = field(default_factory=deque, repr=False)
    _active: dict[int, Group] = field(default_factory=dict, repr=False)
    _done: list[Group] = field(default_factory=list, repr=False)
    _closed: bool = field(default=False, repr=False)
    _stats: dict[str, float] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.ratio < 1.0:
            raise ValueError(f"april: over-provision ratio must be >= 1, got {self.ratio}")

    def handle(self, event: Event, ctx: Context) -> Sequence[Action]:
        if isinstance(event, RolloutStarted):
            return self._start(ctx)
        if isinstance(event, GroupFinished):
            return self._group_finished(event.group, ctx)
        if isinstance(event, SamplesReturned):
            return self._returned()
        return ()

    def _start(self, ctx: Context) -> Sequence[Action]:
        self._done, self._closed, self._active = [], False, {}
        target = math.ceil(self.ratio * ctx.batch_size)
        groups: list[Group] = []
        while self.buffer and len(groups) < target:
            groups.append(self.buffer.popleft())
        self._stats = {"resumed_groups": float(len(groups))}
        groups += ctx.new_groups(target - len(groups))
        self._active = {g.gid: g for g in groups}
        actions: list[Action] = [Submit(tuple(s for g in groups for s in g.unfinished))]
        for g in groups:
            if g.finished:  # completed last step after the batch closed: counts right away
                actions += self._group_finished(g, ctx)
        return actions

    def _group_finished(self, group: Group, ctx: Context) -> Sequence[Action]:
        if self._closed:
            return ()  # finished after the N-th group: stays active, handled at the abort
        del self._active[group.gid]
        self._done.append(group)
        if len(self._done) < ctx.batch_size:
            return ()
        self._closed = True
        return [AbortAll(), CloseBatch(tuple(self._done))]

    def _returned(self) -> Sequence[Action]:
        """After the abort: everything still active is partial (or complete but surplus)."""
        left = list(self._active.values())
        self._active = {}
        if self.recycle:
            self.buffer.extend(left)
            return ()
        return [Discard(tuple(s for g in left for s in g.samples))]

    def step_stats(self) -> dict[str, float]:
        out = dict(self._stats)
        out["buffered_groups"] = float(len(self.buffer))
        return out
