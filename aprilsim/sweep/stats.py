"""The aggregate of a sweep: mean and 95 % interval across seeds, paired differences to a baseline.

Every scheduler at a point runs on the same seeds, and common random numbers give it the same
groups as the baseline on each seed, so the difference to the baseline is taken seed by seed
(paired) before averaging: its interval is much narrower than the two marginal intervals suggest.
Intervals are Student-t intervals over seeds (NaN with a single seed).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import stats as sps

# Columns of the tidy table that are not metrics.
ID_COLUMNS = ("point_id", "scheduler", "seed", "steps", "warmup_steps", "sim_s")


def t_interval(values: np.ndarray, level: float = 0.95) -> tuple[float, float, float, float]:
    """(mean, std, lo, hi) of the mean of `values`, NaN-free values only."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    n = len(v)
    if n == 0:
        return (math.nan,) * 4
    mean = float(v.mean())
    if n == 1:
        return mean, math.nan, math.nan, math.nan
    std = float(v.std(ddof=1))
    half = float(sps.t.ppf(0.5 + level / 2, n - 1)) * std / math.sqrt(n)
    return mean, std, mean - half, mean + half


def metric_columns(df, keys: list[str]) -> list[str]:
    """Numeric columns that are metrics (not swept keys, ids, or bookkeeping)."""
    skip = set(ID_COLUMNS) | set(keys)
    return [
        c for c in df.columns
        if c not in skip and df[c].dtype.kind in "fiub"
    ]


def pick_baseline(schedulers: list[str], baseline: str | None) -> str | None:
    """The baseline scheduler: the one asked for, else `sync` when it ran, else none."""
    if baseline is not None:
        if baseline not in schedulers:
            raise ValueError(f"baseline {baseline!r} is not among the schedulers {schedulers}")
        return baseline
    return "sync" if "sync" in schedulers else None


def aggregate(df, keys: list[str], baseline: str | None = None, level: float = 0.95):
    """Long table: one row per (point, scheduler, metric).

    Columns: the swept keys, `point_id`, `scheduler`, `metric`, `n` (seeds), `mean`, `std`,
    `ci_lo`, `ci_hi`, `baseline`, and against the baseline on the same seeds: `diff_mean`,
    `diff_lo`, `diff_hi` (metric - baseline) and `ratio_mean`, `ratio_lo`, `ratio_hi`
    (metric / baseline, e.g. the throughput gain over sync).
    """
    import pandas as pd

    base = pick_baseline(sorted(df["scheduler"].unique()), baseline)
    metrics = metric_columns(df, keys)
    out: list[dict[str, Any]] = []
    for pid, at_point in df.groupby("point_id", sort=False):
        point = {k: at_point[k].iloc[0] for k in keys if k in at_point}
        ref = at_point[at_point["scheduler"] == base].set_index("seed") if base else None
        for sched, g in at_point.groupby("scheduler", sort=False):
            g = g.set_index("seed")
            for m in metrics:
                vals = g[m].to_numpy(dtype=float)
                mean, std, lo, hi = t_interval(vals, level)
                row = {**point, "point_id": pid, "scheduler": sched, "metric": m,
                       "n": int(np.isfinite(vals).sum()), "mean": mean, "std": std,
                       "ci_lo": lo, "ci_hi": hi, "baseline": base}
                if ref is not None:
                    common = g.index.intersection(ref.index)
                    a = g.loc[common, m].to_numpy(dtype=float)
                    b = ref.loc[common, m].to_numpy(dtype=float)
                    d_mean, _, d_lo, d_hi = t_interval(a - b, level)
                    with np.errstate(divide="ignore", invalid="ignore"):
                        r = np.where(b != 0, a / b, np.nan)
                    r_mean, _, r_lo, r_hi = t_interval(r, level)
                    row.update(diff_mean=d_mean, diff_lo=d_lo, diff_hi=d_hi,
                               ratio_mean=r_mean, ratio_lo=r_lo, ratio_hi=r_hi)
                out.append(row)
    return pd.DataFrame(out)
