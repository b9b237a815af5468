"""Has a run reached its steady state? A trend test over the summarised steps.

APRIL's buffer fills over the first steps of a run (step 0 has nothing to resume; the buffer's
level climbs for several more), so a short run overstates its steady-state rollout throughput.
The test fits a line to each per-step series (rollout throughput, buffered samples) and calls the
run settled only when it can show it: the drift per 10 steps, two standard errors included, stays
within `TOL` of the series' mean. A short run is therefore "not settled" both when it drifts and
when it is too noisy to tell; `unsettled_reason` says which figure failed, with its drift.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol


class StepRecord(Protocol):
    """What the check reads of a step record (aprilsim.metrics.records.StepRecord)."""

    generated_tokens: int
    rollout_time_s: float
    partial_samples: int

TOL = {"throughput": 0.03, "buffer": 0.10}  # allowed drift per 10 steps, share of the mean
MIN_STEPS = 4


def trend(ys: Sequence[float]) -> tuple[float, float]:
    """(least-squares slope per step, its standard error) of ys against 0..n-1."""
    n = len(ys)
    mx, my = (n - 1) / 2, sum(ys) / n
    sxx = sum((i - mx) ** 2 for i in range(n))
    slope = sum((i - mx) * (y - my) for i, y in enumerate(ys)) / sxx
    resid = [y - my - slope * (i - mx) for i, y in enumerate(ys)]
    se = math.sqrt(sum(r * r for r in resid) / (n - 2) / sxx) if n > 2 else math.inf
    return slope, se


def steady_state(steps: Sequence[StepRecord]) -> dict[str, Any]:
    """The summary's convergence keys: `settled`, the two drifts per 10 steps, and why not."""
    if len(steps) < MIN_STEPS:
        return {"settled": False, "throughput_drift_per_10_steps": 0.0,
                "buffer_drift_per_10_steps": 0.0,
                "unsettled_reason": f"only {len(steps)} summarised steps (need {MIN_STEPS})"}
    series = {
        "throughput": [s.generated_tokens / s.rollout_time_s if s.rollout_time_s else 0.0
                       for s in steps],
        "buffer": [float(s.partial_samples) for s in steps],
    }
    out: dict[str, Any] = {"settled": True}
    reasons = []
    for key, ys in series.items():
        mean = sum(ys) / len(ys)
        slope, se = trend(ys)
        if not mean:  # e.g. no buffer at all: nothing to drift
            out[f"{key}_drift_per_10_steps"] = 0.0
            continue
        drift, err = 10 * slope / abs(mean), 10 * se / abs(mean)
        out[f"{key}_drift_per_10_steps"] = drift
        if abs(drift) + 2 * err > TOL[key]:
            out["settled"] = False
            reasons.append(f"{key} {drift:+.1%} +- {2 * err:.1%} per 10 steps")
    out["unsettled_reason"] = "; ".join(reasons)
    return out
