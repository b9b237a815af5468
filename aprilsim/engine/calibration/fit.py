"""Fit a cost model to timing records: relative-error weighted least squares, non-negative.

Decode iterations are fitted to t(B, K) = f(B) + g(B)*K, either as f = a + b*B, g = c
(`CostModel`) or with f and g piecewise linear over knots in B (`TabulatedCost`); prefill
batches to p0 + p1*sum(n) + p2*sum(n^2). Each record's residual is divided by its measured time,
so a 1 ms iteration at B = 1 weighs as much as a 50 ms one at B = 256: the fit minimises the sum of
squared *relative* errors, which is what the simulator's error on a rollout's time depends on.
Records enter as measured, so batch sizes the workload visits often weigh more. Coefficients are
constrained to be >= 0 (scipy's NNLS on column-scaled rows).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from aprilsim.engine.cost import CostModel, TabulatedCost

from .records import Record

FORMS = ("linear", "tables")
MIN_F = 1e-9  # TabulatedCost needs f(B) > 0


def _nnls_relative(x: np.ndarray, y: np.ndarray, weight: np.ndarray | None = None,
                   scale_by: np.ndarray | None = None) -> np.ndarray:
    """argmin_{w >= 0} sum(weight * ((x @ w - y) / s)^2) with s = ``scale_by`` (default y: relative
    errors), columns scaled for conditioning."""
    sw = np.ones(len(y)) if weight is None else np.sqrt(weight)
    s = y if scale_by is None else scale_by
    rows = x * (sw / s)[:, None]
    scale = np.abs(rows).max(axis=0)
    scale[scale == 0] = 1.0
    from scipy.optimize import nnls  # on first use: the CLI starts without scipy

    w, _ = nnls(rows / scale, sw * y / s, maxiter=50 * x.shape[1] + 500)
    return w / scale


def bin_records(records: Sequence[Record], kv_step: float = 0.2) -> list[tuple[Record, int]]:
    """Robust summary of noisy steps: records of the same phase and batch size whose KV load (or
    prefill size) lies within one log-bin of width `kv_step` (20 %) are replaced by one record with
    their median time and mean size, paired with their count. Fitting bin medians weighted by
    counts keeps the weight of often-visited shapes while one slow outlier step (a CPU hiccup, a
    garbage collection) no longer drags the fit: least squares on relative errors otherwise
    leans towards under-prediction when the measured times have a long upper tail."""
    groups: dict[tuple, list[Record]] = {}
    for r in records:
        size = r.kv_tokens if r.phase == "decode" else r.prefill_tokens
        key = (r.phase, r.batch_size, int(np.floor(np.log1p(size) / np.log1p(kv_step))))
        groups.setdefault(key, []).append(r)
    out = []
    for rs in groups.values():
        med = float(np.median([r.duration_s for r in rs]))
        if rs[0].phase == "decode":
            rec = Record("decode", rs[0].batch_size, float(np.mean([r.kv_tokens for r in rs])), 0,
                         med)
        else:
            rec = Record("prefill", rs[0].batch_size, 0.0,
                         int(round(np.mean([r.prefill_tokens for r in rs]))), med,
                         float(np.mean([r.tokens_sq for r in rs])), averaged=len(rs) > 1)
        out.append((rec, len(rs)))
    return out


def _split(records: Sequence[Record]) -> tuple[list[Record], list[Record]]:
    dec = [r for r in records if r.phase == "decode"]
    pre = [r for r in records if r.phase == "prefill"]
    return dec, pre


def _weights(records: Sequence[Record], weights: Sequence[float] | None, phase: str
             ) -> tuple[list[Record], np.ndarray | None]:
    keep = [i for i, r in enumerate(records) if r.phase == phase]
    w = None if weights is None else np.array([weights[i] for i in keep], float)
    return [records[i] for i in keep], w


def fit_prefill(records: Sequence[Record], weights: Sequence[float] | None = None,
                p0: float | None = None, per_request: bool = True,
                quadratic: bool = True) -> tuple[float, float, float, float]:
    """(p0, p1, p2, pr) of p0 + p1*sum(n) + p2*sum(n^2) + pr*requests over the prefill records
    (zeros if none). The per-request term is fitted only where the records' batch sizes differ
    (with one batch size it cannot be told from p0: then 0). ``p0`` given: kept, the other
    terms fitted to what is left of each step (validate's wall fit: the step's fixed cost is
    the decode step's, which few large prefill batches cannot tell from the per-token terms).
    ``per_request=False``: the form without pr (what the per-request term adds, measured).
    ``quadratic=False``: p2 = 0, for records that do not say how a batch's tokens split among its
    requests (the equal-size estimate of sum(n^2) would fit a p2 that the simulation, pricing
    each request's own n^2, then misapplies to batches of unequal requests)."""
    pre, w = _weights(records, weights, "prefill")
    if not pre:
        return 0.0, 0.0, 0.0, 0.0
    per_request = per_request and len({r.batch_size for r in pre}) > 1
    x = np.array([([] if p0 is not None else [1.0]) + [r.prefill_tokens]
                  + ([r.tokens_sq] if quadratic else [])
                  + ([float(r.batch_size)] if per_request else []) for r in pre])
    y = np.array([r.duration_s for r in pre])
    if p0 is not None:  # residuals (x @ w + p0 - y) / y: fit x @ w to y - p0 with y's weights
        coef = _nnls_relative(x, y - p0, w, scale_by=y)
        coef = np.concatenate([[p0], coef])
    else:
        coef = _nnls_relative(x, y, w)
    if not quadratic:
        coef = np.concatenate([coef[:2], [0.0], coef[2:]])
    f0, p1, p2 = (float(v) for v in coef[:3])
    return f0, p1, p2, float(coef[3]) if per_request else 0.0


def fit_linear(records: Sequence[Record], weights: Sequence[float] | None = None,
               ) -> tuple[float, float, float]:
    """(a, b, c) of t = a + b*B + c*K over the decode records."""
    dec, w = _weights(records, weights, "decode")
    if not dec:
        raise ValueError("no decode records to fit")
    x = np.array([[1.0, r.batch_size, r.kv_tokens] for r in dec])
    y = np.array([r.duration_s for r in dec])
    a, b, c = _nnls_relative(x, y, w)
    if a <= 0 and b <= 0:  # CostModel needs a fixed cost; tiny, so the fit is unchanged
        a = MIN_F
    return float(a), float(b), float(c)


def choose_knots(batch_sizes: Sequence[int], max_knots: int = 12) -> tuple[int, ...]:
    """Knots over B for the tables: every visited batch size when there are few, else a
    geometric grid from the smallest to the largest (dense where B is small, where the
    three-coefficient form is worst), each knot a visited size or the grid point."""
    seen = sorted(set(int(b) for b in batch_sizes))
    if not seen:
        raise ValueError("no batch sizes")
    if len(seen) <= max_knots:
        return tuple(seen)
    grid = np.geomspace(seen[0], seen[-1], max_knots)
    arr = np.array(seen)
    knots = {int(arr[np.abs(arr - g).argmin()]) for g in grid}
    return tuple(sorted(knots | {seen[0], seen[-1]}))


def _hat_weights(knots: Sequence[int], batch: int) -> np.ndarray:
    """Weights of each knot in the piecewise-linear interpolation at `batch` (clamped ends),
    the same rule `TabulatedCost` applies."""
    w = np.zeros(len(knots))
    if batch <= knots[0]:
        w[0] = 1.0
    elif batch >= knots[-1]:
        w[-1] = 1.0
    else:
        i = int(np.searchsorted(knots, batch, side="right"))  # knots[i-1] <= batch < knots[i]
        t = (batch - knots[i - 1]) / (knots[i] - knots[i - 1])
        w[i - 1], w[i] = 1.0 - t, t
    return w


def fit_tables(records: Sequence[Record], knots: Sequence[int] | None = None,
               max_knots: int = 12, weights: Sequence[float] | None = None,
               ) -> tuple[tuple[int, ...], tuple[float, ...], tuple[float, ...]]:
    """(table_b, table_f, table_g) over the decode records: f and g piecewise linear in B."""
    dec, wts = _weights(records, weights, "decode")
    if not dec:
        raise ValueError("no decode records to fit")
    kb = tuple(knots) if knots is not None else choose_knots([r.batch_size for r in dec], max_knots)
    n = len(kb)
    x = np.zeros((len(dec), 2 * n))
    for i, r in enumerate(dec):
        w = _hat_weights(kb, r.batch_size)
        x[i, :n] = w
        x[i, n:] = w * r.kv_tokens
    y = np.array([r.duration_s for r in dec])
    coef = _nnls_relative(x, y, wts)
    f = tuple(max(float(v), MIN_F) for v in coef[:n])
    g = tuple(float(v) for v in coef[n:])
    return kb, f, g


def fit_cost(records: Sequence[Record], form: str = "linear", max_knots: int = 12,
             weights: Sequence[float] | None = None) -> CostModel | TabulatedCost:
    """The cost model of `form` ("linear" or "tables") fitted to decode and prefill records
    (each weighted by `weights`, default 1)."""
    if form not in FORMS:
        raise ValueError(f"form must be one of {', '.join(FORMS)}, got {form!r}")
    p0, p1, p2, pr = fit_prefill(records, weights)
    if form == "linear":
        a, b, c = fit_linear(records, weights)
        return CostModel(a=a, b=b, c=c, p0=p0, p1=p1, p2=p2, pr=pr)
    tb, tf, tg = fit_tables(records, max_knots=max_knots, weights=weights)
    return TabulatedCost(tb, tf, tg, p0, p1, p2, pr)


def predict(cost: CostModel | TabulatedCost, record: Record) -> float:
    """The model's seconds for one record's step."""
    if record.phase == "decode":
        return cost.decode_time(record.batch_size, record.kv_tokens)
    return cost.prefill_time(record.prefill_tokens, record.tokens_sq, requests=record.batch_size)


def relative_errors(cost: CostModel | TabulatedCost, records: Sequence[Record]) -> np.ndarray:
    """(predicted - measured) / measured per record."""
    return np.array([(predict(cost, r) - r.duration_s) / r.duration_s for r in records])
