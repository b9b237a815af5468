"""`env_async`: environment-level asynchronous agentic rollout, in the manner of ROLL Flash
(arXiv 2510.11345; ROLL's agentic pipeline, alibaba.github.io/ROLL "Agentic Asynchronous
Parallel Rollout" and "async training").

ROLL Flash runs each environment's trajectory on its own (its EnvManager loops without a barrier
between environments, so one episode's generation overlaps another's environment step), keeps
more environment groups running than a batch needs (redundant environment rollout: slow
environments do not hold the batch), collects a batch from the first trajectories to complete
(`get_batch`), and with `async_generation_ratio` = alpha lets the rollout run up to alpha steps
ahead of training, dropping trajectories older than that.

In aprilsim's terms: the environment-level asynchrony is the agent loop the rollout core runs
for every episode (every scheduler but `sync_turns`); the rest is `fully_async`'s loop with
ROLL's settings: `inflight_ratio` is the redundancy (environment groups running / groups per
batch, default 1.5), `eta` is alpha (default 1), and a weight update does not interrupt the
turns in flight (`interrupt = false`): each episode's next turn is generated under the new
weights, so an episode's turns carry the versions they were generated under. With alpha = 0
and a colocated trainer, ROLL's redundant rollout (take the first N groups, stop and drop the
rest) is `april` with `recycle = false`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from aprilsim.policies.fully_async import FullyAsyncScheduler


@dataclass
class EnvAsyncScheduler(FullyAsyncScheduler):
    """ROLL Flash-style: episodes run on their own, redundant groups, rollout alpha steps ahead."""

    name: ClassVar[str] = "env_async"
    variants: ClassVar[tuple[dict[str, object], ...]] = (
        {"eta": 0, "inflight_ratio": 1.0},
        {"eta": 2, "inflight_ratio": 2.0, "interrupt": True},
    )
    eta: int = 1  # ROLL's async_generation_ratio (alpha)
    inflight_ratio: float = 1.5  # redundancy: environment groups running / groups per batch
    interrupt: bool = False  # turns in flight finish under the old weights; the next ones don't
