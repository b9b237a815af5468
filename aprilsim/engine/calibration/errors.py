"""Per-regime error table of a fitted cost model: where in B it is right, where it is not.

The regimes follow what matters to a rollout: B <= 8 (the nearly empty tail that decides APRIL's
gain, where the three-coefficient form is worst), 9-64, > 64, and prefill batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from aprilsim.engine.cost import CostModel, TabulatedCost

from .fit import relative_errors
from .records import Record

DEFAULT_BOUNDS = (8, 64)


@dataclass(frozen=True)
class RegimeError:
    """Relative errors (predicted - measured) / measured over one regime's records."""

    regime: str
    n: int
    median_abs: float
    p90_abs: float
    max_abs: float
    bias: float  # mean signed error: > 0 the model is slow, < 0 it is fast

    def to_dict(self) -> dict:
        return asdict(self)


def _regimes(bounds: Sequence[int]) -> list[tuple[str, int, int]]:
    out, lo = [], 1
    for hi in bounds:
        out.append((f"decode B {lo}-{hi}" if lo > 1 else f"decode B <= {hi}", lo, hi))
        lo = hi + 1
    out.append((f"decode B > {lo - 1}", lo, 1 << 62))
    return out


def regime_errors(cost: CostModel | TabulatedCost, records: Sequence[Record],
                  bounds: Sequence[int] = DEFAULT_BOUNDS,
                  counts: Sequence[float] | None = None) -> list[RegimeError]:
    """One row per decode regime of B (split at `bounds`), one for prefill, one for all; regimes
    without records are left out. With `counts` (records that are bin medians), each record
    stands for that many steps: n counts steps, and the statistics weigh records by them."""
    err = relative_errors(cost, records)
    w = np.ones(len(records)) if counts is None else np.asarray(counts, float)
    batch = np.array([r.batch_size for r in records])
    decode = np.array([r.phase == "decode" for r in records])
    masks = [(name, decode & (batch >= lo) & (batch <= hi)) for name, lo, hi in _regimes(bounds)]
    masks += [("prefill", ~decode), ("all", np.ones(len(records), bool))]
    rows = []
    for name, m in masks:
        if not m.any():
            continue
        e, wm = err[m], w[m]
        a = np.abs(e)
        rows.append(RegimeError(name, int(round(wm.sum())), _wquantile(a, wm, 0.5),
                                _wquantile(a, wm, 0.9), float(a.max()),
                                float(np.average(e, weights=wm))))
    return rows


def _wquantile(x: np.ndarray, w: np.ndarray, q: float) -> float:
    """The q-quantile of x with weights w (the smallest x whose cumulative weight reaches q)."""
    order = np.argsort(x)
    cum = np.cumsum(w[order])
    return float(x[order][np.searchsorted(cum, q * cum[-1] - 1e-12)])


def format_error_table(rows: Sequence[RegimeError]) -> str:
    """The table as text, errors in percent."""
    head = (f"{'regime':<18} {'n':>6} {'median |err|':>13} {'p90 |err|':>10} {'max |err|':>10} "
            f"{'bias':>8}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r.regime:<18} {r.n:>6} {100 * r.median_abs:>12.1f}% "
                     f"{100 * r.p90_abs:>9.1f}% {100 * r.max_abs:>9.1f}% {100 * r.bias:>+7.1f}%")
    return "\n".join(lines)
