"""`april`: active partial rollouts (arXiv 2509.18521; slime's --partial-rollout).

Keep ceil(ratio * N) groups in flight; as soon as N groups are complete, abort the rest, keep the
unfinished groups (finished samples keep their output) in a buffer and resume them first in the
next step, their max_new_tokens reduced by what they already generated. Groups that complete
between the N-th one and the abort go to the buffer too (complete: they need no more work). With
`recycle=False` everything left at the abort is discarded (slime without --partial-rollout).

Options:

- `resume_order`: which buffered groups resume first: "fifo" (slime's default), "most_progress"
  (most generated tokens first) or "oldest_version" (oldest first segment first).
- `max_staleness` = k: a buffered group whose oldest tokens are k versions old is force-completed
  this step (submitted first, without token budget, and the batch waits for it)
  (`stale_action="complete"`), or, once older than k, discarded and counted as waste
  (`stale_action="discard"`). Either way no trained token is more than k versions old.
- `token_budget` = B (Kimi k1.5's partial rollouts): a sample generates at most B tokens per step;
  past that it is parked until the next step, and a fresh group replaces its group in flight.
- `surplus`: groups that complete in the same wake-up as the N-th (their GroupFinished arrives
  after the batch closed, before the abort's SamplesReturned): "drop" (slime: its rollout loop
  appends them to no batch and they are no longer pending when the abort collects partials, so
  they are lost; counted as waste) or "recycle" (kept in the buffer, complete).
- `mask_offpolicy` (slime's --mask-offpolicy-in-partial-rollout): reports, per step, the trained
  tokens slime's loss mask zeroes (every token a sample carried into this step; a group recycled
  complete is masked entirely). The schedule is unchanged; see `masked_tokens` in step_stats.

Per step it also counts what slime's `off_policy_ratio` adds up (`slime_offpolicy_tokens`: for
each resubmitted sample that carries tokens, the tokens of its last segment, as the APRIL fork's
`generate` adds `sample.completion_tokens` at resubmission); the summary divides by
(generated tokens + that), slime's formula (docs/metrics.md).

`april_ds` adds DAPO's dynamic-sampling filter (slime with --partial-rollout and
--dynamic-sampling-filter-path): a finished group whose rewards are all equal is dropped (waste).
With `refill = "chunk"` (slime's loop, the default) a new over-sampling batch of ceil(ratio x N)
groups (buffer first) is submitted only when the groups in flight plus the accepted ones drop
below N; `refill = "one_for_one"` replaces each dropped group at once (a steadier, higher
in-flight level than slime keeps).
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
    SampleCapped,
    SamplesReturned,
    Submit,
)
from aprilsim.types import Group, Sample, samples_of, unfinished_of

RESUME_ORDERS = ("fifo", "most_progress", "oldest_version")
SURPLUS = ("drop", "recycle")
REFILLS = ("chunk", "one_for_one")


def slime_offpolicy_tokens(groups: Sequence[Group]) -> int:
    """What slime's off-policy counter adds when `groups` are resubmitted: for each unfinished
    sample that carries tokens, the tokens of its last segment (`sample.completion_tokens`)."""
    return sum(s.segments[-1].tokens for g in groups for s in g.samples
               if not s.complete and s.segments)


def carried_tokens(sample: Sample, version: int) -> int:
    """Tokens `sample` generated under versions before `version` (what slime's mask zeroes)."""
    return sum(seg.tokens for seg in sample.segments if seg.version < version)


def oldest_version(group: Group, default: int) -> int:
    """The policy version of the oldest tokens a group carries (`default` if it has none)."""
    return min((seg.version for s in group.samples for seg in s.segments), default=default)


@dataclass
class AprilScheduler:
    """Over-provision, stop at N complete groups, recycle the partial ones."""

    name: ClassVar[str] = "april"
    mode: ClassVar[Mode] = "colocated"
    sample_events: ClassVar[bool] = False  # group completions (and SampleCapped) suffice
    variants: ClassVar[tuple[dict[str, object], ...]] = (
        {"recycle": False},
        {"recycle": False, "ratio": 3.0},
        {"resume_order": "most_progress"},
        {"resume_order": "oldest_version", "ratio": 1.5},
        {"max_staleness": 1, "stale_action": "complete"},
        {"max_staleness": 1, "stale_action": "discard"},
        {"max_staleness": 2, "stale_action": "discard"},
        {"token_budget": 600},
        {"max_new_groups": 2.0},
        {"surplus": "recycle", "mask_offpolicy": True},
    )
    ratio: float = 2.0
    recycle: bool = True
    resume_order: str = "fifo"
    max_staleness: int | None = None
    stale_action: str = "complete"
    token_budget: int | None = None
    max_new_groups: float = 8.0  # with replacements: at most this x N fresh groups per step
    surplus: str = "drop"  # groups completing in the N-th's wake-up: "drop" (slime) or "recycle"
    mask_offpolicy: bool = False  # slime --mask-offpolicy-in-partial-rollout (reported only)
    buffer: deque[Group] = field(default_factory=deque, repr=False)
    _active: dict[int, Group] = field(default_factory=dict, repr=False)
    _parked: set[int] = field(default_factory=set, repr=False)
    _forced: set[int] = field(default_factory=set, repr=False)
    _done: list[Group] = field(default_factory=list, repr=False)
    _closed: bool = field(default=False, repr=False)
    _fresh: int = field(default=0, repr=False)
    _stats: dict[str, float] = field(default_factory=dict, repr=False)
    _surplus: set[int] = field(default_factory=set, repr=False)
    _in_flight_or_done: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        if self.ratio < 1.0:
            raise ValueError(f"{self.name}: over-provision ratio must be >= 1, got {self.ratio}")
        if self.resume_order not in RESUME_ORDERS:
            raise ValueError(f"{self.name}: resume_order must be one of {RESUME_ORDERS}")
        if self.stale_action not in ("complete", "discard"):
            raise ValueError(f"{self.name}: stale_action must be 'complete' or 'discard'")
        if self.max_staleness is not None and self.max_staleness < 1:
            raise ValueError(f"{self.name}: max_staleness must be >= 1 (partials are 1 step old)")
        if self.token_budget is not None and self.token_budget < 1:
            raise ValueError(f"{self.name}: token_budget must be >= 1")
        if self.max_new_groups < 1.0:
            raise ValueError(f"{self.name}: max_new_groups must be >= 1")
        if self.surplus not in SURPLUS:
            raise ValueError(f"{self.name}: surplus must be one of {SURPLUS}")

    # ------------------------------------------------------------------ hooks for subclasses
    def accept(self, group: Group) -> bool:
        """Whether a finished group may be trained (april_ds filters here)."""
        return True

    def keep_anyway(self, ctx: Context) -> bool:
        """Whether a group the filter rejects is trained all the same (april_ds's fallback)."""
        return False

    # ------------------------------------------------------------------ events
    def handle(self, event: Event, ctx: Context) -> Sequence[Action]:
        """Over-provision at the rollout's start, close at N complete groups, buffer the rest."""
        if isinstance(event, RolloutStarted):
            return self._start(ctx)
        if isinstance(event, GroupFinished):
            return self._group_finished(event.group, ctx)
        if isinstance(event, SampleCapped):
            return self._capped(event.sample.group_id, ctx)
        if isinstance(event, SamplesReturned):
            return self._returned()
        return ()

    def _start(self, ctx: Context) -> Sequence[Action]:
        self._done, self._closed, self._active = [], False, {}
        self._parked, self._forced, self._fresh, self._surplus = set(), set(), 0, set()
        self._stats = {
            k: 0.0
            for k in ("filtered_groups", "capped_samples", "stale_discarded_groups", "short_batch",
                      "dropped_groups", "slime_offpolicy_tokens", "masked_tokens",
                      "masked_samples", "chunks")
        }
        self._stats["chunks"] = 1.0
        actions: list[Action] = []
        target = math.ceil(self.ratio * ctx.batch_size - 1e-9)  # 43/30 x 30 is 43
        buffered = list(self.buffer)
        self.buffer.clear()
        if self.max_staleness is not None:
            keep = []
            for g in buffered:
                age = ctx.version - oldest_version(g, ctx.version)
                if self.stale_action == "discard" and age > self.max_staleness:
                    actions.append(Discard(tuple(g.samples)))
                    self._stats["stale_discarded_groups"] += 1
                    continue
                if self.stale_action == "complete" and age >= self.max_staleness:
                    self._forced.add(g.gid)
                keep.append(g)
            buffered = keep
        if self.resume_order == "most_progress":
            buffered.sort(key=lambda g: -g.generated)
        elif self.resume_order == "oldest_version":
            buffered.sort(key=lambda g: oldest_version(g, ctx.version))
        buffered.sort(key=lambda g: g.gid not in self._forced)  # stable: forced ones first
        take = max(target, len(self._forced))
        groups, rest = buffered[:take], buffered[take:]
        self.buffer.extend(rest)
        self._stats["resumed_groups"] = float(len(groups))
        self._stats["forced_groups"] = float(len(self._forced))
        forced = [g for g in groups if g.gid in self._forced]
        free = [g for g in groups if g.gid not in self._forced]
        fresh = ctx.new_groups(target - len(groups)) if len(groups) < target else []
        self._fresh = len(fresh)
        free += fresh
        for g in (*forced, *free):
            self._active[g.gid] = g
        self._stats["slime_offpolicy_tokens"] += slime_offpolicy_tokens(groups)
        self._in_flight_or_done = len(forced) + len(free)  # slime's remaining_batch_size
        if forced:  # force-completed: run to the end, whatever the token budget
            actions.append(Submit(unfinished_of(forced)))
        actions.append(
            Submit(unfinished_of(free), max_new_tokens=self.token_budget)
        )
        for g in (*forced, *free):
            if g.finished:  # completed last step after the batch closed: counts right away
                actions += self._group_finished(g, ctx)
        return actions

    def _group_finished(self, group: Group, ctx: Context) -> Sequence[Action]:
        if group.gid not in self._active:
            return ()
        if self._closed:  # completed in the N-th's wake-up
            if self.surplus == "recycle" or group.gid in self._surplus:
                return ()  # stays active: buffered at the abort, complete
            del self._active[group.gid]
            self._stats["dropped_groups"] += 1
            return [Discard(tuple(group.samples))]
        del self._active[group.gid]
        if not self.accept(group) and not self.keep_anyway(ctx):
            self._forced.discard(group.gid)
            self._stats["filtered_groups"] += 1
            self._in_flight_or_done -= 1
            return [Discard(tuple(group.samples)), *self._refill(ctx)]
        self._done.append(group)
        return self._maybe_close(ctx)

    def _refill(self, ctx: Context) -> list[Action]:
        """After a filtered group: one fresh group (subclasses: slime's chunked refill)."""
        return self._replace(ctx)

    def _capped(self, gid: int, ctx: Context) -> Sequence[Action]:
        """A sample used its token budget: its group cannot finish this step."""
        self._stats["capped_samples"] += 1
        if self._closed or gid not in self._active or gid in self._parked:
            return ()
        self._parked.add(gid)
        self._in_flight_or_done -= 1  # parked: it cannot finish this step
        return self._replace(ctx)

    def _replace(self, ctx: Context) -> list[Action]:
        """Keep the in-flight level: one fresh group for one that left (filtered or parked)."""
        live = len(self._active) - len(self._parked)
        if self._fresh < self.max_new_groups * ctx.batch_size:
            self._fresh += 1
            (g,) = ctx.new_groups(1)
            self._active[g.gid] = g
            self._in_flight_or_done += 1
            return [Submit(tuple(g.samples), max_new_tokens=self.token_budget)]
        if live == 0:  # nothing left that can finish this step: train on what there is
            return self._close(ctx, fallback=True)
        return []

    def _maybe_close(self, ctx: Context) -> list[Action]:
        if len(self._done) < ctx.batch_size:
            if len(self._active) == len(self._parked):  # replacements ran out: nothing can finish
                return self._close(ctx, fallback=True)
            return []
        if any(gid in self._active for gid in self._forced):
            return []  # the batch waits for the force-completed groups
        return self._close(ctx)

    def _close(self, ctx: Context, fallback: bool = False) -> list[Action]:
        self._closed = True
        done = sorted(self._done, key=lambda g: g.gid not in self._forced)
        batch, surplus = done[: ctx.batch_size], done[ctx.batch_size :]
        self._surplus = {g.gid for g in surplus}
        for g in surplus:  # complete, but beyond N (force-completed ones first): kept for later
            self._active[g.gid] = g
        self._stats["short_batch"] = float(fallback)
        if self.mask_offpolicy:
            masked = [s for g in batch for s in g.samples if s.segments and
                      s.segments[0].version < ctx.version]
            self._stats["masked_tokens"] = float(sum(carried_tokens(s, ctx.version)
                                                     for s in masked))
            self._stats["masked_samples"] = float(sum(
                all(seg.version < ctx.version for seg in s.segments) for s in masked))
        return [AbortAll(), CloseBatch(tuple(batch))]

    def _returned(self) -> Sequence[Action]:
        """After the abort: everything still active is partial (or complete but surplus)."""
        left = list(self._active.values())
        self._active = {}
        if self.recycle:
            self.buffer.extend(left)
            return ()
        return [Discard(samples_of(left))]

    def step_stats(self) -> dict[str, float]:
        """This step's figures (filtered, resumed, buffered groups...); reset at its start."""
        out = dict(self._stats)
        out["buffered_groups"] = float(len(self.buffer))
        out["parked_groups"] = float(len(self._parked))
        out["fresh_groups"] = float(self._fresh)
        return out


@dataclass
class AprilDSScheduler(AprilScheduler):
    """APRIL with DAPO's dynamic-sampling filter (slime: --partial-rollout + dynamic sampling)."""

    name: ClassVar[str] = "april_ds"
    variants: ClassVar[tuple[dict[str, object], ...]] = (
        {"token_budget": 800, "resume_order": "most_progress"},
        {"std_threshold": 0.05},
        {"keep_when_insufficient": True, "ratio": 1.5},
    )
    std_threshold: float = 0.0
    refill: str = "chunk"  # slime: a whole over-sampling batch when fewer than N remain
    # slime's check_reward_nonzero_std_with_fallback: a rejected group is trained anyway while no
    # more than N groups remain (in flight or accepted), rather than start another batch
    keep_when_insufficient: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.refill not in REFILLS:
            raise ValueError(f"{self.name}: refill must be one of {REFILLS}")

    def accept(self, group: Group) -> bool:
        return group.reward_std() > self.std_threshold

    def keep_anyway(self, ctx: Context) -> bool:
        """slime's `should_drop_dynamic_filter_output`: with keep_when_insufficient, a rejected
        group is kept while `remaining_batch_size <= target_data_size` (counted as kept)."""
        if self.keep_when_insufficient and self._in_flight_or_done <= ctx.batch_size:
            self._stats["kept_insufficient"] = self._stats.get("kept_insufficient", 0.0) + 1
            return True
        return False

    def _refill(self, ctx: Context) -> list[Action]:
        if self.refill == "one_for_one":
            return self._replace(ctx)
        if self._in_flight_or_done >= ctx.batch_size:
            return []  # slime's `while remaining_batch_size < target_data_size` is false
        return self._chunk(ctx)

    def _chunk(self, ctx: Context) -> list[Action]:
        """slime's `data_source(over_sampling_batch_size)`: buffered groups first, then fresh."""
        size = math.ceil(self.ratio * ctx.batch_size - 1e-9)
        cap = self.max_new_groups * ctx.batch_size
        taken = [self.buffer.popleft() for _ in range(min(size, len(self.buffer)))]
        n_fresh = min(size - len(taken), max(0, int(cap - self._fresh)))
        fresh = ctx.new_groups(n_fresh) if n_fresh else []
        groups = [*taken, *fresh]
        if not groups:  # the cap on fresh groups is hit
            if len(self._active) == len(self._parked):
                return self._close(ctx, fallback=True)
            return []
        self._fresh += len(fresh)
        self._stats["chunks"] += 1
        self._stats["slime_offpolicy_tokens"] += slime_offpolicy_tokens(taken)
        self._in_flight_or_done += len(groups)
        for g in groups:
            self._active[g.gid] = g
        actions: list[Action] = [
            Submit(unfinished_of(groups), max_new_tokens=self.token_budget)
        ]
        for g in taken:
            if g.finished:
                actions += self._group_finished(g, ctx)
        return actions
