"""How long a live abort takes to land, as the client sees it: the simulation's `abort_latency_s`.

A live runner aborts by closing its streams (vLLM) or by ``POST /abort_request`` (SGLang, the
bundled server), then asks the engine until nothing runs; only then does the scheduler hear that
the abort landed, and APRIL's step ends. The live traces keep each abort's span (``PhaseSpan``
"abort": from its send to the last request it brought back); the median of those spans is the
latency the matched simulation adds to its engines' own abort rule
(:func:`aprilsim.engine.protocol.abort_engine`).
"""

from __future__ import annotations

from collections.abc import Iterable
from statistics import median

from aprilsim.metrics.trace import Trace


def abort_spans(traces: Iterable[Trace | None]) -> list[float]:
    """Every live abort's span (seconds from its send to its last request back)."""
    return [p.end_s - p.start_s for tr in traces if tr is not None
            for p in tr.phases if p.phase == "abort" and p.end_s >= p.start_s]


def measured_abort_latency(traces: Iterable[Trace | None]) -> float | None:
    """The median abort span of ``traces``; None where they hold no abort."""
    spans = abort_spans(traces)
    return median(spans) if spans else None
