"""Length drift: the length scale as a function of training step, and how far to trust it.

Input is one row per sample (step, length) or a curve (one mean length per step, as the
digitised DAPO and DeepSeek-R1 curves). Per step the mean length is taken (capped lengths make it
a lower bound of the uncapped mean, which a growing cap share will show); then

- linear: mean(step) = m0 (1 + slope * step) by least squares -> `LinearDrift(slope)`;
- table: the per-step means (averaged into at most `max_knots` step bins) -> `TableDrift`.

The linear form is chosen when it explains at least `linear_r2` of the variance of the step means,
else the table. `extrapolate_to_` is how far the chosen drift may be used: for the linear fit, the
last step at which the 95 % prediction interval of the mean stays within +-`tolerance` of the
prediction, never past half the observed range beyond the last step (residuals of RL curves are
autocorrelated, so the interval is optimistic); a table holds its last value and is trusted only
up to its last step.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from aprilsim.workload.drift import Drift, LinearDrift, TableDrift
from aprilsim.workload.fitting.errors import LengthDataError


def step_means(steps: np.ndarray, lengths: np.ndarray, max_knots: int) -> tuple[np.ndarray, ...]:
    """(steps, mean lengths, rows per point), binned into at most `max_knots` step ranges."""
    s = np.asarray(steps, float)
    x = np.asarray(lengths, float)
    uniq, inv = np.unique(s, return_inverse=True)
    if len(uniq) > max_knots:
        edges = np.linspace(uniq[0], uniq[-1], max_knots + 1)
        inv = np.clip(np.searchsorted(edges, s, side="right") - 1, 0, max_knots - 1)
    k = int(inv.max()) + 1
    n = np.bincount(inv, minlength=k).astype(float)
    keep = n > 0
    mean_s = np.bincount(inv, weights=s, minlength=k)[keep] / n[keep]
    mean_x = np.bincount(inv, weights=x, minlength=k)[keep] / n[keep]
    return mean_s, mean_x, n[keep]


class DriftFitter:
    """Fit the length scale against training step.

    Learned: `drift_` (the chosen LinearDrift or TableDrift, scale 1 at step 0), `kind_`,
    `linear_` (LinearDrift), `table_` (TableDrift), `m0_` (mean length at step 0 on the linear
    fit), `r2_`, `steps_`, `means_`, `extrapolate_to_`, `is_curve_` (one row per step).
    """

    def __init__(self, max_knots: int = 128, linear_r2: float = 0.95, tolerance: float = 0.2):
        self.max_knots = max_knots
        self.linear_r2 = linear_r2
        self.tolerance = tolerance

    def fit(self, steps: np.ndarray, lengths: np.ndarray) -> DriftFitter:
        s = np.asarray(steps, float)
        x = np.asarray(lengths, float)
        if s.shape != x.shape:
            raise ValueError("steps and lengths must have one entry per row")
        if len(np.unique(s)) < 3:
            raise LengthDataError("a drift fit needs lengths at 3 or more distinct steps")
        self.is_curve_ = bool(len(np.unique(s)) == len(s))
        ms, mx, w = step_means(s, x, self.max_knots)
        self.steps_, self.means_ = ms, mx
        # weighted least squares: mean = a + b * step (weights: rows per point)
        A = np.stack([np.ones_like(ms), ms], 1) * np.sqrt(w)[:, None]
        (a, b), *_ = np.linalg.lstsq(A, mx * np.sqrt(w), rcond=None)
        if a <= 0:
            raise LengthDataError("the linear drift fit has a non-positive length at step 0")
        pred = a + b * ms
        ss_res = float(w @ (mx - pred) ** 2)
        ss_tot = float(w @ (mx - np.average(mx, weights=w)) ** 2)
        self.r2_ = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
        self.m0_ = float(a)
        self.linear_ = LinearDrift(float(b / a))
        self.table_ = TableDrift(tuple(float(v) for v in ms), tuple(float(v) for v in mx))
        self.kind_ = "linear" if self.r2_ >= self.linear_r2 else "table"
        self.drift_: Drift = self.linear_ if self.kind_ == "linear" else self.table_
        self.extrapolate_to_ = self._horizon(ms, mx, w, a, b, ss_res)
        return self

    def _horizon(self, ms, mx, w, a, b, ss_res) -> float:
        last, first = float(ms[-1]), float(ms[0])
        if self.kind_ == "table":
            return last
        dof = max(len(ms) - 2, 1)
        sigma = np.sqrt(ss_res / dof / np.mean(w))
        sbar = float(np.average(ms, weights=w))
        sxx = float(((ms - sbar) ** 2).sum())
        grid = np.linspace(last, last + 0.5 * (last - first), 201)
        pred = a + b * grid
        half = 1.96 * sigma * np.sqrt(1 + 1 / len(ms) + (grid - sbar) ** 2 / max(sxx, 1e-12))
        ok = (pred > 0) & (half <= self.tolerance * np.abs(pred))
        if not ok[0]:
            return last
        bad = np.flatnonzero(~ok)
        return float(grid[bad[0] - 1]) if bad.size else float(grid[-1])

    def scale_at(self, step: float) -> float:
        return float(self.drift_.scale(step))

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind_,
            "linear_slope": self.linear_.slope,
            "mean_at_step0": self.m0_,
            "r2_linear": self.r2_,
            "first_step": float(self.steps_[0]),
            "last_step": float(self.steps_[-1]),
            "extrapolate_to": self.extrapolate_to_,
            "points": int(len(self.steps_)),
            "is_curve": self.is_curve_,
        }
