"""Was the client starved during a live run? Delivery bursts from its token streams, and the rule
that flags a run (its round is then left out of every verdict).

On a starved client the scheduler's decisions follow the delivery, not the engine: tokens of many
requests arrive together after a silence (every request of a step may end in one burst), so the
group that "finished first" is whichever burst was read first. The run is flagged when any of:

- the event loop woke more than :data:`LAG_P99_MS` late in 1 % of its wake-ups (p99);
- its main thread waited for a CPU more than :data:`RUN_DELAY_SHARE` of the wall time;
- more than :data:`BURST_SHARE` of the tokens arrived coalesced (a request's chunk standing for
  several iterations, after merging its chunks that arrive less than 0.3 ms apart);
- other processes took more than :data:`OTHER_CPU_SHARE` of all the machine's CPUs (below
  that, their share is reported beside the run: it slows the engines, which the time figures'
  noise floors carry, but leaves the client's reactions, hence the decisions, alone).

The figures come from ``real.machine`` (lag, /proc) and :func:`delivery` (streams).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from statistics import median
from typing import Any

from .reconstruct import StreamLog, merge_bursts

BURST_S = 3e-4  # chunks of one request less apart than this are one delivery
LAG_P99_MS = 50.0
RUN_DELAY_SHARE = 0.20
BURST_SHARE = 0.50
OTHER_CPU_SHARE = 0.90


def delivery(logs: Sequence[StreamLog], burst_s: float = BURST_S) -> dict[str, float | None]:
    """Of the tokens the client received, the share that arrived in coalesced chunks (several
    iterations' tokens at once), and the longest silence (no token from any request while some
    were in flight) against the median gap between arrivals."""
    tokens = burst = 0
    arrivals: list[float] = []
    for lg in logs:
        for t, n in merge_bursts(lg.events, burst_s):
            tokens += n
            burst += n if n >= 2 else 0
            arrivals.append(t)
    if not tokens:
        return {"tokens": 0, "burst_share": None, "max_silence_s": None, "median_gap_s": None}
    arrivals.sort()
    busy = _union(sorted((lg.submitted, lg.finished if lg.finished is not None else lg.submitted)
                         for lg in logs))
    starts = [s for s, _ in busy]
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:]) if b > a and _covered(busy, starts, a, b)]
    return {"tokens": tokens, "burst_share": burst / tokens,
            "max_silence_s": max(gaps, default=0.0),
            "median_gap_s": median(gaps) if gaps else 0.0}


def _union(spans: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted spans merged where they overlap: when some request was in flight."""
    out: list[tuple[float, float]] = []
    for s, e in spans:
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _covered(busy: Sequence[tuple[float, float]], starts: Sequence[float], a: float,
             b: float) -> bool:
    """Requests were in flight all the way from ``a`` to ``b``."""
    i = bisect.bisect_right(starts, a) - 1
    return i >= 0 and busy[i][1] >= b


def starved(check: Mapping[str, Any]) -> tuple[bool, str]:
    """Whether a run's machine check flags it, and why (the thresholds crossed)."""
    why = []
    lag = (check.get("loop_lag_ms") or {}).get("p99")
    if lag is not None and lag > LAG_P99_MS:
        why.append(f"event-loop lag p99 {lag:.0f} ms > {LAG_P99_MS:.0f}")
    rd = check.get("run_delay_share")
    if rd is not None and rd > RUN_DELAY_SHARE:
        why.append(f"client waited for a CPU {100 * rd:.0f}% of the wall "
                   f"> {100 * RUN_DELAY_SHARE:.0f}%")
    bs = check.get("burst_share")
    if bs is not None and bs > BURST_SHARE:
        why.append(f"{100 * bs:.0f}% of tokens delivered in bursts > {100 * BURST_SHARE:.0f}%")
    oc = check.get("other_cpu_share")
    if oc is not None and oc > OTHER_CPU_SHARE:
        why.append(f"other processes took {100 * oc:.0f}% of the CPUs "
                   f"> {100 * OTHER_CPU_SHARE:.0f}%")
    return bool(why), "; ".join(why)
