"""`fully_async`: AReaL-style asynchronous RL (arXiv 2505.24298).

Disaggregated. Generation never stops: ceil(inflight_ratio * N) groups are kept generating, and a
batch is formed from the next N complete groups (in completion order) as soon as they exist; the
trainer takes batches whenever it is ready, and the weights are synced after every step.

Staleness bound `eta` (AReaL's max_head_offpolicyness): a new group is started only while the
groups started so far (in closed batches, complete, or in flight) are fewer than
(version + eta + 1) * N, i.e. while it would be trained at most eta versions after the weights it
is generated under; otherwise generation pauses until the next weight update: the scheduler sends
PauseGeneration when the bound leaves room for no new group and ResumeGeneration when a weight
update
makes room,
and the runtime holds every new submission in between, recording how long generation stood paused
(`generation_paused_s`); samples interrupted by a weight update are committed work and go back at
once. A group that still
ends up too old for the batch it would enter (a long response from early on) is dropped and
counted as waste, so no trained token is ever more than eta versions old.

At a weight update, in-flight requests either continue (`interrupt=false`: their tokens keep the
version they were submitted under) or are interrupted and re-prefilled under the new weights
(`interrupt=true`, AReaL's interruptible generation: tokens before the update keep the old version,
tokens after it get the new one).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from aprilsim.policies.april import oldest_version
from aprilsim.policies.base import (
    Action,
    CloseBatch,
    Context,
    Discard,
    Event,
    GroupFinished,
    Mode,
    PauseGeneration,
    ResumeGeneration,
    RolloutStarted,
    SamplesReturned,
    Submit,
    TrainStepDone,
    UpdateWeights,
    WeightsUpdated,
)
from aprilsim.types import Group, samples_of


@dataclass
class FullyAsyncScheduler:
    """AReaL-style: generation never stops, train on the next N complete groups, staleness <= eta."""

    name: ClassVar[str] = "fully_async"
    mode: ClassVar[Mode] = "disaggregated"
    sample_events: ClassVar[bool] = False  # only group completions matter
    variants: ClassVar[tuple[dict[str, object], ...]] = (
        {"eta": 0, "interrupt": True},
        {"eta": 1, "interrupt": False},
        {"eta": 2, "interrupt": True, "inflight_ratio": 1.0},
    )
    eta: int = 4
    inflight_ratio: float = 2.0
    interrupt: bool = True
    _live: dict[int, Group] = field(default_factory=dict, repr=False)
    _ready: deque[Group] = field(default_factory=deque, repr=False)
    _closed: int = field(default=0, repr=False)  # batches closed so far
    _paused: bool = field(default=False, repr=False)
    _stats: dict[str, float] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.eta < 0:
            raise ValueError("fully_async: eta must be >= 0")
        if self.inflight_ratio <= 0:
            raise ValueError("fully_async: inflight_ratio must be > 0")
        self._reset_stats()

    def _reset_stats(self) -> None:
        self._stats = {"staleness_pauses": 0.0, "stale_dropped_groups": 0.0,
                       "interrupted_samples": 0.0}

    def handle(self, event: Event, ctx: Context) -> Sequence[Action]:
        if isinstance(event, (RolloutStarted, WeightsUpdated)):
            return self._fill(ctx)
        if isinstance(event, GroupFinished):
            g = event.group
            if self._live.pop(g.gid, None) is None:
                return ()
            self._ready.append(g)
            return [*self._close_ready(ctx), *self._fill(ctx)]
        if isinstance(event, TrainStepDone):
            return [UpdateWeights(interrupt=self.interrupt)]
        if isinstance(event, SamplesReturned):  # interrupted by the weight update: re-prefill
            self._stats["interrupted_samples"] += len(event.samples)
            if not event.samples:
                return ()
            if self._paused:  # committed work: resubmit it through the gate, then close it again
                return [ResumeGeneration(), Submit(event.samples), PauseGeneration()]
            return [Submit(event.samples)]
        return ()

    def _committed(self, ctx: Context) -> int:
        return self._closed * ctx.batch_size + len(self._ready) + len(self._live)

    def _fill(self, ctx: Context) -> list[Action]:
        n = ctx.batch_size
        want = math.ceil(self.inflight_ratio * n) - len(self._live)
        committed = self._committed(ctx)
        stale_limit = (ctx.version + self.eta + 1) * n - committed
        end_limit = want if ctx.total_steps is None else ctx.total_steps * n - committed
        # the staleness bound stops every new group (it may also just trim k: that is no pause)
        blocked = stale_limit <= 0 < min(want, end_limit)
        actions: list[Action] = []
        if not blocked and self._paused:
            actions.append(ResumeGeneration())
        k = min(want, stale_limit, end_limit)  # never start more than the run can train
        if k > 0:
            groups = ctx.new_groups(k)
            for g in groups:
                self._live[g.gid] = g
            actions.append(Submit(samples_of(groups)))
        if blocked and not self._paused:
            self._stats["staleness_pauses"] += 1
            actions.append(PauseGeneration())
        self._paused = blocked
        return actions

    def _close_ready(self, ctx: Context) -> list[Action]:
        actions: list[Action] = []
        n = ctx.batch_size
        while ctx.total_steps is None or self._closed < ctx.total_steps:
            k = self._closed  # the step this batch will be trained at
            while self._ready and k - oldest_version(self._ready[0], k) > self.eta:
                g = self._ready.popleft()
                self._stats["stale_dropped_groups"] += 1
                actions.append(Discard(tuple(g.samples)))
            if len(self._ready) < n:
                break
            batch = tuple(self._ready.popleft() for _ in range(n))
            # too-old groups behind the head: swap them out, keep the batch at N
            old = [g for g in batch if k - oldest_version(g, k) > self.eta]
            if old:
                keep = [g for g in batch if g not in old]
                for g in old:
                    self._stats["stale_dropped_groups"] += 1
                    actions.append(Discard(tuple(g.samples)))
                self._ready.extendleft(reversed(keep))
                continue
            self._closed += 1
            actions.append(CloseBatch(batch))
        return actions

    def step_stats(self) -> dict[str, float]:
        out = dict(self._stats)
        out["groups_in_flight"] = float(len(self._live))
        out["complete_groups_waiting"] = float(len(self._ready))
        self._reset_stats()
        return out
