"""Model error apart from machine noise: validation runs in interleaved rounds.

The protocol (``aprilsim validate --repeats R``): the schedulers run live in rounds, A B C, A B C,
..., every round the same seed, so each round repeats the same steps; the cost is fitted on a
calibration round of its own (or given as a file) and never on the rounds it is judged by. Then:

- the **noise floor** of a scheduler: for each step after the warm-up, the spread (sample
  standard deviation over mean) of its measured rollout time across the rounds, medianed over
  the steps; the same workload run again on the same machine moves this much, so a per-step
  error near it is noise, not model error;
- the **per-step error against the mean of the repeats**: each step's prediction against the
  mean of that step's R measured rollout times, median of |err| over the steps: the machine's
  noise in it shrinks as 1/sqrt(R), so it is printed beside the **noise floor of that mean**,
  twice: the floor above divided by sqrt(R), and measured by splitting the rounds into two halves
  (odd and even) whose means differ by noise alone (root mean square of their relative difference
  over the steps, scaled to the spread of the mean of all R);
- the **single-run per-step error**: every round's per-step rollout-time errors pooled (median of
  |err|), as before;
- the **gain over sync**, paired within each round (APRIL's round r against sync's round r, run
  one after the other): the measured gain's mean over rounds with a 95 % t-interval, and the
  prediction's difference to it with the same interval;
- the **ranking**: preserved in how many rounds.
"""

from __future__ import annotations

from collections.abc import Sequence
from statistics import mean, median, stdev
from typing import Any

from .causes import pooled_terms
from .compare import SchedulerComparison, gains, ranking, ranking_preserved, rate

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


def noise_floor(runs: Sequence[SchedulerComparison], what: str = "meas_rollout_s") -> float | None:
    """Median over steps (after the warm-up) of the relative spread of the measured rollout time
    (``what="meas_priced_s"``: of the logged iterations priced, the work itself) across repeated
    runs of the same steps; None with fewer than two runs."""
    if len(runs) < 2 or not all(getattr(r, what) for r in runs):
        return None
    warm = max(r.warmup for r in runs)
    n = min(len(getattr(r, what)) for r in runs)
    cvs = []
    for s in range(warm, n):
        xs = [getattr(r, what)[s] for r in runs]
        if min(xs) > 0:
            cvs.append(stdev(xs) / mean(xs))
    return median(cvs) if cvs else None


def _steps(runs: Sequence[SchedulerComparison]) -> range:
    """The steps after the warm-up that every run has."""
    return range(max(r.warmup for r in runs), min(len(r.meas_rollout_s) for r in runs))


def errors_vs_mean(pred: Sequence[Sequence[float]], meas: Sequence[Sequence[float]],
                   steps: Sequence[int]) -> list[float]:
    """Per step, (mean predicted - mean measured) / mean measured over the repeats (each list one
    repeat's per-step values); steps whose measured mean is not positive are left out."""
    out = []
    for s in steps:
        m = mean(x[s] for x in meas)
        if m > 0:
            out.append(mean(x[s] for x in pred) / m - 1)
    return out


def floor_of_mean(runs: Sequence[SchedulerComparison]) -> float | None:
    """The noise floor (relative spread of one run) divided by sqrt(R): the spread of the mean of
    R repeated runs of the same steps; None with fewer than two runs."""
    nf = noise_floor(runs)
    return None if nf is None else nf / len(runs) ** 0.5


def split_half_floor(meas: Sequence[Sequence[float]], steps: Sequence[int]) -> float | None:
    """The spread of the mean of R repeats, measured: the repeats split into two halves (even and
    odd positions), each step's relative difference of the halves' means d = (mean_A - mean_B) /
    mean; its variance is var * (1/n_A + 1/n_B), the mean of all R has var / R, so the root mean
    square of d over the steps times 1 / sqrt(R * (1/n_A + 1/n_B)). None with fewer than two
    repeats or no step."""
    if len(meas) < 2:
        return None
    a, b = meas[0::2], meas[1::2]
    ds = []
    for s in steps:
        m = mean(x[s] for x in meas)
        if m > 0:
            ds.append((mean(x[s] for x in a) - mean(x[s] for x in b)) / m)
    if not ds:
        return None
    rms = (sum(d * d for d in ds) / len(ds)) ** 0.5
    return rms / (len(meas) * (1 / len(a) + 1 / len(b))) ** 0.5


def pooled(rounds: Sequence[Sequence[SchedulerComparison]]) -> dict[str, Any]:
    """Per scheduler and over rounds: pooled per-step errors, noise floor, paired gains with
    intervals, rankings preserved (see the module docstring)."""
    labels = [r.label for r in rounds[0]] if rounds else []
    by = {lab: [r for rnd in rounds for r in rnd if r.label == lab] for lab in labels}
    out: dict[str, Any] = {"rounds": len(rounds), "schedulers": {}}
    for lab, runs in by.items():
        errs = [e for r in runs for e in r.step_errors]
        priced = [e for r in runs for e in r.priced_errors]
        steps = _steps(runs)
        meas = [r.meas_rollout_s for r in runs]
        vs_mean = errors_vs_mean([r.pred_rollout_s for r in runs], meas, steps)
        have_priced = all(r.meas_priced_s and r.pred_busy_s for r in runs)
        priced_vs_mean = (errors_vs_mean([r.pred_busy_s for r in runs],
                                         [r.meas_priced_s for r in runs], steps)
                          if have_priced else [])
        out["schedulers"][lab] = {
            "step_rollout_median_abs": median(abs(e) for e in errs) if errs else None,
            "step_rollout_median": median(errs) if errs else None,
            "step_priced_median_abs": median(abs(e) for e in priced) if priced else None,
            "noise_floor": noise_floor(runs),
            "step_rollout_vs_mean_median_abs": median(abs(e) for e in vs_mean) if vs_mean else None,
            "step_rollout_vs_mean_median": median(vs_mean) if vs_mean else None,
            "step_priced_vs_mean_median_abs": (median(abs(e) for e in priced_vs_mean)
                                               if priced_vs_mean else None),
            # how much the work itself (not its speed) moves from round to round: a scheduler
            # whose stop follows the timing (APRIL) does different work each time
            "priced_noise_floor": noise_floor(runs, "meas_priced_s") if have_priced else None,
            "noise_floor_of_mean": floor_of_mean(runs),
            "noise_floor_of_mean_split_half": split_half_floor(meas, steps),
            "terms": pooled_terms(runs),
            "runs": len(runs)}
        pf = out["schedulers"][lab]["priced_noise_floor"]
        out["schedulers"][lab]["priced_noise_floor_of_mean"] = (
            None if pf is None else pf / len(runs) ** 0.5)
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
                  "diff_priced_pp": interval([x["diff_priced_pp"] for x in got
                                              if "diff_priced_pp" in x])}
    out["gains"] = g
    out["ranking"] = {"preserved_rounds": sum(ranking_preserved(rnd, 0.02) for rnd in rounds),
                      "rounds": len(rounds),
                      "predicted": ranking(rounds[0], "predicted") if rounds else [],
                      "measured_by_round": [ranking(rnd, "measured") for rnd in rounds],
                      "pairs": rank_pairs(rounds, "predicted", "measured"),
                      "priced_pairs": rank_pairs(rounds, "engine", "priced")}
    return out


def rank_pairs(rounds: Sequence[Sequence[SchedulerComparison]], order: str,
               side: str) -> list[dict[str, Any]]:
    """Each pair of schedulers next to each other in the ``order`` side's ranking (of the first
    round), with the ``side`` rate ratio ``a / b - 1`` over the rounds (mean, 95 % half-width);
    empty with one scheduler or where a round lacks the side's figures (no priced iterations)."""
    if not rounds or len(rounds[0]) < 2:
        return []
    if side == "priced" and not all(r.meas_priced_s for rnd in rounds for r in rnd):
        return []
    names = ranking(rounds[0], order)
    out = []
    for a, b in zip(names, names[1:]):
        ratios = []
        for rnd in rounds:
            by = {r.label: rate(r, side) for r in rnd}
            if by.get(a) and by.get(b):
                ratios.append(by[a] / by[b] - 1)
        if ratios:
            out.append({"a": a, "b": b, **interval(ratios)})
    return out
