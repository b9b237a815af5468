"""Fit the decode/prefill cost from the bundled engine's iteration log, for validation.

One fit, calibrate's: the records are ``aprilsim.engine.calibration``'s
(``records_from_iterations``) and the coefficients come from its fitting code (``CostCalibrator``,
``fit_linear``, ``fit_prefill``): decode a + b*B + c*K, prefill p0 + p1*sum(n) + p2*sum(n^2) +
pr*requests, non-negative, where ``pr`` prices a prefill that costs per request (the bundled CPU
engine prefills its requests one by one in Python).

Two fits are made. ``cost`` is calibrate's: the steps' compute time (``duration_s``), relative
errors. ``wall`` is what the simulation runs: on a CPU engine a step is not all compute (between
two steps the engine's asyncio loop hands tokens to clients and admits requests) and the machine's
other processes stretch steps now and then (the iteration times are right-skewed: a few steps
take several times the median). So ``wall`` is fitted to the *interval* from the end of one step
to the end of the next while the engine stays busy, with absolute errors (weights (t/mean)^2 on
the relative ones), which matches the *sum* of the intervals: the rollout time is a sum of
iterations, and a relative-error fit of skewed times would predict it short. ``overhead_s`` (the
median gap between steps) is reported beside them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
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
    prefill_median_err: float  # the same of prefill steps, priced with pr
    n_decode: int
    n_prefill: int
    decode_share: float  # share of logged compute time spent in decode
    prefill_without_pr_err: float = 0.0  # prefill's median |rel. error| fitted without pr
    source: str = "aprilsim.engine.calibration.CostCalibrator"
    notes: list[str] = field(default_factory=list)
    given: bool = False  # the cost came from a file (--calibration), not fitted here

    @property
    def effective(self) -> CostModel:
        """The cost the simulation runs (``wall``)."""
        return self.wall

    def to_dict(self) -> dict[str, Any]:
        c, w = self.cost, self.wall
        return {"a": c.a, "b": c.b, "c": c.c, "p0": c.p0, "p1": c.p1, "p2": c.p2, "pr": c.pr,
                "overhead_s": self.overhead_s,
                "wall": {"a": w.a, "b": w.b, "c": w.c, "p0": w.p0, "p1": w.p1, "p2": w.p2,
                         "pr": w.pr},
                "decode_median_err": self.decode_median_err,
                "prefill_median_err": self.prefill_median_err, "n_decode": self.n_decode,
                "n_prefill": self.n_prefill, "decode_share": self.decode_share,
                "prefill_without_pr_err": self.prefill_without_pr_err,
                "source": self.source, "given": self.given}


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
    just before and nothing was retracted; else what the step holds minus one per running
    request."""
    if prev is not None and prev["seq"] == r["seq"] - 1 and not r.get("retracted"):
        return float(prev["kv_tokens"])
    return max(0.0, float(r["kv_tokens"]) - r.get("running", r["batch_size"]))


def busy_gaps(rows: Sequence[dict[str, Any]]) -> list[float]:
    """Seconds between consecutive steps beyond the step itself, while the engine stays busy."""
    gaps = []
    for p, r in zip(rows, rows[1:]):
        if r["seq"] == p["seq"] + 1:
            g = float(r["t"]) - float(p["t"]) - float(r.get("padded_s", r["duration_s"]))
            if 0 <= g < BUSY_GAP_S:
                gaps.append(g)
    return gaps


def records(rows: Sequence[dict[str, Any]], wall: bool = False) -> list:
    """calibrate's timing records of one engine's log (``Record``), each step timed by its
    compute (``duration_s``) or, ``wall``, by its interval from the previous step's end."""
    from aprilsim.engine.calibration import records_from_iterations

    if not wall:
        return records_from_iterations(list(rows))
    timed, prev = [], None
    for r in rows:
        timed.append({**r, "duration_s": interval(prev, r)} if r["duration_s"] > 0 else r)
        prev = r
    return records_from_iterations(timed)


def _median_abs(errs: np.ndarray) -> float:
    return float(np.median(np.abs(errs))) if len(errs) else 0.0


def phase_errors(cost: CostModel, recs: Sequence) -> tuple[float, float]:
    """Median |relative error| of the decode and of the prefill records priced by ``cost``."""
    from aprilsim.engine.calibration.fit import relative_errors

    dec = [r for r in recs if r.phase == "decode"]
    pre = [r for r in recs if r.phase == "prefill"]
    return (_median_abs(relative_errors(cost, dec)) if dec else 0.0,
            _median_abs(relative_errors(cost, pre)) if pre else 0.0)


def fit_compute(recs: Sequence) -> CostModel:
    """calibrate's fit of the compute times (``CostCalibrator``, robust bins, relative errors);
    where its checks refuse the records (too few distinct shapes), the same fit unchecked."""
    from aprilsim.engine.calibration import CostCalibrator
    from aprilsim.engine.calibration.fit import fit_cost

    try:
        cost = CostCalibrator(form="linear").fit(recs).cost_
    except ValueError:
        if not any(r.phase == "decode" for r in recs):
            raise ValueError("no decode iterations in the iteration log: "
                             "nothing to calibrate") from None
        cost = fit_cost(recs, "linear")
    assert isinstance(cost, CostModel)
    return cost


def fit_wall(recs: Sequence) -> CostModel:
    """The wall fit: calibrate's decode and prefill fits with absolute errors (weights
    (t/mean t)^2), the prefill's fixed cost p0 held at the decode step's a: a few large prefill
    batches (one per rollout) cannot tell p0 from the per-token and per-request terms, and a
    large p0 would overprice the small prefills of resumed samples. The quadratic term p2 is
    fitted only where the records give each batch's sum of squared request sizes: iteration logs
    and rebuilt streams give a batch's tokens only, whose equal-size estimate of sum(n^2) is far
    below the truth for a batch mixing resumed and new requests, so the simulation would charge
    p2 on its exact sums at a rate fitted to the estimates."""
    from aprilsim.engine.calibration.fit import fit_linear, fit_prefill

    if not any(r.phase == "decode" for r in recs):
        raise ValueError("no decode iterations in the iteration log: nothing to calibrate")
    t = np.array([r.duration_s for r in recs])
    w = list((t / t.mean()) ** 2)
    a, b, c = fit_linear(recs, w)
    exact_sq = all(r.prefill_tokens_sq is not None for r in recs if r.phase == "prefill")
    p0, p1, p2, pr = fit_prefill(recs, w, p0=a, quadratic=exact_sq)
    return CostModel(a=a, b=b, c=c, p0=p0, p1=p1, p2=p2, pr=pr)


def fit_iterations(logs: Sequence[Sequence[dict[str, Any]]]) -> CostFit:
    """Fit the cost of the engines whose iteration logs (one list of dicts per engine) are given."""
    from aprilsim.engine.calibration.fit import fit_prefill

    recs = [r for rows in logs for r in records(rows)]
    cost = fit_compute(recs)
    dec_err, pre_err = phase_errors(cost, recs)
    wall_cost = fit_wall([r for rows in logs for r in records(rows, wall=True)])
    p0, p1, p2, _ = fit_prefill(recs, per_request=False)
    _, pre_no_pr = phase_errors(replace(cost, p0=p0, p1=p1, p2=p2, pr=0.0), recs)
    gaps = [g for rows in logs for g in busy_gaps(rows)]
    all_rows = [r for rows in logs for r in rows]
    t_dec = sum(r["duration_s"] for r in all_rows if r["phase"] == "decode")
    t_all = sum(r["duration_s"] for r in all_rows if r["phase"] in ("decode", "prefill"))
    return CostFit(
        cost=cost, wall=wall_cost, overhead_s=median(gaps) if gaps else 0.0,
        decode_median_err=dec_err, prefill_median_err=pre_err,
        n_decode=sum(r.phase == "decode" for r in recs),
        n_prefill=sum(r.phase == "prefill" for r in recs),
        decode_share=t_dec / t_all if t_all else 0.0, prefill_without_pr_err=pre_no_pr)


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


def cost_errors(cost: CostModel, logs: Sequence[Sequence[dict[str, Any]]]
                ) -> tuple[float, float, int, int]:
    """(decode, prefill median |relative error|, decode and prefill steps) of a given cost (a
    calibration file) against the live runs' step intervals: how well the cost the simulation
    runs fits what the engines did this time."""
    recs = [r for rows in logs for r in records(rows, wall=True)]
    de, pe = phase_errors(cost, recs)
    return de, pe, sum(r.phase == "decode" for r in recs), sum(r.phase == "prefill" for r in recs)
