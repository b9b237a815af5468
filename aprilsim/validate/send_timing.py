"""How long a live request takes to reach its engine, and how the client spaces a batch's sends:
the simulation's `client_overhead_s` and `client_send_s`, measured on the live traces.

The runner hands a batch's requests to its client in one go, but they reach the engines one
after another: the client's event loop opens and writes one HTTP request at a time and the
server's front end parses them in turn. An idle engine starts a step with the first request
that arrives, and the rest wait for the next step: on two bundled servers at 20 ms a step,
each step's first request started alone and the others one step later, which moves which
groups finish first (docs/validation.md). Each live span keeps when its server had it
(``accepted_s``: the response headers; vLLM and the bundled server send them once the request
is queued on the engine). Per batch (requests submitted together, in the order they were made),
``accepted - (the batch's first submit)`` grows by a step per request: the median intercept is
the overhead, the median slope the time per send.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from statistics import median

from aprilsim.metrics.trace import RequestSpan, Trace

BATCH_GAP_S = 2e-3  # submits less apart than this (in rid order) are one batch
MIN_SLOPE_BATCH = 4  # a batch gives a slope from this many requests on


@dataclass(frozen=True)
class SendTiming:
    """What the live traces say of the client's sends (seconds), and from how many batches."""

    overhead_s: float
    per_request_s: float
    batches: int
    requests: int


def batches(spans: Sequence[RequestSpan], gap_s: float = BATCH_GAP_S) -> list[list[RequestSpan]]:
    """The spans that have ``accepted_s``, in rid order, cut where two submits are ``gap_s``
    or more apart (spans pickled before the field have none)."""
    out: list[list[RequestSpan]] = []
    prev = None
    have = (s for s in spans if getattr(s, "accepted_s", None) is not None)
    for sp in sorted(have, key=lambda s: s.rid):
        if prev is None or sp.submit_s - prev.submit_s >= gap_s or sp.rid != prev.rid + 1:
            out.append([])
        out[-1].append(sp)
        prev = sp
    return out


def line_fit(ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares intercept and slope of ``ys`` against 0, 1, 2, ..."""
    n = len(ys)
    if n == 1:
        return ys[0], 0.0
    mx = (n - 1) / 2
    my = sum(ys) / n
    sxx = sum((k - mx) ** 2 for k in range(n))
    slope = sum((k - mx) * (y - my) for k, y in enumerate(ys)) / sxx
    return my - slope * mx, slope


def measured_send_timing(traces: Iterable[Trace | None]) -> SendTiming | None:
    """The median intercept and slope over the traces' batches (each clamped at 0); None where
    no span records when its server had it."""
    starts, slopes, n_req, n_batch = [], [], 0, 0
    for tr in traces:
        if tr is None:
            continue
        for b in batches(tr.requests):
            t0 = b[0].submit_s
            a, s = line_fit([sp.accepted_s - t0 for sp in b if sp.accepted_s is not None])
            starts.append(a)
            if len(b) >= MIN_SLOPE_BATCH:
                slopes.append(s)
            n_req += len(b)
            n_batch += 1
    if not starts:
        return None
    return SendTiming(max(0.0, median(starts)), max(0.0, median(slopes)) if slopes else 0.0,
                      n_batch, n_req)
