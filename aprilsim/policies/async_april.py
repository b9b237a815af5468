"""`async_april`: APRIL's rollout inside slime's one-step async pipeline (train_async.py with
--partial-rollout / --over-sampling-batch-size / a dynamic-sampling filter).

slime's `train_async.py` starts the rollout of step k+1 as soon as the rollout of step k returns,
trains step k meanwhile, and before syncing the weights of step k waits for the rollout in flight
("sync generate before update weights"); each rollout is slime's `generate_rollout_async`, so with
APRIL's flags it over-samples, aborts at N groups and buffers the partials (or discards them
without --partial-rollout), and with a filter drops all-equal groups and refills in chunks. This
scheduler is `april_ds`'s rollout (`dynamic_filter` switches the filter) with `async_one_step`'s
weight-sync rule: step s is generated under the weights of step s-1, the sync waits for the abort
to land. `--update-weights-interval` > 1 is not modelled (the runtime syncs every step).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from aprilsim.policies.april import AprilDSScheduler
from aprilsim.policies.base import (
    Action,
    Context,
    Event,
    Mode,
    RolloutStarted,
    SamplesReturned,
    TrainStepDone,
    UpdateWeights,
    WeightsUpdated,
)
from aprilsim.types import Group


@dataclass
class AsyncAprilScheduler(AprilDSScheduler):
    """APRIL's rollout in slime's one-step async pipeline (train_async.py + APRIL's flags)."""

    name: ClassVar[str] = "async_april"
    mode: ClassVar[Mode] = "disaggregated"
    variants: ClassVar[tuple[dict[str, object], ...]] = ({"dynamic_filter": True},)
    dynamic_filter: bool = False  # slime --dynamic-sampling-filter-path (zero-std filter)
    _step: int = field(default=-1, repr=False)  # the rollout step waiting to start, -1: none
    _open: bool = field(default=False, repr=False)  # a rollout is running
    _aborting: bool = field(default=False, repr=False)  # closed, the abort has not landed
    _update_pending: bool = field(default=False, repr=False)
    _waits: int = field(default=0, repr=False)

    def accept(self, group: Group) -> bool:
        return super().accept(group) if self.dynamic_filter else True

    def handle(self, event: Event, ctx: Context) -> Sequence[Action]:
        if isinstance(event, RolloutStarted):
            self._step = event.step
            return self._maybe_start(ctx)
        if isinstance(event, WeightsUpdated):
            return self._maybe_start(ctx)
        if isinstance(event, TrainStepDone):
            if self._open or self._aborting:  # wait for the rollout in flight, then sync
                self._update_pending = True
                self._waits += 1
                return ()
            return [UpdateWeights()]
        if isinstance(event, SamplesReturned):
            actions = list(super().handle(event, ctx))
            self._aborting = False
            if self._update_pending:
                self._update_pending = False
                actions.append(UpdateWeights())
                return actions
            return [*actions, *self._maybe_start(ctx)]
        return super().handle(event, ctx)

    def _maybe_start(self, ctx: Context) -> list[Action]:
        """Start the waiting rollout once its weights (step s: version s-1) are in and the
        previous rollout's abort has landed (its partials are buffered)."""
        if self._step < 0 or self._aborting or self._update_pending or ctx.version < self._step - 1:
            return []
        self._step, self._open = -1, True
        return list(self._start(ctx))

    def _close(self, ctx: Context, fallback: bool = False) -> list[Action]:
        self._open, self._aborting = False, True
        return super()._close(ctx, fallback)

    def step_stats(self) -> dict[str, float]:
        out = super().step_stats()
        if self._aborting and self.recycle:  # read at the close, before the abort lands
            out["buffered_groups"] += float(len(self._active))
        out["update_waits_for_rollout"] = float(self._waits)
        self._waits = 0
        return out
