"""What calibration can say of the client overhead and the prefix cache (issue 19 item 5).

`client_overhead_s`: a live sweep's single-request, one-token runs are timed twice, by the client
(submit to result, wall clock) and, through the fitted cost, by the engine (that request's
prefill, which emits its only token); the median difference is the time the request spends
outside the engine (HTTP, tokenising, the client's loop). Only an engine-side timing (the bundled
engine's iteration log, vLLM's /metrics) separates the two: timed from the token stream, the
engine's time already holds it, so nothing is fitted.

The prefix cache is a setting, not a fit: how much it serves depends on the workload (resumed
samples, repeated prompts), and a sweep's prompts are all distinct. Where a source reports what
the engine's cache served (SGLang's ``#cached-token`` on prefill lines), its share is recorded.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from aprilsim.engine.cost import CostModel, TabulatedCost

from .sglang_log import parse_sglang_line

ENGINE_SIDE = ("iteration log", "vLLM /metrics")  # timings that leave the client's time out


def fit_client_overhead(cost: CostModel | TabulatedCost,
                        walls: Sequence[tuple[int, float]]) -> float | None:
    """Seconds per request outside the engine: the median of (client wall time - the fitted
    prefill of one request of n tokens) over one-token runs `walls` [(n, seconds)], floored at
    0; None without runs."""
    if not walls:
        return None
    gaps = [w - cost.prefill_time(n, n * n, 1, 1) for n, w in walls]
    return max(0.0, statistics.median(gaps))


def client_overhead_lines(cost: CostModel | TabulatedCost, info: dict) -> float | None:
    """Fit `client_overhead_s` from a live sweep's info (its `client_walls` and `timing`), and
    say so in its measured/assumed lists; None when it cannot be fitted."""
    walls, timing = info.get("client_walls"), info.get("timing")
    if walls is None:
        return None
    if timing not in ENGINE_SIDE:
        info.setdefault("assumed", []).append(
            f"client_overhead_s 0 (not fitted: timed by {timing}, which includes it)")
        return None
    got = fit_client_overhead(cost, walls)
    if got is None:
        return None
    info.setdefault("measured", []).append(
        f"client_overhead_s {got:.4g} (median of client wall - fitted prefill over "
        f"{len(walls)} one-token requests)")
    return got


def sglang_cached_share(lines: Sequence[str]) -> float | None:
    """The share of prefill input tokens SGLang's cache served (#cached-token over #new-token
    plus #cached-token, summed over prefill lines); None without such lines."""
    new = cached = 0
    for line in lines:
        parsed = parse_sglang_line(line)
        if parsed is None or parsed[0] != "prefill" or "#cached-token" not in parsed[1]:
            continue
        try:
            new += int(parsed[1]["#new-token"])
            cached += int(parsed[1]["#cached-token"])
        except ValueError:
            continue
    return cached / (new + cached) if new + cached else None


def prefix_cache_line(share: float | None) -> tuple[str, str]:
    """("measured" | "assumed", the line the preset and the output print about the cache)."""
    if share is None:
        return "assumed", ("prefix_cache: a setting, not fitted (the source reports no cache "
                           "hits; the scenario's [cluster] prefix_cache holds)")
    return "measured", (f"the engine's prefix cache served {100 * share:.1f}% of prefill input "
                        "tokens in this log (a workload figure: model it with [cluster] "
                        "prefix_cache = \"lru\")")
