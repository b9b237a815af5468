"""`tail_batching`: RollPacker's tail batching (arXiv 2509.21009).

Synchronous and on-policy (colocated, staleness 0), but without waiting for the long tail in most
steps. A *short round* launches ceil(prompt_ratio * N) prompts with group_size + extra_responses
responses each, and ends as soon as N prompts have group_size finished responses: those are
trained (the first group_size responses of each to finish), everything else is aborted and its
tokens are wasted. The prompts left unfinished are the long ones: they are deferred to a queue,
and when `long_round_size` of them have accumulated, a *long round* re-runs up to N of them (fewer
when long_round_size < N: a short batch) from scratch
with exactly group_size responses each and waits for all of them (a synchronous step that is long
for every engine at once, instead of a few long responses in every step).

In the simulator a re-run prompt gets back the lengths and rewards its first group_size responses
had (a proxy for "a long prompt is long again"); the tokens of the aborted attempt are waste.
Keeping the first responses to finish biases trained lengths short: see length_bias.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
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
    SampleFinished,
    SamplesReturned,
    Submit,
)
from aprilsim.types import Group, SampleStatus, samples_of


@dataclass
class TailBatchingScheduler:
    """RollPacker: over-provision prompts and responses, defer long prompts to long rounds."""

    name: ClassVar[str] = "tail_batching"
    mode: ClassVar[Mode] = "colocated"
    variants: ClassVar[tuple[dict[str, object], ...]] = (
        {"prompt_ratio": 1.5, "long_round_size": 3},
        {"prompt_ratio": 1.5, "extra_responses": 1, "long_round_size": 3},
    )
    prompt_ratio: float = 1.25
    extra_responses: int = 2
    long_round_size: int | None = None  # deferred prompts that trigger a long round; None: N
    deferred: deque[Group] = field(default_factory=deque, repr=False)
    _round: dict[int, Group] = field(default_factory=dict, repr=False)
    _kept: dict[int, list] = field(default_factory=dict, repr=False)  # gid -> finished samples
    _batch: list[Group] = field(default_factory=list, repr=False)
    _long: bool = field(default=False, repr=False)
    _closed: bool = field(default=False, repr=False)
    _deferred_now: int = field(default=0, repr=False)
    _g: int = field(default=0, repr=False)  # the trained group size
    _n: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        if self.prompt_ratio < 1.0:
            raise ValueError("tail_batching: prompt_ratio must be >= 1")
        if self.extra_responses < 0:
            raise ValueError("tail_batching: extra_responses must be >= 0")
        if self.long_round_size is not None and self.long_round_size < 1:
            raise ValueError("tail_batching: long_round_size must be >= 1")

    def handle(self, event: Event, ctx: Context) -> Sequence[Action]:
        if isinstance(event, RolloutStarted):
            return self._start(ctx)
        if isinstance(event, SampleFinished):
            return self._sample_finished(event.sample, ctx)
        if isinstance(event, GroupFinished):
            return self._group_finished(event.group, ctx)
        if isinstance(event, SamplesReturned):
            return self._returned()
        return ()

    def _start(self, ctx: Context) -> Sequence[Action]:
        self._round, self._kept, self._batch = {}, {}, []
        self._closed, self._deferred_now = False, 0
        n, size = ctx.batch_size, self._size(ctx)
        self._g, self._n = size, n
        threshold = self.long_round_size or n
        self._long = len(self.deferred) >= threshold
        if self._long:
            take = [self.deferred.popleft() for _ in range(min(n, len(self.deferred)))]
            groups = ctx.regenerate(take, size)
        else:
            groups = ctx.new_groups(math.ceil(self.prompt_ratio * n), size + self.extra_responses)
        self._round = {g.gid: g for g in groups}
        return [Submit(samples_of(groups))]

    @staticmethod
    def _size(ctx: Context) -> int:
        if ctx.group_size is None:
            raise ValueError("tail_batching needs ctx.group_size")
        return ctx.group_size

    def _sample_finished(self, s, ctx: Context) -> Sequence[Action]:
        if self._long or self._closed or s.group_id not in self._round:
            return ()
        kept = self._kept.setdefault(s.group_id, [])
        size = self._size(ctx)
        if len(kept) >= size:
            return ()
        kept.append(s)
        if len(kept) < size:
            return ()
        g = self._round[s.group_id]
        self._batch.append(replace(g, samples=list(kept)))
        if len(self._batch) < ctx.batch_size:
            return ()
        self._closed = True
        return [AbortAll(), CloseBatch(tuple(self._batch))]

    def _group_finished(self, group: Group, ctx: Context) -> Sequence[Action]:
        if not self._long or group.gid not in self._round:
            return ()
        self._batch.append(group)
        if len(self._batch) == len(self._round):
            return [CloseBatch(tuple(self._batch))]
        return ()

    def _returned(self) -> Sequence[Action]:
        """After the short round's abort: drop the extras, defer the unfinished prompts."""
        waste = []
        in_batch = {g.gid for g in self._batch}
        for g in self._round.values():
            if g.gid not in in_batch and len(self._kept.get(g.gid, ())) < self._g:
                self.deferred.append(g)
                self._deferred_now += 1
            waste += [s for s in g.samples if s.status != SampleStatus.TRAINED]
        return [Discard(tuple(waste))] if waste else ()

    def step_stats(self) -> dict[str, float]:
        return {
            "long_round": float(self._long),
            "short_batch": float(self._long and len(self._round) < self._n),
            "deferred_prompts": float(self._deferred_now),
            "deferred_queue": float(len(self.deferred)),
        }
