"""A user's own scheduler, loaded by module path: the worked example of docs/schedulers.md.

    PYTHONPATH=examples aprilsim simulate --scheduler my_scheduler:EarlyStopScheduler
    PYTHONPATH=examples aprilsim schedulers my_scheduler:EarlyStopScheduler

Over-sample, train on the first N groups to complete, abort and throw away the rest: slime's
over-sampling without --partial-rollout. It imports only the policy interface (no simpy, no I/O),
so the same object can drive live engines.
"""

from __future__ import annotations

import math
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
class EarlyStopScheduler:
    """Over-sample, train on the first N groups to complete, discard the rest."""

    name: ClassVar[str] = "early_stop"
    mode: ClassVar[Mode] = "colocated"
    # a knob: set it in the scenario's [schedulers."my_scheduler:EarlyStopScheduler"]
    ratio: float = 1.5
    _groups: list[Group] = field(default_factory=list, repr=False)  # state: _private or a factory
    _done: list[Group] = field(default_factory=list, repr=False)

    def handle(self, event: Event, ctx: Context) -> Sequence[Action]:
        if isinstance(event, RolloutStarted):
            self._groups = ctx.new_groups(math.ceil(self.ratio * ctx.batch_size))
            self._done = []
            return [Submit(tuple(s for g in self._groups for s in g.samples))]
        if isinstance(event, GroupFinished) and len(self._done) < ctx.batch_size:
            self._done.append(event.group)
            if len(self._done) == ctx.batch_size:
                return [AbortAll(), CloseBatch(tuple(self._done))]
        if isinstance(event, SamplesReturned):  # the abort's answer: discard what is left
            done = {g.gid for g in self._done}
            rest = [s for g in self._groups if g.gid not in done for s in g.samples]
            return [Discard(tuple(rest))]
        return ()

    def step_stats(self) -> dict[str, float]:
        return {"discarded_groups": float(len(self._groups) - len(self._done))}

