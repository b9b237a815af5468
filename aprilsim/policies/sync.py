"""`sync`: the synchronous baseline. Submit N groups, wait for all of them, train.

`dispatch` says where its requests go: `"router"` (the scenario's router: round robin by default,
which spreads a group's samples over the engines, as sglang-router does in slime) or `"group"`,
veRL's dispatch: each group whole on one engine, groups balanced over the engines (verl's
`ray_trainer.py` repeats each prompt n times contiguously, `gen_batch.repeat(rollout.n,
interleave=True)`, and its DP dispatch hands each rollout worker a contiguous chunk). The Seer paper
(arXiv 2511.14617) measured its gains against veRL.

With agentic episodes (`[workload.episodes]`) the barrier is per episode by default (an agent
loop, verl's and slime's multi-turn rollouts: each episode runs its turns and tool calls on its
own, and the step waits for the last episode). `barrier = "turn"` (registered as `sync_turns`)
is the older batch-synchronous multi-turn rollout (Search-R1's generation loop, RAGEN): every
live episode of the batch generates turn k, then all their tool calls run, and turn k + 1 starts
only when the last tool call of turn k has returned. On single-turn workloads both are the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from aprilsim.policies.base import (
    BY_GROUP,
    Action,
    CallTools,
    CloseBatch,
    Context,
    Event,
    GroupFinished,
    Mode,
    RolloutStarted,
    Submit,
    ToolReturned,
    TurnEnded,
)
from aprilsim.types import Group, Sample, samples_of

BARRIERS = ("episode", "turn")

DISPATCH = ("router", "group")


@dataclass
class SyncScheduler:
    """Every step waits for its longest response: the long-tail bubble APRIL attacks."""

    name: ClassVar[str] = "sync"
    mode: ClassVar[Mode] = "colocated"
    variants: ClassVar[tuple[dict[str, object], ...]] = ({"dispatch": "group"},
                                                          {"barrier": "turn"})
    dispatch: str = "router"  # "router": the scenario's; "group": veRL's, a group per engine
    barrier: str = "episode"  # "episode": each runs its turns on its own; "turn": in lockstep
    _done: list[Group] = field(default_factory=list, repr=False)
    _turned: list[Sample] = field(default_factory=list, repr=False)  # ended turn k: tool pending
    _tooled: list[Sample] = field(default_factory=list, repr=False)  # their tools returned

    def __post_init__(self) -> None:
        if self.dispatch not in DISPATCH:
            raise ValueError(f"{self.name}: dispatch must be one of {DISPATCH}, not "
                             f"{self.dispatch!r}")
        if self.barrier not in BARRIERS:
            raise ValueError(f"{self.name}: barrier must be one of {BARRIERS}, not "
                             f"{self.barrier!r}")

    @property
    def sample_events(self) -> bool:
        """Only group completions matter, but for the per-turn barrier: it hears every end."""
        return self.barrier == "turn"

    @property
    def turn_events(self) -> bool:
        """With the per-turn barrier the turns are the scheduler's (`TurnEnded`, `CallTools`);
        else episodes run their turns on their own."""
        return self.barrier == "turn"

    def handle(self, event: Event, ctx: Context) -> Sequence[Action]:
        """Submit N groups at the rollout's start; close the batch when all are complete."""
        if isinstance(event, RolloutStarted):
            self._done, self._turned, self._tooled = [], [], []
            return [self._submit(samples_of(ctx.new_groups(ctx.batch_size)))]
        if isinstance(event, TurnEnded):
            self._turned.append(event.sample)
        elif isinstance(event, ToolReturned):
            self._tooled.append(event.sample)
        elif isinstance(event, GroupFinished):
            self._done.append(event.group)
            if len(self._done) == ctx.batch_size:
                return [CloseBatch(tuple(self._done))]
        return self._barrier(ctx) if self.barrier == "turn" else ()

    def _barrier(self, ctx: Context) -> list[Action]:
        """The per-turn barrier: once no turn and no tool call is in flight, the tool calls of
        the turn that ended all start; once they have all returned, the next turns go."""
        if ctx.in_flight:
            return []
        if self._turned:
            turned, self._turned = self._turned, []
            return [CallTools(tuple(turned))]
        if self._tooled:
            tooled, self._tooled = self._tooled, []
            return [self._submit(tuple(tooled))]
        return []

    def _submit(self, samples: Sequence[Sample]) -> Submit:
        """Send `samples` by the dispatch: the router's choice, or each group whole on one
        engine."""
        if self.dispatch == "group":
            return Submit(tuple(samples), route=BY_GROUP)
        return Submit(tuple(samples))

    def step_stats(self) -> dict[str, float]:
        """None: sync has no figures of its own."""
        return {}


@dataclass
class SyncTurnsScheduler(SyncScheduler):
    """sync with a barrier per turn across the batch (batch-synchronous multi-turn rollouts)."""

    name: ClassVar[str] = "sync_turns"
    barrier: str = "turn"
