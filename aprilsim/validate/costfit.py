"""Fit the decode/prefill cost from the bundled engine's iteration log, for validation.

The seam to ``aprilsim calibrate``: :func:`fit_iterations` uses
``aprilsim.engine.calibration`` (``records_from_iterations`` + ``CostCalibrator``) when it is
installed, and otherwise a small in-house fit of the same form (relative-error weighted,
non-negative least squares of decode a + b*B + c*K and prefill p0 + p1*sum(n)).

Two fits are made. ``cost`` is calibrate's: the steps' compute time (``duration_s``), relative
errors. ``wall`` is what the simulation runs: on a CPU engine a step is not all compute (between
two steps the engine's asyncio loop hands tokens to clients and admits requests) and the machine's
other processes stretch steps now and then (the iteration times are right-skewed: a few steps
take several times the median). So ``wall`` is fitted to the *interval* from the end of one step
to the end of the next while the engine stays busy, by ordinary (absolute) non-negative least
squares, which matches the *sum* of the intervals: the rollout time is a sum of iterations, and a
relative-error fit of skewed times would predict it short. ``overhead_s`` (the median gap between
steps) is reported beside them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Any

import numpy as np

from aprilsim.engine.cost import CostModel

BUSY_GAP_S = 0.05  # a longer gap between two steps means the engine sat idle


@dataclass(frozen=True)
class CostFit:
    """A fitted cost, the runner overhead per step added to it, and how well it fits."""

    cost: CostModel  # compute only, as fitted (relative errors)
    wall: CostModel  # step-end-to-step-end intervals while busy (absolute errors): what sim runs
    overhead_s: float  # median gap between consecutive busy steps
    decode_median_err: float  # median |relative error| of decode iterations (compute)
    prefill_median_err: float
    n_decode: int
    n_prefill: int
    decode_share: float  # share of logged compute time spent in decode
    prefill_by_request_err: float = 0.0  # median |rel. error| of prefill = q0 + q1 * requests
    prefill_by_token_err: float = 0.0  # the same for q0 + q1 * tokens (the cost model's form)
    source: str = "in-house NNLS"
    notes: list[str] = field(default_factory=list)

    @property
    def effective(self) -> CostModel:
        """The cost the simulation runs (``wall``)."""
        return self.wall

    def to_dict(self) -> dict[str, Any]:
        c, w = self.cost, self.wall
        return {"a": c.a, "b": c.b, "c": c.c, "p0": c.p0, "p1": c.p1, "p2": c.p2,
                "overhead_s": self.overhead_s,
                "wall": {"a": w.a, "b": w.b, "c": w.c, "p0": w.p0, "p1": w.p1, "p2": w.p2},
                "decode_median_err": self.decode_median_err,
                "prefill_median_err": self.prefill_median_err, "n_decode": self.n_decode,
                "n_prefill": self.n_prefill, "decode_share": self.decode_share,
                "prefill_by_request_err": self.prefill_by_request_err,
                "prefill_by_token_err": self.prefill_by_token_err,
                "source": self.source}


def interval(prev: dict[str, Any] | None, r: dict[str, Any]) -> float:
    """Wall seconds the step took from the end of the previous one, where the engine went on
    at once (consecutive seq, gap under BUSY_GAP_S); otherwise its own duration."""
    own = float(r.get("padded_s", r["duration_s"]))
    if prev is not None and prev["seq"] == r["seq"] - 1:
        gap = float(r["t"]) - float(prev["t"]) - own
        if 0 <= gap < BUSY_GAP_S:
            return own + gap
    return own


def kv_at_start(prev: dict[str, Any] | None, r: dict[str, Any]) -> float:
    """KV tokens held when a decode step began: the previous step's count where it is the one
    just before and nothing was retracted; else what the step holds minus one per running request."""
    if prev is not None and prev["seq"] == r["seq"] - 1 and not r.get("retracted"):
        return float(prev["kv_tokens"])
    return max(0.0, float(r["kv_tokens"]) - r.get("running", r["batch_size"]))


def decode_points(rows: Sequence[dict[str, Any]], wall: bool = False) -> list[tuple[int, float, float]]:
    """(B, KV at the start, seconds) of each decode step of one engine's log, in seq order
    (seconds: compute, or the step's wall interval when ``wall``)."""
    out: list[tuple[int, float, float]] = []
    prev: dict[str, Any] | None = None
    for r in rows:
        if r["phase"] == "decode" and r["batch_size"] >= 1 and r["duration_s"] > 0:
            t = interval(prev, r) if wall else float(r["duration_s"])
            out.append((int(r["batch_size"]), kv_at_start(prev, r), t))
        prev = r
    return out


def prefill_points(rows: Sequence[dict[str, Any]], wall: bool = False) -> list[tuple[int, float]]:
    """(input tokens, seconds) of each prefill step."""
    out: list[tuple[int, float]] = []
    prev: dict[str, Any] | None = None
    for r in rows:
        if r["phase"] == "prefill" and r["prefill_tokens"] >= 1 and r["duration_s"] > 0:
            out.append((int(r["prefill_tokens"]), interval(prev, r) if wall else float(r["duration_s"])))
        prev = r
    return out


def busy_gaps(rows: Sequence[dict[str, Any]]) -> list[float]:
    """Seconds between consecutive steps beyond the step itself, while the engine stays busy."""
    gaps = []
    for p, r in zip(rows, rows[1:]):
        if r["seq"] == p["seq"] + 1:
            g = float(r["t"]) - float(p["t"]) - float(r.get("padded_s", r["duration_s"]))
            if 0 <= g < BUSY_GAP_S:
                gaps.append(g)
    return gaps


def _nnls(x: np.ndarray, y: np.ndarray, relative: bool = True) -> np.ndarray:
    """Non-negative least squares: of relative errors, sum(((x @ p) / y - 1)^2), or of
    absolute ones, sum((x @ p - y)^2) (which matches sum(x @ p) to sum(y))."""
    w = 1.0 / y if relative else np.full_like(y, 1.0 / float(np.mean(y)))
    scale = np.maximum(np.abs(x).max(axis=0), 1e-12)  # columns of comparable size
    from scipy.optimize import nnls  # on first use: the CLI starts without scipy

    p, _ = nnls(x * w[:, None] / scale, y * w)
    return p / scale


def _median_abs_rel(pred: np.ndarray, y: np.ndarray) -> float:
    return float(np.median(np.abs(pred / y - 1))) if len(y) else 0.0


def fit_in_house(logs: Sequence[Sequence[dict[str, Any]]], wall: bool = False) -> tuple[CostModel, float, float]:
    """The in-house fit over several engines' logs: (cost, decode error, prefill error).
    ``wall``: fit step intervals by absolute errors; else compute times by relative errors."""
    dec = [p for rows in logs for p in decode_points(rows, wall)]
    pre = [p for rows in logs for p in prefill_points(rows, wall)]
    if not dec:
        raise ValueError("no decode iterations in the iteration log: nothing to calibrate")
    xd = np.array([[1.0, b, k] for b, k, _ in dec])
    yd = np.array([t for *_, t in dec])
    a, b, c = _nnls(xd, yd, relative=not wall)
    dec_err = _median_abs_rel(xd @ np.array([a, b, c]), yd)
    p0 = p1 = 0.0
    pre_err = 0.0
    if pre:
        xp = np.array([[1.0, n] for n, _ in pre])
        yp = np.array([t for _, t in pre])
        if wall:
            # p0 is the step's fixed cost, the same loop as a decode step's: a few large prefill
            # batches (one per rollout) cannot tell p0 from p1, and a large p0 would overprice
            # the small prefills of resumed samples
            p0 = float(a)
            p1 = max(0.0, float(np.sum((yp - p0) * xp[:, 1]) / np.sum(xp[:, 1] ** 2)))
        else:
            p0, p1 = _nnls(xp, yp, relative=True)
        pre_err = _median_abs_rel(xp @ np.array([p0, p1]), yp)
    a = max(float(a), 1e-9) if b <= 0 else float(a)  # a cost needs a or b above zero
    return CostModel(a=a, b=float(b), c=float(c), p0=float(p0), p1=float(p1), p2=0.0), dec_err, pre_err


def prefill_form_errors(logs: Sequence[Sequence[dict[str, Any]]]) -> tuple[float, float]:
    """Median |relative error| of a prefill step's wall interval fitted as q0 + q1 * requests,
    and as q0 + q1 * tokens: which one the engine's prefill follows. The cost model has only the
    token form; a CPU engine whose prefill costs per request (Python per sequence) follows the
    other, and then resumed samples (long inputs) and fresh ones (short prompts) cannot both be
    priced right."""
    pts = []
    for rows in logs:
        prev = None
        for r in rows:
            if r["phase"] == "prefill" and r["prefill_tokens"] >= 1 and r["duration_s"] > 0:
                pts.append((int(r["batch_size"]), int(r["prefill_tokens"]), interval(prev, r)))
            prev = r
    if len(pts) < 3:
        return 0.0, 0.0
    y = np.array([t for *_, t in pts])
    errs = []
    for col in (0, 1):
        x = np.array([[1.0, p[col]] for p in pts])
        q = _nnls(x, y, relative=True)
        errs.append(_median_abs_rel(x @ q, y))
    return errs[0], errs[1]


def fit_iterations(logs: Sequence[Sequence[dict[str, Any]]]) -> CostFit:
    """Fit the cost of the engines whose iteration logs (one list of dicts per engine) are given."""
    cost, dec_err, pre_err = fit_in_house(logs)
    source = "in-house NNLS (aprilsim.validate.costfit)"
    try:  # calibrate's estimator, where it is installed (same form, same weighting)
        from aprilsim.engine.calibration import CostCalibrator, records_from_iterations
    except ImportError:
        pass
    else:
        recs = [r for rows in logs for r in records_from_iterations(list(rows))]
        try:
            cal = CostCalibrator(form="linear").fit(recs)
        except ValueError:  # too few distinct shapes for calibrate's checks: the in-house fit
            cal = None
        if cal is not None and isinstance(cal.cost_, CostModel):
            cost, source = cal.cost_, "aprilsim.engine.calibration.CostCalibrator"
    wall_cost, *_ = fit_in_house(logs, wall=True)
    by_req, by_tok = prefill_form_errors(logs)
    gaps = [g for rows in logs for g in busy_gaps(rows)]
    all_rows = [r for rows in logs for r in rows]
    t_dec = sum(r["duration_s"] for r in all_rows if r["phase"] == "decode")
    t_all = sum(r["duration_s"] for r in all_rows if r["phase"] in ("decode", "prefill"))
    return CostFit(
        cost=cost, wall=wall_cost, overhead_s=median(gaps) if gaps else 0.0, decode_median_err=dec_err,
        prefill_median_err=pre_err,
        n_decode=sum(len(decode_points(rows)) for rows in logs),
        n_prefill=sum(len(prefill_points(rows)) for rows in logs),
        decode_share=t_dec / t_all if t_all else 0.0, prefill_by_request_err=by_req,
        prefill_by_token_err=by_tok, source=source)


def load_calibration(path: str) -> CostModel:
    """A calibration file: TOML with a ``[cost]`` table (``a, b, c, p0, p1[, p2]``), as
    ``aprilsim calibrate`` writes it."""
    import tomllib

    with open(path, "rb") as fh:
        data = tomllib.load(fh)
    cost = data.get("cost", data)
    try:
        return CostModel(a=float(cost["a"]), b=float(cost["b"]), c=float(cost["c"]),
                         p0=float(cost.get("p0", 0.0)), p1=float(cost.get("p1", 0.0)),
                         p2=float(cost.get("p2", 0.0)), pr=float(cost.get("pr", 0.0)))
    except KeyError as e:
        raise ValueError(f"{path}: [cost] lacks {e.args[0]} (need a, b, c, p0, p1)") from None


def load_client_overhead(path: str) -> float:
    """A calibration file's ``client_overhead_s`` (seconds from a client's send to its engine;
    ``aprilsim calibrate`` fits it from live timings), 0 where the file has none."""
    import tomllib

    with open(path, "rb") as fh:
        value = tomllib.load(fh).get("client_overhead_s", 0.0)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < 60:
        raise ValueError(f"{path}: client_overhead_s must be a number of seconds in [0, 60)")
    return float(value)


def cost_errors(cost: CostModel, logs: Sequence[Sequence[dict[str, Any]]]) -> tuple[float, float, int, int]:
    """(decode, prefill median |relative error|, decode and prefill steps) of a given cost (a
    calibration file) against the live runs' step intervals: how well the cost the simulation
    runs fits what the engines did this time."""
    dec = [p for rows in logs for p in decode_points(rows, wall=True)]
    pre = [p for rows in logs for p in prefill_points(rows, wall=True)]
    de = float(np.median([abs(cost.decode_time(b, k) / t - 1) for b, k, t in dec])) if dec else 0.0
    pe = float(np.median([abs(cost.prefill_time(n) / t - 1) for n, t in pre])) if pre else 0.0
    return de, pe, len(dec), len(pre)
