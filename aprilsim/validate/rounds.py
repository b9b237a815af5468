"""Model error apart from machine noise: validation runs in interleaved rounds.

The protocol (``aprilsim validate --repeats R``): the schedulers run live in rounds, A B C, A B C,
..., every round the same seed, so each round repeats the same steps; the cost is fitted on a
calibration round of its own (or given as a file) and never on the rounds it is judged by. Then:

- the **noise floor** of a scheduler: for each step after the warm-up, the spread (sample
  standard deviation over mean) of its measured rollout time across the rounds, medianed over
  the steps; the same workload run again on the same machine moves this much, so a per-step
  error near it is noise, not model error;
- the **per-step error**: every round's per-step rollout-time errors pooled (median of |err|);
- the **gain over sync**, paired within each round (APRIL's round r against sync's round r, run
  one after the other): the measured gain's mean over rounds with a 95 % t-interval, and the
  prediction's difference to it with the same interval;
- the **ranking**: preserved in how many rounds.
"""

from __future__ import annotations

from collections.abc import Sequence
from statistics import mean, median, stdev
from typing import Any

from .compare import SchedulerComparison, gains, ranking, ranking_preserved

T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
       10: 2.228, 15: 2.131, 20: 2.086, 30: 2.042}


def t95(dof: int) -> float:
    """Two-sided 95 % quantile of Student's t with ``dof`` degrees of freedom (table, rounded
    down to the nearest tabulated dof: conservative)."""
    if dof < 1:
        return float("nan")
    return T95[max(k for k in T95 if k <= dof)] if dof < 60 else 1.96


def interval(xs: Sequence[float]) -> dict[str, float | int | None]:
    """Mean, 95 % half-width (None with one value) and count."""
    xs = list(xs)
    if not xs:
        return {"mean": None, "half_width": None, "n": 0}
    hw = t95(len(xs) - 1) * stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else None
    return {"mean": mean(xs), "half_width": hw, "n": len(xs)}


def noise_floor(runs: Sequence[SchedulerComparison]) -> float | None:
    """Median over steps (after the warm-up) of the relative spread of the measured rollout time
    across repeated runs of the same steps; None with fewer than two runs."""
    if len(runs) < 2:
        return None
    warm = max(r.warmup for r in runs)
    n = min(len(r.meas_rollout_s) for r in runs)
    cvs = []
    for s in range(warm, n):
        xs = [r.meas_rollout_s[s] for r in runs]
        if min(xs) > 0:
            cvs.append(stdev(xs) / mean(xs))
    return median(cvs) if cvs else None


def pooled(rounds: Sequence[Sequence[SchedulerComparison]]) -> dict[str, Any]:
    """Per scheduler and over rounds: pooled per-step errors, noise floor, paired gains with
    intervals, rankings preserved (see the module docstring)."""
    labels = [r.label for r in rounds[0]] if rounds else []
    by = {lab: [r for rnd in rounds for r in rnd if r.label == lab] for lab in labels}
    out: dict[str, Any] = {"rounds": len(rounds), "schedulers": {}}
    for lab, runs in by.items():
        errs = [e for r in runs for e in r.step_errors]
        priced = [e for r in runs for e in r.priced_errors]
        out["schedulers"][lab] = {
            "step_rollout_median_abs": median(abs(e) for e in errs) if errs else None,
            "step_rollout_median": median(errs) if errs else None,
            "step_priced_median_abs": median(abs(e) for e in priced) if priced else None,
            "noise_floor": noise_floor(runs),
            "runs": len(runs)}
    per_round = [gains(rnd) for rnd in rounds]
    g: dict[str, Any] = {}
    for lab in labels:
        got = [pr[lab] for pr in per_round if lab in pr]
        if not got:
            continue
        g[lab] = {"predicted": got[0]["predicted"],
                  "measured": interval([x["measured"] for x in got]),
                  "diff_pp": interval([x["diff_pp"] for x in got]),
                  # the same in engine time (logged iterations priced): no machine load in it
                  "diff_priced_pp": interval([x["diff_priced_pp"] for x in got if "diff_priced_pp" in x])}
    out["gains"] = g
    out["ranking"] = {"preserved_rounds": sum(ranking_preserved(rnd, 0.02) for rnd in rounds),
                      "rounds": len(rounds),
                      "predicted": ranking(rounds[0], "predicted") if rounds else [],
                      "measured_by_round": [ranking(rnd, "measured") for rnd in rounds]}
    return out
