"""Step records of a live run: the simulator's StepRecord, filled from wall-clock measurements.

The definitions are those of docs/metrics.md. What differs live: ``generated_tokens`` counts the
output of requests that *ended* during the rollout phase (the runner sees tokens when a result
comes back), ``busy_time_s`` is the time each engine had at least one request outstanding as seen
by the runner, ``kv_peak_tokens`` comes from engines that report their KV use (in-process ones;
0 otherwise), ``retractions`` is 0 (not reported), and the ideal rate of ``efficiency_vs_ideal``
is measured: the best tokens per busy engine-second of any step.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from aprilsim.metrics.records import StepRecord
from aprilsim.policies.base import Context, Scheduler
from aprilsim.types import Group

from .cluster import Cluster
from .source import LiveSource


class StepBook:
    """Opens, closes and fills the StepRecord of each step (one run)."""

    def __init__(self, cluster: Cluster, scheduler: Scheduler, source: LiveSource,
                 clock: Callable[[], float], ctx: Context) -> None:
        self.cluster, self.scheduler, self.source, self.clock, self.ctx = (
            cluster, scheduler, source, clock, ctx)
        self.records: list[StepRecord] = []
        self.cur: StepRecord | None = None
        self.waste = self.discarded = self.resumed = 0
        self._gen0 = 0
        self._busy0: list[float] = []

    def begin(self, step: int) -> None:
        """A rollout for ``step`` starts now."""
        self.ctx.step = step
        self.cur = StepRecord(step=step, rollout_start_s=self.clock(), rollout_time_s=0.0)
        self._gen0 = self.cluster.tokens
        now = time.monotonic()
        self._busy0 = [s.busy_time(now) for s in self.cluster.slots]
        for s in self.cluster.slots:
            s.kv_peak = 0
        self.waste = self.discarded = self.resumed = 0

    def close(self, partial_samples: int, paused_s: float = 0.0) -> StepRecord:
        """The rollout of the current step ends now: fill its rollout-phase figures."""
        rec = self.cur
        assert rec is not None
        now = time.monotonic()
        slots = self.cluster.slots
        rec.rollout_time_s = self.clock() - rec.rollout_start_s
        rec.generated_tokens = self.cluster.tokens - self._gen0
        rec.busy_by_engine_s = [s.busy_time(now) - b for s, b in zip(slots, self._busy0, strict=True)]
        rec.busy_time_s = sum(rec.busy_by_engine_s)
        rec.retractions = 0
        rec.kv_peak_tokens = max((s.kv_peak for s in slots), default=0)
        rec.wasted_tokens, rec.discarded_samples = self.waste, self.discarded
        rec.resumed_tokens = self.resumed
        rec.scheduler_stats = dict(self.scheduler.step_stats())
        rec.partial_samples = partial_samples
        rec.generation_paused_s = paused_s
        self.records.append(rec)
        return rec

    def fill_trained(self, rec: StepRecord, groups: tuple[Group, ...], trainer_version: int) -> None:
        """The batch's figures; staleness = the trainer's version minus each segment's version."""
        hist: dict[int, int] = {}
        tokens = prompt = trunc = n = 0
        for g in groups:
            for s in g.samples:
                n += 1
                tokens += s.generated
                prompt += s.prompt_len
                trunc += s.truncated
                for seg in s.segments:
                    lag = trainer_version - seg.version
                    hist[lag] = hist.get(lag, 0) + seg.tokens
        rec.trained_groups = len(groups)
        rec.trained_samples = n
        rec.trained_tokens = tokens
        rec.trained_prompt_tokens = prompt
        rec.truncated_samples = trunc
        rec.mean_trained_length = tokens / n if n else 0.0
        rec.workload_mean_length = self.source.expected_length(rec.step)
        rec.staleness = hist
        rec.offpolicy_tokens = sum(v for k, v in hist.items() if k > 0)

    def peak_tokens_per_s(self) -> float:
        """The best tokens per busy engine-second of any step (the live ideal rate)."""
        best = 0.0
        for r in self.records:
            busy = sum(r.busy_by_engine_s)
            if busy > 0 and r.generated_tokens:
                best = max(best, r.generated_tokens / busy)
        return best
