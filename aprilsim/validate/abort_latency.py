"""How long a live abort takes to land and to reach the engines: the simulation's
`abort_latency_s` and `abort_delivery_s`.

A live runner aborts by closing its streams (vLLM) or by ``POST /abort_request`` (SGLang, the
bundled server), then asks the engine until nothing runs; only then does the scheduler hear that
the abort landed, and APRIL's step ends. The live traces keep each abort's span (``PhaseSpan``
"abort": from its send to the last request it brought back); the median of those spans is the
latency the matched simulation adds to its engines' own abort rule
(:func:`aprilsim.engine.protocol.abort_engine`).

A posted abort reaches the engine a little later, and the engine steps on meanwhile: its rule
(the step in flight, then ``abort_steps`` more) runs from the arrival. The engines' iteration
rows say how many steps each ran after the send, so each (abort, engine) bounds the arrival
between two step ends; the delivery is the delay that fits the most of them
(:func:`measured_abort_delivery`). Where the client cuts its streams itself (vLLM) no step after
the send is seen and nothing is measured: the delivery stays 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from statistics import median
from typing import Any

from aprilsim.metrics.trace import Trace


def abort_spans(traces: Iterable[Trace | None]) -> list[float]:
    """Every live abort's span (seconds from its send to its last request back)."""
    return [p.end_s - p.start_s for tr in traces if tr is not None
            for p in tr.phases if p.phase == "abort" and p.end_s >= p.start_s]


def measured_abort_latency(traces: Iterable[Trace | None]) -> float | None:
    """The median abort span of ``traces``; None where they hold no abort."""
    spans = abort_spans(traces)
    return median(spans) if spans else None


def delivery_bounds(trace: Trace | None, rows: Sequence[Sequence[Mapping[str, Any]]],
                    abort_steps: int) -> list[tuple[float, float]]:
    """Per abort of ``trace`` and engine with steps after its send: the delays (lo, hi] its
    arrival lies within. The engine ran n steps after the send; the last ``abort_steps`` of
    them follow the step in flight at the arrival, so the arrival came after the end of the
    step before that one (or the send) and by the end of that one."""
    out: list[tuple[float, float]] = []
    if trace is None:
        return out
    for p in trace.phases:
        if p.phase != "abort":
            continue
        for eng in rows:
            ends = sorted(float(r["t_run"]) for r in eng if r.get("phase") in ("decode", "prefill")
                          and p.start_s < float(r["t_run"]) <= p.end_s + 1e-3)
            i = len(ends) - 1 - abort_steps  # the step in flight when the abort arrived
            if i < 0:
                continue
            lo = ends[i - 1] - p.start_s if i >= 1 else 0.0
            out.append((lo, ends[i] - p.start_s))
    return out


def measured_abort_delivery(runs: Iterable[tuple[Trace | None,
                                                 Sequence[Sequence[Mapping[str, Any]]]]],
                            abort_steps: int) -> float | None:
    """The delay that lies within the most of the runs' (lo, hi] bounds (the smallest such:
    just past the largest ``lo`` it needs); None where no abort left a step to bound it."""
    bounds = [b for tr, rows in runs for b in delivery_bounds(tr, rows, abort_steps)]
    if not bounds:
        return None
    best, best_n = 0.0, -1
    for d in sorted({lo for lo, _ in bounds} | {0.0}):
        x = d + 1e-6
        n = sum(lo < x <= hi for lo, hi in bounds)
        if n > best_n:
            best, best_n = x, n
    return best
