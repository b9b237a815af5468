"""Bootstrap confidence intervals by multinomial resampling of the length histogram.

Resampling n lengths with replacement is the same as drawing new counts for the distinct values
(and for the capped bin) from a multinomial, so a replicate costs O(distinct lengths). Each
replicate refits the chosen family, warm-started at the full-data optimum.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from aprilsim.workload.fitting.censoring import CensoredHistogram
from aprilsim.workload.lengths import LengthModel


def resample(data: CensoredHistogram, rng: np.random.Generator) -> CensoredHistogram:
    counts = np.append(data.counts, data.n_censored).astype(float)
    new = rng.multinomial(data.n, counts / counts.sum())
    return data.with_counts(new[:-1], int(new[-1]))


def bootstrap_ci(
    data: CensoredHistogram,
    refit: Callable[[CensoredHistogram], LengthModel],
    stats: Callable[[LengthModel], dict[str, float]],
    point: dict[str, float],
    n_boot: int,
    rng: np.random.Generator,
    confidence: float = 0.95,
    on_progress: Callable[[int, int], None] | None = None,
) -> dict[str, dict[str, float]]:
    """Percentile intervals of `stats(refit(resample))`, next to the full-data `point` values."""
    draws: dict[str, list[float]] = {k: [] for k in point}
    for i in range(n_boot):
        if on_progress is not None and i % 10 == 0:
            on_progress(i, n_boot)
        try:
            s = stats(refit(resample(data, rng)))
        except (ValueError, FloatingPointError):
            continue
        for k in draws:
            draws[k].append(s[k])
    alpha = (1 - confidence) / 2
    out = {}
    for k, v in point.items():
        arr = np.asarray(draws[k], float)
        arr = arr[np.isfinite(arr)]
        lo, hi = np.quantile(arr, [alpha, 1 - alpha]) if arr.size else (np.nan, np.nan)
        out[k] = {"estimate": float(v), "lo": float(lo), "hi": float(hi), "n": int(arr.size)}
    return out
