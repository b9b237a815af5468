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

__all__ = ["batch_latency", "latency_figures", "percentile", "percentiles"]


def percentile(xs: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of sorted `xs`, linearly interpolated (numpy's default)."""
    if not xs:
        raise ValueError("percentile of no values")
    pos, lo, hi = _ranks(len(xs), q)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _ranks(n: int, q: float) -> tuple[float, int, int]:
    """Where the q-th percentile of n sorted values lies: its position and the two ranks the
    linear interpolation reads."""
    pos = (n - 1) * q / 100.0
    lo = int(pos)
    return pos, lo, min(lo + 1, n - 1)


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
    """p50/p99 of completion times `lat` and queue waits `wait` (None: no values); the step
    ledger gathers both in its own pass over a trained batch."""
    lat50, lat99 = percentiles(lat, (50, 99)) if lat else (None, None)
    wait50, wait99 = percentiles(wait, (50, 99)) if wait else (None, None)
    return {"latency_p50_s": lat50, "latency_p99_s": lat99,
            "queue_wait_p50_s": wait50, "queue_wait_p99_s": wait99}


# below this many values a sort is as fast as a selection
_SELECT_FROM = 64


def percentiles(xs: Sequence[float], qs: Sequence[float]) -> list[float]:
    """`percentile` of unsorted `xs` at each of `qs`, the same values: only the order statistics
    the interpolation reads are selected (numpy's partition, O(n)), not the whole list sorted
    (a trained batch's 8k latencies sorted twice were ~2 % of a simulated step)."""
    if not xs:
        raise ValueError("percentile of no values")
    n = len(xs)
    if n < _SELECT_FROM:
        ordered = sorted(xs)
        return [percentile(ordered, q) for q in qs]
    import numpy as np  # here: the CLI's start-up does not need it

    at = [_ranks(n, q) for q in qs]
    ranks = sorted({r for _, lo, hi in at for r in (lo, hi)})
    part = np.partition(np.fromiter(xs, float, n), ranks)
    stats = {r: float(part[r]) for r in ranks}
    return [stats[lo] + (stats[hi] - stats[lo]) * (pos - lo) for pos, lo, hi in at]
