"""Right-censoring at the max response length: given by the user or detected as a spike.

A response that hit `max_len` was cut, so its true length is only known to be >= max_len: it
enters the likelihood as P(L >= max_len), never as an exact value. When the cap is not given, a
spike at the largest observed length (many more responses exactly there than the density just
below predicts) is taken as the cap and reported as detected.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import special

from aprilsim.workload.fitting.data import Histogram

SPIKE_MIN_COUNT = 3
SPIKE_P_VALUE = 1e-3


@dataclass(frozen=True)
class CapInfo:
    """The cap used for censoring and where it came from ("given", "detected" or "none")."""

    max_len: int | None
    source: str
    n_censored: int
    share: float
    spike_count: int = 0
    expected_count: float = 0.0
    window: int = 0  # integers below the maximum whose density gave expected_count
    p_value: float = 1.0  # Poisson P(count >= spike_count | expected_count)

    def explain(self) -> str:
        """One line saying what the cap is and, for a detected one, why it was taken as one."""
        if self.source == "given":
            return (
                f"cap {self.max_len} (given): {self.n_censored:,} lengths "
                f"({percent(self.share)} %) at or above it, right-censored"
            )
        if self.source == "detected":
            return (
                f"cap {self.max_len} detected: {self.spike_count:,} lengths "
                f"({percent(self.share)} %) sit exactly at the maximum, where the density over "
                f"the {self.window:,} lengths below predicts {self.expected_count:.2f} (Poisson "
                f"p = {self.p_value:.1e} < {SPIKE_P_VALUE:g}, at least {SPIKE_MIN_COUNT} needed); "
                "treated as right-censored (--max-len to override, --no-detect-cap to turn off)"
            )
        return "no cap given or detected: every length is treated as exact"

    def to_dict(self) -> dict:
        return {
            "max_len": self.max_len,
            "source": self.source,
            "n_censored": self.n_censored,
            "share": self.share,
            "spike_count": self.spike_count,
            "expected_count": self.expected_count,
            "window": self.window,
            "p_value": self.p_value,
        }


def percent(share: float) -> str:
    """A share as a percentage with two significant digits when small (0.031, not 0.00)."""
    v = 100.0 * share
    if v == 0 or v != v:
        return "0" if v == 0 else "nan"
    return f"{v:.2f}" if v >= 0.1 else f"{v:.2g}"


def poisson_sf(k: int, mu: float) -> float:
    """P(N > k) for N ~ Poisson(mu), as scipy.stats.poisson.sf (without loading scipy.stats)."""
    return 1.0 if k < 0 else float(special.pdtrc(k, mu))


def spike_window(hist: Histogram) -> tuple[int, float]:
    """(width of the window below the maximum, Poisson p-value of the count at the maximum)."""
    top = int(hist.values[-1])
    width = max(20, int(round(0.05 * top)))
    lo = max(top - width, 1)
    in_window = hist.counts[(hist.values >= lo) & (hist.values < top)].sum()
    expected = max(float(in_window) / max(top - lo, 1), 1.0 / max(top - lo, 1))
    return top - lo, poisson_sf(int(hist.counts[-1]) - 1, expected)


def detect_cap(hist: Histogram) -> tuple[int | None, int, float]:
    """(cap or None, count at the maximum, count expected there from the density just below).

    The expected count is the mean count per integer over the window of max(20, 5 %) integers
    below the maximum; the maximum is a spike when its count is at least 3 and has Poisson tail
    probability below 1e-3 under that expectation.
    """
    if len(hist.values) < 2:
        return None, 0, 0.0
    top = int(hist.values[-1])
    at_top = int(hist.counts[-1])
    width = max(20, int(round(0.05 * top)))
    lo = max(top - width, 1)
    in_window = hist.counts[(hist.values >= lo) & (hist.values < top)].sum()
    expected = max(float(in_window) / max(top - lo, 1), 1.0 / max(top - lo, 1))
    is_spike = at_top >= SPIKE_MIN_COUNT and poisson_sf(at_top - 1, expected) < SPIKE_P_VALUE
    return (top if is_spike else None), at_top, expected


@dataclass(frozen=True)
class CensoredHistogram:
    """Lengths below the cap as bins (lower, values] with counts, plus the number at or above it.

    An exact integer length k is the bin (k - 1, k] of the continuous X it was drawn from
    (`lower` defaults to values - 1). `coarsen` merges neighbouring lengths into wider bins.
    """

    values: np.ndarray
    counts: np.ndarray
    n_censored: int
    max_len: int | None
    lower: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.lower is None:
            object.__setattr__(self, "lower", np.asarray(self.values, float) - 1.0)

    @property
    def n(self) -> int:
        return int(self.counts.sum()) + self.n_censored

    @property
    def binned(self) -> bool:
        return bool(np.any(np.asarray(self.values, float) - self.lower > 1.0))

    @property
    def exact_up_to(self) -> int:
        """Lengths up to this one are kept exact (one bin per integer); above, bins are merged."""
        wide = np.flatnonzero(np.asarray(self.values, float) - self.lower > 1.0)
        if len(wide) == 0:
            return int(self.values[-1]) if len(self.values) else 0
        return int(self.lower[wide[0]])

    @property
    def midpoints(self) -> np.ndarray:
        """A stand-in exact value per bin (for starting values and EM)."""
        return np.maximum(0.5 * (self.lower + self.values), 0.5)

    def with_counts(self, counts: np.ndarray, n_censored: int) -> CensoredHistogram:
        keep = counts > 0
        return CensoredHistogram(
            self.values[keep], counts[keep], int(n_censored), self.max_len, self.lower[keep]
        )


def coarsen(data: CensoredHistogram, max_bins: int, exact_below: int = 256) -> CensoredHistogram:
    """Merge neighbouring lengths into at most about `max_bins` bins (identity if already fewer).

    Lengths up to `exact_below` stay exact; above, bin edges grow geometrically with the smallest
    ratio that fits the budget (e.g. 0.2 % wide at 16k tokens for 2,000 bins). The likelihood of
    binned (interval-censored) data is still exact for the bins, so fits stay consistent and only
    lose the information inside a bin, which is negligible next to any family's spread.
    """
    if len(data.values) <= max_bins:
        return data
    v = np.asarray(data.values, np.int64)
    top = int(v[-1])
    k0 = min(exact_below, max_bins // 4)
    if top <= k0:
        return data
    n_geo = max(max_bins - k0, 16)
    ratio = (top / k0) ** (1.0 / n_geo)
    edges = np.unique(np.ceil(k0 * ratio ** np.arange(n_geo + 1)).astype(np.int64))
    edges = np.concatenate([np.arange(0, k0), edges])  # bin i is (edges[i], edges[i+1]]
    edges[-1] = max(edges[-1], top)
    idx = np.searchsorted(edges, v, side="left") - 1
    counts = np.bincount(idx, weights=data.counts, minlength=len(edges) - 1).astype(np.int64)
    keep = counts > 0
    upper = edges[1:][keep]
    lower = edges[:-1][keep].astype(float)
    return CensoredHistogram(upper, counts[keep], data.n_censored, data.max_len, lower)


def censor(hist: Histogram, max_len: int | None) -> CensoredHistogram:
    if max_len is None:
        return CensoredHistogram(hist.values, hist.counts, 0, None)
    below = hist.values < max_len
    return CensoredHistogram(
        hist.values[below], hist.counts[below], int(hist.counts[~below].sum()), int(max_len)
    )


def resolve_cap(hist: Histogram, max_len: int | None, detect: bool = True) -> CapInfo:
    """The cap to censor at: the given one, else a detected spike, else none."""
    n = hist.n
    if max_len is not None:
        n_c = int(hist.counts[hist.values >= max_len].sum())
        return CapInfo(int(max_len), "given", n_c, n_c / n if n else 0.0)
    if detect:
        cap, at_top, expected = detect_cap(hist)
        window, p = spike_window(hist) if len(hist.values) >= 2 else (0, 1.0)
        if cap is not None:
            return CapInfo(cap, "detected", at_top, at_top / n, at_top, expected, window, p)
        return CapInfo(None, "none", 0, 0.0, at_top, expected, window, p)
    return CapInfo(None, "none", 0, 0.0)
