"""What a reader hands to the fitters: lengths as a histogram, plus optional per-row columns.

Lengths are integer token counts, so a million of them collapse to a few thousand distinct values;
every likelihood in this package runs on (values, counts), which is what makes fitting cheap and
bootstrapping a multinomial draw. Per-row arrays are kept only when a group or step column asks
for them (prompt split, drift), so a plain length file is read in bounded memory.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from aprilsim.workload.fitting.errors import LengthDataError
from aprilsim.workload.fitting.numbers import MAX_LENGTH


@dataclass(frozen=True)
class Histogram:
    """Distinct positive integer lengths (sorted) and how often each was seen."""

    values: np.ndarray
    counts: np.ndarray

    def __post_init__(self) -> None:
        v = np.asarray(self.values, dtype=np.int64)
        c = np.asarray(self.counts, dtype=np.int64)
        if v.shape != c.shape or v.ndim != 1:
            raise ValueError("histogram values and counts must be 1-D arrays of one length")
        order = np.argsort(v, kind="stable")
        v, c = v[order], c[order]
        keep = c > 0
        object.__setattr__(self, "values", v[keep])
        object.__setattr__(self, "counts", c[keep])

    @classmethod
    def from_lengths(cls, lengths: np.ndarray) -> Histogram:
        v, c = np.unique(np.asarray(lengths, dtype=np.int64), return_counts=True)
        return cls(v, c)

    @property
    def n(self) -> int:
        return int(self.counts.sum())

    def expand(self) -> np.ndarray:
        """All lengths, one per observation (sorted)."""
        return np.repeat(self.values, self.counts)

    def quantile(self, q: float | np.ndarray) -> np.ndarray:
        """Empirical quantile (inverse of the step CDF, as `Empirical.ppf`)."""
        cum = np.cumsum(self.counts)
        idx = np.searchsorted(cum, np.ceil(np.asarray(q, float) * cum[-1]).clip(1, None), "left")
        return self.values[np.clip(idx, 0, len(self.values) - 1)]


class HistogramBuilder:
    """Accumulates integer lengths chunk by chunk in memory proportional to distinct values."""

    def __init__(self) -> None:
        self._counter: Counter[int] = Counter()

    def add(self, chunk: np.ndarray) -> None:
        if len(chunk):
            v, c = np.unique(np.asarray(chunk, dtype=np.int64), return_counts=True)
            self._counter.update(dict(zip(v.tolist(), c.tolist(), strict=True)))

    def build(self) -> Histogram:
        if not self._counter:
            return Histogram(np.zeros(0, np.int64), np.zeros(0, np.int64))
        items = sorted(self._counter.items())
        return Histogram(np.array([k for k, _ in items]), np.array([c for _, c in items]))


@dataclass
class LengthData:
    """Lengths read from a file, with the bookkeeping a user needs to trust them.

    `lengths`, `groups` and `steps` are per-row arrays, present only when a group or step column
    was read (otherwise only the histogram is kept). `skipped` counts rejected rows by reason.
    """

    histogram: Histogram
    source: str = "<array>"
    column: str | None = None
    group_column: str | None = None
    step_column: str | None = None
    lengths: np.ndarray | None = None
    groups: np.ndarray | None = None
    steps: np.ndarray | None = None
    rows_read: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    skip_examples: dict[str, str] = field(default_factory=dict)  # first raw cell per reason

    @property
    def n(self) -> int:
        return self.histogram.n

    @property
    def n_skipped(self) -> int:
        return int(sum(self.skipped.values()))

    @classmethod
    def from_array(
        cls,
        lengths: np.ndarray,
        groups: np.ndarray | None = None,
        steps: np.ndarray | None = None,
    ) -> LengthData:
        """Validate an in-memory array of lengths (same rules as the readers, but strict)."""
        x = np.asarray(lengths, dtype=float).ravel()
        if x.size == 0:
            raise LengthDataError("no lengths given")
        if not np.all(np.isfinite(x)):
            raise LengthDataError(f"{int((~np.isfinite(x)).sum())} lengths are NaN or infinite")
        if np.any(x <= 0):
            raise LengthDataError(f"{int((x <= 0).sum())} lengths are zero or negative")
        if np.any(x > MAX_LENGTH):
            raise LengthDataError(f"{int((x > MAX_LENGTH).sum())} lengths are above 2^53")
        if np.any(x != np.round(x)):
            raise LengthDataError(f"{int((x != np.round(x)).sum())} lengths are not integers")
        xi = x.astype(np.int64)
        keep_rows = groups is not None or steps is not None
        return cls(
            Histogram.from_lengths(xi),
            lengths=xi if keep_rows else None,
            groups=None if groups is None else np.asarray(groups).ravel(),
            steps=None if steps is None else np.asarray(steps, float).ravel(),
            rows_read=int(x.size),
        )


def check_usable(data: LengthData, what: str = "lengths") -> None:
    """Raise LengthDataError when the data cannot support a distribution fit."""
    h = data.histogram
    skipped = ""
    if data.skipped:
        top = max(data.skipped, key=lambda r: data.skipped[r])
        example = data.skip_examples.get(top)
        seen = f"; {top}: e.g. {example!r}" if example is not None else ""
        skipped = (
            " (skipped: " + ", ".join(f"{v} {k}" for k, v in data.skipped.items()) + seen + ")"
        )
    if h.n == 0:
        raise LengthDataError(f"{data.source}: no usable {what} in {data.rows_read} rows{skipped}")
    if len(h.values) == 1:
        raise LengthDataError(
            f"{data.source}: all {h.n} {what} equal {int(h.values[0])}; "
            "a distribution cannot be fitted to one repeated value"
        )
