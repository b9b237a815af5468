"""Length drift over training: responses grow (or shrink) as RL proceeds.

A drift maps a training step to a multiplicative length scale (1.0 at step 0), applied to the
uncapped length before capping, so the share of truncated responses grows with the scale.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class NoDrift:
    kind: str = "none"

    def scale(self, step: int) -> float:
        return 1.0


@dataclass(frozen=True)
class LinearDrift:
    """scale(step) = 1 + slope * step (slope = relative growth per step, e.g. 0.002)."""

    slope: float
    kind: str = "linear"

    def scale(self, step: int) -> float:
        return max(1e-6, 1.0 + self.slope * step)


@dataclass(frozen=True)
class TableDrift:
    """Piecewise-linear mean length by step (e.g. a digitised curve); scale = mean(step)/mean(0).

    Beyond the table the last value is held (extrapolating a digitised curve is a guess).
    """

    steps: tuple[float, ...]
    mean_lengths: tuple[float, ...]
    kind: str = "table"

    def __post_init__(self) -> None:
        s = np.asarray(self.steps, float)
        m = np.asarray(self.mean_lengths, float)
        if s.size < 1 or s.size != m.size:
            raise ValueError("drift table needs equally many steps and mean_lengths (at least one)")
        if np.any(np.diff(s) <= 0):
            raise ValueError("drift table steps must be strictly increasing")
        if np.any(m <= 0):
            raise ValueError("drift table mean_lengths must be positive")

    def scale(self, step: int) -> float:
        m = np.interp(step, self.steps, self.mean_lengths)
        return float(m / np.interp(0, self.steps, self.mean_lengths))


Drift = NoDrift | LinearDrift | TableDrift
