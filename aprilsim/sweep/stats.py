"""The aggregate of a sweep: mean and 95 % interval across seeds, paired differences to a baseline.

Every scheduler at a point runs on the same seeds, and common random numbers give it the same
groups as the baseline on each seed, so the difference to the baseline is taken seed by seed
(paired) before averaging: its interval is much narrower than the two marginal intervals suggest.
Intervals are Student-t intervals over seeds (NaN with a single seed).
"""

from __future__ import annotations

import math

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


def _summarise(wide, by: list[str], metrics: list[str], level: float, prefix: str):
    """Per group: n, mean and t-interval of each metric, as a long table."""
    import pandas as pd

    g = wide.groupby(by, sort=False)[metrics]
    n, mean, std = g.count(), g.mean(), g.std(ddof=1)
    long = pd.concat({"n": n.stack(), "mean": mean.stack(), "std": std.stack()}, axis=1)
    long.index = long.index.set_names([*by, "metric"])
    cnt = long["n"].to_numpy(dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        q = sps.t.ppf(0.5 + level / 2, np.where(cnt >= 2, cnt - 1, np.nan))
        half = q * long["std"].to_numpy(dtype=float) / np.sqrt(cnt)
    long[f"{prefix}lo"] = long["mean"] - half
    long[f"{prefix}hi"] = long["mean"] + half
    return long


def aggregate(df, keys: list[str], baseline: str | None = None, level: float = 0.95):
    """Long table: one row per (point, scheduler, metric).

    Columns: the swept keys, `point_id`, `scheduler`, `metric`, `n` (seeds), `mean`, `std`,
    `ci_lo`, `ci_hi`, `baseline`, and against the baseline on the same seeds: `diff_mean`,
    `diff_lo`, `diff_hi` (metric - baseline) and `ratio_mean`, `ratio_lo`, `ratio_hi`
    (metric / baseline, e.g. the throughput gain over sync).
    """
    import pandas as pd

    keys = [k for k in keys if k in df.columns]
    base = pick_baseline(sorted(df["scheduler"].unique()), baseline)
    metrics = metric_columns(df, keys)
    by = ["point_id", "scheduler"]
    out = _summarise(df, by, metrics, level, "ci_")
    out["baseline"] = base
    if base is not None:
        mine = df.set_index(["point_id", "seed"])
        ref = df[df["scheduler"] == base].set_index(["point_id", "seed"])[metrics]
        a = mine[metrics].to_numpy(dtype=float)
        b = ref.reindex(mine.index).to_numpy(dtype=float)  # the baseline on the same seed
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = np.where(b != 0, a / b, np.nan)
        ids = mine.index.to_frame(index=False).assign(scheduler=mine["scheduler"].to_numpy())
        for name, values in (("diff", a - b), ("ratio", ratio)):
            wide = pd.concat([ids, pd.DataFrame(values, columns=metrics)], axis=1)
            s = _summarise(wide, by, metrics, level, f"{name}_")
            out = out.join(s[["mean", f"{name}_lo", f"{name}_hi"]]
                           .rename(columns={"mean": f"{name}_mean"}))
    out = out.reset_index()
    points = df.drop_duplicates("point_id").set_index("point_id")[keys]
    out = out.join(points, on="point_id")
    out["n"] = out["n"].astype(int)
    cols = [*keys, "point_id", "scheduler", "metric", "n", "mean", "std", "ci_lo", "ci_hi",
            "baseline"]
    if base is not None:
        cols += ["diff_mean", "diff_lo", "diff_hi", "ratio_mean", "ratio_lo", "ratio_hi"]
    return out[cols]
