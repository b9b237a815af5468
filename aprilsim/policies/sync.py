"""`sync`: the synchronous baseline. Submit N groups, wait for all of them, train.

`dispatch` says where its requests go: `"router"` (the scenario's router: round robin by default,
which spreads a group's samples over the engines, as sglang-router does in slime) or `"group"`,
veRL's dispatch: each group whole on one engine, groups balanced over the engines (verl's
`ray_trainer.py` repeats each prompt n times contiguously, `gen_batch.repeat(rollout.n,
interleave=True)`, and its DP dispatch hands each rollout worker a contiguous chunk). The Seer paper
(arXiv 2511.14617) measured its gains against veRL.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from aprilsim.policies.base import (
    BY_GROUP,
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

DISPATCH = ("router", "group")


@dataclass
class SyncScheduler:
    """Every step waits for its longest response: the long-tail bubble APRIL attacks."""

    name: ClassVar[str] = "sync"
    mode: ClassVar[Mode] = "colocated"
    sample_events: ClassVar[bool] = False  # only group completions matter
    variants: ClassVar[tuple[dict[str, object], ...]] = ({"dispatch": "group"},)
    dispatch: str = "router"  # "router": the scenario's; "group": veRL's, a group per engine
    _done: list[Group] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if self.dispatch not in DISPATCH:
            raise ValueError(f"{self.name}: dispatch must be one of {DISPATCH}, not "
                             f"{self.dispatch!r}")

    def handle(self, event: Event, ctx: Context) -> Sequence[Action]:
        """Submit N groups at the rollout's start; close the batch when all are complete."""
        if isinstance(event, RolloutStarted):
            self._done = []
            groups = ctx.new_groups(ctx.batch_size)
            if self.dispatch == "group":
                return [Submit(samples_of(groups), route=BY_GROUP)]
            return [Submit(samples_of(groups))]
        if isinstance(event, GroupFinished):
            self._done.append(event.group)
            if len(self._done) == ctx.batch_size:
                return [CloseBatch(tuple(self._done))]
        return ()

    def step_stats(self) -> dict[str, float]:
        """None: sync has no figures of its own."""
        return {}
