"""Step records of a live run: the rollout core's ledger, reading wall-clock engine figures.

The definitions are those of docs/metrics.md, and the records are filled by the same ledger as in
simulation (``aprilsim.rollout.ledger``). What differs live is what the meter reads:
``generated_tokens`` counts the output of requests that *ended* during the rollout phase (the
runner sees tokens when a result comes back), ``busy_time_s`` is the time each engine had at least
one request outstanding as seen by the runner, ``kv_peak_tokens`` comes from engines that report
their KV use (in-process ones; 0 otherwise), ``retractions`` is 0 (not reported), and the ideal
rate of ``efficiency_vs_ideal`` is measured: the best tokens per busy engine-second of any step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from aprilsim.metrics.records import StepRecord
from aprilsim.rollout.ports import Reading

from .cluster import Cluster


class LiveMeter:
    """The cluster's counters as the ledger's Meter (busy time on the monotonic clock)."""

    def __init__(self, cluster: Cluster, clock: Callable[[], float] = time.monotonic) -> None:
        self.cluster = cluster
        self.clock = clock  # the clock the slots' busy time runs on
        self.tokens0 = 0  # engines may be shared by consecutive runs: this run's share only

    def read(self, now: float) -> Reading:
        mono = self.clock()
        slots = self.cluster.slots
        return Reading(tokens=self.cluster.tokens,
                       busy_by_engine=[s.busy_time(mono) for s in slots],
                       retractions=0, kv_peak=max((s.kv_peak for s in slots), default=0))

    def new_window(self, now: float) -> None:
        for s in self.cluster.slots:
            s.kv_peak = 0

    def engine_tokens(self) -> int:
        return self.cluster.tokens - self.tokens0


def peak_tokens_per_s(records: Sequence[StepRecord]) -> float:
    """The best tokens per busy engine-second of any step (the live ideal rate)."""
    best = 0.0
    for r in records:
        busy = sum(r.busy_by_engine_s)
        if busy > 0 and r.generated_tokens:
            best = max(best, r.generated_tokens / busy)
    return best
