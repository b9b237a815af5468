"""The trainer stand-in: how long a training step and a weight sync take in a live run.

By default it sleeps for the simulator's TrainerModel formula (``base_s + per_token_s x tokens``;
``sync_s`` for the weight transfer), so a live run and a simulation of the same scenario spend the
same modelled time training. A user callable (``module:function``) replaces the formula: it gets
the batch (the trained groups, their samples carrying their segments) and the step index, may be
a coroutine function, and its measured wall time is the training time.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aprilsim.trainer import TrainerModel
from aprilsim.types import Group

TrainFn = Callable[[Sequence[Group], int], Any]


@dataclass
class TrainerStandIn:
    """Training and weight-sync timing for the live runner (modelled sleeps or a user callable)."""

    model: TrainerModel
    train_fn: TrainFn | None = None
    checkpoint: str | None = None  # weights to load on every update (/update_weights_from_disk)
    # what "seconds it took" is read on (virtual: tests)
    clock: Callable[[], float] = time.monotonic

    async def train(self, groups: Sequence[Group], step: int, tokens: int) -> float:
        """Train on ``groups``; return the seconds it took."""
        t0 = self.clock()
        if self.train_fn is None:
            await asyncio.sleep(self.model.train_time(tokens))
        else:
            out = self.train_fn(groups, step)
            if inspect.isawaitable(out):
                await out
        return self.clock() - t0

    async def sync_pad(self, spent: float) -> None:
        """Sleep what is left of the modelled sync time after ``spent`` seconds of real update
        (nothing when real weights are loaded from a checkpoint: that time is the real one)."""
        if self.checkpoint is None:
            await asyncio.sleep(max(0.0, self.model.sync_s - spent))
