"""Request latency of a trained batch: response completion time and queue wait (docs/metrics.md).

A response's completion time runs from the first time its sample was sent to the engines to the
time it completed, over every resubmission in between (a recycled or partial sample counts from
its first submit, so the steps it waited in a buffer are part of its latency). Its queue wait runs
from that first submit to the first time an engine scheduled its first request (a prefill batch
took it), which only the simulated engines know.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from aprilsim.types import Group

__all__ = ["batch_latency", "latency_figures", "percentile"]


def percentile(xs: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of sorted `xs`, linearly interpolated (numpy's default)."""
    if not xs:
        raise ValueError("percentile of no values")
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def batch_latency(groups: Iterable[Group]) -> dict[str, float | None]:
    """p50/p99 of completion time and of queue wait over the batch's samples (None: not known)."""
    lat: list[float] = []
    wait: list[float] = []
    for g in groups:
        for s in g.samples:
            t0 = s.first_submit_s
            if t0 < 0:
                continue
            if s.finish_s >= 0:
                lat.append(s.finish_s - t0)
            if s.start_s >= 0:
                wait.append(s.start_s - t0)
    return latency_figures(lat, wait)


def latency_figures(lat: list[float], wait: list[float]) -> dict[str, float | None]:
    """p50/p99 of completion times `lat` and queue waits `wait` (sorted here; None: no values);
    the step ledger gathers both in its own pass over a trained batch."""
    lat.sort()
    wait.sort()
    return {
        "latency_p50_s": percentile(lat, 50) if lat else None,
        "latency_p99_s": percentile(lat, 99) if lat else None,
        "queue_wait_p50_s": percentile(wait, 50) if wait else None,
        "queue_wait_p99_s": percentile(wait, 99) if wait else None,
    }
