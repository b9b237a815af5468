"""Predicted (simulated) vs measured (live) figures per scheduler, and their errors.

Each scheduler's simulated and live runs see the same groups (same seed, replay mode), so they
pair step by step: the per-step rollout-time error is (predicted - measured) / measured for each
step after the warm-up, and its median and spread say how well the simulation tracks the run.
The *gain over sync* is the rollout-throughput ratio to the ``sync`` run minus one (the figure
APRIL reports); the ranking orders schedulers by rollout throughput.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from aprilsim.metrics.records import RunResult
from aprilsim.metrics.warmup import clamp_warmup

# summary key -> (label, unit); what the report compares for every scheduler
METRICS: dict[str, tuple[str, str]] = {
    "mean_rollout_time_s": ("rollout time", "s"),
    "rollout_throughput_tok_s": ("rollout throughput", "tok/s"),
    "mean_step_time_s": ("step time", "s"),
    "offpolicy_token_fraction": ("off-policy token share", ""),
    "wasted_tokens": ("wasted tokens", "tok"),
}


def rel_err(pred: float, meas: float) -> float | None:
    """(pred - meas) / meas; None when the measurement is zero (a share or count of 0)."""
    return (pred - meas) / meas if meas else None


@dataclass
class SchedulerComparison:
    """One scheduler: summaries of both runs, per-step rollout times and their errors."""

    label: str
    predicted: dict[str, Any]
    measured: dict[str, Any]
    pred_rollout_s: list[float]
    meas_rollout_s: list[float]
    warmup: int
    pred_busy_s: list[float] = field(default_factory=list)  # busiest engine's simulated busy time
    meas_logged_s: list[float] = field(default_factory=list)  # busiest engine's logged step time
    meas_priced_s: list[float] = field(default_factory=list)  # its logged steps, priced by the cost

    @property
    def step_errors(self) -> list[float]:
        """Per-step relative rollout-time errors after the warm-up."""
        pairs = list(zip(self.pred_rollout_s, self.meas_rollout_s))[self.warmup:]
        return [(p - m) / m for p, m in pairs if m > 0]

    def _errs(self, pred: list[float], meas: list[float]) -> list[float]:
        return [(p - m) / m for p, m in list(zip(pred, meas))[self.warmup:] if m > 0]

    @property
    def priced_errors(self) -> list[float]:
        """Per-step errors of the busiest engine's time, simulated vs its logged iterations priced
        by the same cost: the engine rules and the scheduler alone (load-independent)."""
        return self._errs(self.pred_busy_s, self.meas_priced_s)

    @property
    def logged_errors(self) -> list[float]:
        """Per-step errors of the busiest engine's time, simulated vs logged: adds the cost
        model's error and the machine's noise on each iteration."""
        return self._errs(self.pred_busy_s, self.meas_logged_s)

    def errors(self) -> dict[str, Any]:
        """Relative error of every compared metric, and the per-step spread."""
        out: dict[str, Any] = {k: None if self.measured.get(k) is None else  # n/a: not measured
                               rel_err(float(self.predicted[k]), float(self.measured[k]))
                               for k in METRICS}
        se = np.array(self.step_errors)
        if se.size:
            out["step_rollout_median_abs"] = float(np.median(np.abs(se)))
            out["step_rollout_median"] = float(np.median(se))
            out["step_rollout_p10"], out["step_rollout_p90"] = (
                float(x) for x in np.percentile(se, [10, 90]))
        for key, errs in (("priced", self.priced_errors), ("logged", self.logged_errors)):
            if errs:
                out[f"step_{key}_median_abs"] = float(np.median(np.abs(errs)))
                out[f"step_{key}_median"] = float(np.median(errs))
        m, r = sum(self.meas_rollout_s[self.warmup:]), sum(self.meas_logged_s[self.warmup:])
        if m > 0 and r > 0:
            out["engine_time_share"] = r / m  # share of the rollout the busiest engine stepped
        return out

    def to_dict(self) -> dict[str, Any]:
        keys = [*METRICS, "generated_tokens", "trained_tokens", "retractions", "steps"]
        return {
            "label": self.label,
            "predicted": {k: self.predicted.get(k) for k in keys},
            "measured": {k: self.measured.get(k) for k in keys},
            "errors": self.errors(),
            "per_step": {"predicted_rollout_s": self.pred_rollout_s,
                         "measured_rollout_s": self.meas_rollout_s,
                         "predicted_busy_s": self.pred_busy_s,
                         "measured_logged_s": self.meas_logged_s,
                         "measured_priced_s": self.meas_priced_s, "warmup": self.warmup},
        }


def compare_runs(label: str, sim: RunResult, live: RunResult, meas_logged_s: Sequence[float] = (),
                 meas_priced_s: Sequence[float] = ()) -> SchedulerComparison:
    """Pair a simulated and a live run of one scheduler (both with their warm-up set)."""
    n = min(len(sim.steps), len(live.steps))
    warm = clamp_warmup(live.warmup_steps, n)
    busy = [max(s.busy_by_engine_s) if s.busy_by_engine_s else s.busy_time_s for s in sim.steps[:n]]
    return SchedulerComparison(
        label=label, predicted=sim.summary(warm), measured=live.summary(warm),
        pred_rollout_s=[s.rollout_time_s for s in sim.steps[:n]],
        meas_rollout_s=[s.rollout_time_s for s in live.steps[:n]], warmup=warm,
        pred_busy_s=busy, meas_logged_s=list(meas_logged_s)[:n],
        meas_priced_s=list(meas_priced_s)[:n])


def gains(rows: Sequence[SchedulerComparison], base: str = "sync") -> dict[str, dict[str, float]]:
    """Rollout-throughput gain over ``base``, predicted and measured, and their difference in
    percentage points. Empty when ``base`` did not run."""
    ref = next((r for r in rows if r.label == base), None)
    if ref is None:
        return {}
    key = "rollout_throughput_tok_s"
    out = {}
    for r in rows:
        if r is ref:
            continue
        gp = r.predicted[key] / ref.predicted[key] - 1 if ref.predicted[key] else 0.0
        gm = r.measured[key] / ref.measured[key] - 1 if ref.measured[key] else 0.0
        out[r.label] = {"predicted": gp, "measured": gm, "diff_pp": 100 * (gp - gm)}
        pr, pb = _priced_rate(r), _priced_rate(ref)
        sr, sb = _busy_rate(r), _busy_rate(ref)
        if pr and pb and sr and sb:  # the gain in engine time: busiest-engine seconds, both sides
            out[r.label]["predicted_engine"] = sr / sb - 1
            out[r.label]["measured_priced"] = pr / pb - 1
            out[r.label]["diff_priced_pp"] = 100 * ((sr / sb - 1) - (pr / pb - 1))
    return out


def _busy_rate(r: SchedulerComparison) -> float:
    """Simulated generated tokens per simulated busiest-engine second (after the warm-up)."""
    t = sum(r.pred_busy_s[r.warmup:])
    return r.predicted["generated_tokens"] / t if t > 0 else 0.0


def _priced_rate(r: SchedulerComparison) -> float:
    """Generated tokens per priced busiest-engine second (after the warm-up)."""
    t = sum(r.meas_priced_s[r.warmup:])
    return r.measured["generated_tokens"] / t if t > 0 else 0.0


def rate(r: SchedulerComparison, side: str) -> float:
    """Tokens per second of one side: predicted, measured (rollout throughput), engine (simulated
    busiest-engine seconds) or priced (live busiest-engine iterations priced)."""
    if side == "priced":
        return _priced_rate(r)
    if side == "engine":
        return _busy_rate(r)
    return float(getattr(r, side)["rollout_throughput_tok_s"])


def ranking(rows: Sequence[SchedulerComparison], side: str) -> list[str]:
    """Labels ordered by rollout throughput, best first (``side``: predicted, measured, or
    priced: live tokens per priced busiest-engine second)."""
    return [r.label for r in sorted(rows, key=lambda r: -rate(r, side))]


def ranking_preserved(rows: Sequence[SchedulerComparison], tie: float = 0.0,
                      side: str = "measured") -> bool:
    """True when simulation and live (``side``: measured or priced) order the schedulers alike.
    Pairs whose live throughputs lie within ``tie`` (relative) of each other may swap."""
    pred = ranking(rows, "engine" if side == "priced" else "predicted")
    by = {r.label: rate(r, side) for r in rows}
    for i, a in enumerate(pred):
        for b in pred[i + 1:]:
            if by[a] < by[b] * (1 - tie):
                return False
    return True
