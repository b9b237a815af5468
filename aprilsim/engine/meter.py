"""The simulated engines' figures for the rollout core's step ledger (`aprilsim.rollout.Meter`).

Every driver of simulated engines reads them the same way, exactly at the time the core gives:
the simulator (`aprilsim.sim.runtime`) and the live driver on simulated engines in virtual time
(`real.runner.virtual`, whose records must equal the simulator's).
"""

from __future__ import annotations

from collections.abc import Sequence

from aprilsim.engine.protocol import SimEngine
from aprilsim.rollout.ports import Reading

__all__ = ["SimMeter"]


class SimMeter:
    """The simulated engines' counters, read as of the given time: tokens, busy time, decode
    iterations and speculative decoding's saving count a decode span in progress up to then."""

    __slots__ = ("engines",)

    def __init__(self, engines: Sequence[SimEngine]) -> None:
        self.engines = engines

    def read(self, now: float) -> Reading:
        """The engines' counters as of `now`."""
        progress = [e.progress_at(now) for e in self.engines]
        return Reading(
            tokens=sum(p[0] for p in progress),
            busy_by_engine=[p[1] for p in progress],
            retractions=sum(e.retractions for e in self.engines),
            kv_peak=max(max(e.peak_kv, p[2]) for e, p in zip(self.engines, progress)),
            iterations=sum(e.iterations_at(now) for e in self.engines),
            prefill_s=sum(e.stats.prefill_s for e in self.engines),
            prefill_tokens=sum(e.stats.prefill_tokens for e in self.engines),
            spec_s=sum(e.spec_at(now) for e in self.engines),
            cache_hit_tokens=sum(e.stats.cache_hit_tokens for e in self.engines),
        )

    def new_window(self, now: float) -> None:
        """Start a new peak-KV window on every engine (a new step)."""
        for e in self.engines:
            e.reset_peak(now)

    def engine_tokens(self) -> int:
        """Output tokens the engines generated so far."""
        return sum(e.tokens for e in self.engines)
