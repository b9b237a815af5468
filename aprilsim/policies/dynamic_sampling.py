"""`dynamic_sampling`: DAPO's dynamic sampling (arXiv 2503.14476; verl's DAPO recipe).

Generate in rounds of `gen_batch_size` groups, each round synchronous (it waits for its longest
response). When a round is complete, groups whose rewards are all equal (reward std <=
`std_threshold`) are dropped: they give GRPO no gradient. Valid groups accumulate across rounds
until N are there; the step trains on the first N and drops the surplus (DAPO's `batch[:N]`).
Dropped groups count as wasted tokens.

`max_rounds` caps the rounds of one step (DAPO's max_num_gen_batches). When the cap is hit with
fewer than N valid groups, `on_cap` decides: "error" stops the run with a SchedulerError (verl's
behaviour), "train" trains on the valid groups there are (fewer than N, possibly none).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from aprilsim.policies.base import (
    Action,
    CloseBatch,
    Context,
    Discard,
    Event,
    GroupFinished,
    Mode,
    RolloutStarted,
    SchedulerError,
    Submit,
)
from aprilsim.types import Group, samples_of


@dataclass
class DynamicSamplingScheduler:
    """DAPO dynamic sampling: drop all-equal-reward groups, generate rounds until N valid."""

    name: ClassVar[str] = "dynamic_sampling"
    mode: ClassVar[Mode] = "colocated"
    sample_events: ClassVar[bool] = False  # only group completions matter
    variants: ClassVar[tuple[dict[str, object], ...]] = (
        {"on_cap": "train", "max_rounds": 2},
        {"gen_batch_size": 3, "on_cap": "train", "max_rounds": 2},
        {"std_threshold": 0.05, "on_cap": "train"},
    )
    gen_batch_size: int | None = None  # groups per round; None: N
    std_threshold: float = 0.0
    max_rounds: int = 10
    on_cap: str = "error"  # "error" or "train"
    _valid: list[Group] = field(default_factory=list, repr=False)
    _pending: int = field(default=0, repr=False)
    _rounds: int = field(default=0, repr=False)
    _filtered: int = field(default=0, repr=False)
    _surplus: int = field(default=0, repr=False)
    _n: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        if self.gen_batch_size is not None and self.gen_batch_size < 1:
            raise ValueError("dynamic_sampling: gen_batch_size must be >= 1")
        if self.max_rounds < 1:
            raise ValueError("dynamic_sampling: max_rounds must be >= 1")
        if self.on_cap not in ("error", "train"):
            raise ValueError("dynamic_sampling: on_cap must be 'error' or 'train'")

    def handle(self, event: Event, ctx: Context) -> Sequence[Action]:
        if isinstance(event, RolloutStarted):
            self._valid, self._rounds, self._filtered, self._surplus = [], 0, 0, 0
            return self._round(ctx)
        if isinstance(event, GroupFinished):
            return self._finished(event.group, ctx)
        return ()

    def _round(self, ctx: Context) -> list[Action]:
        self._rounds += 1
        groups = ctx.new_groups(self.gen_batch_size or ctx.batch_size)
        self._pending = len(groups)
        return [Submit(samples_of(groups))]

    def _finished(self, group: Group, ctx: Context) -> list[Action]:
        self._pending -= 1
        actions: list[Action] = []
        if group.reward_std() > self.std_threshold:
            self._valid.append(group)
        else:
            self._filtered += 1
            actions.append(Discard(tuple(group.samples)))
        if self._pending:
            return actions
        n = self._n = ctx.batch_size
        if len(self._valid) >= n:
            batch, surplus = self._valid[:n], self._valid[n:]
            self._surplus = len(surplus)
            if surplus:
                actions.append(Discard(samples_of(surplus)))
            return [*actions, CloseBatch(tuple(batch))]
        if self._rounds < self.max_rounds:
            return [*actions, *self._round(ctx)]
        if self.on_cap == "error":
            raise SchedulerError(
                f"dynamic_sampling: only {len(self._valid)} of {n} groups have reward variance "
                f"after max_rounds={self.max_rounds} rounds in step {ctx.step} (raise max_rounds, "
                "or set on_cap = 'train' to train on what there is)"
            )
        return [*actions, CloseBatch(tuple(self._valid))]

    def step_stats(self) -> dict[str, float]:
        return {
            "rounds": float(self._rounds),
            "filtered_groups": float(self._filtered),
            "surplus_groups": float(self._surplus),
            "valid_groups": float(len(self._valid)),
            "short_batch": float(self._pending == 0 and len(self._valid) < self._n),
        }
