"""Where a rollout-time error comes from: an exact split of each step's error into three terms.

Per step after the warm-up, with M the live rollout time, S the simulated one, B the simulated
busiest engine's busy time, P the live busiest engine's iterations priced by the simulation's
cost (pricing.per_step with the cost) and L the same iterations' measured intervals:

    S - M = (B - P) + (P - L) + ((S - B) - (M - L))

- ``rules``: the same cost, other iterations: the scheduler's decisions and the engine's rules
  (admission, batching, aborts) differ between the simulation and the engines;
- ``cost``: the same iterations, other times: what the cost model charges for the live
  iterations against what they took on this machine (engine time vs wall time of the steps);
- ``outside``: time no step of the busiest engine covers, simulated vs live: the runner
  submitting and crediting requests, the event loop, other processes, the trainer stand-in.

Each term divided by M sums to the step's relative error; the term with the largest median
|share| is the measured cause of a missed step-error target. Where the decisions themselves
differ (:mod:`aprilsim.validate.decisions`), that is named first: the cost is then not to blame.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from statistics import median
from typing import Any

from .compare import SchedulerComparison

TERMS: dict[str, str] = {
    "rules": "engine rules and scheduler (the same cost, other iterations)",
    "cost": "cost per iteration (the same iterations, priced vs the time they took)",
    "outside": "time outside the busiest engine's steps (runner, event loop, other processes)",
}


def step_terms(r: SchedulerComparison) -> dict[str, list[float]] | None:
    """Per step after the warm-up, each term's share of the measured rollout time (they sum to
    the step's relative error); None where the live run has no priced and logged iterations."""
    n = len(r.meas_rollout_s)
    have = [len(x) >= n for x in (r.pred_busy_s, r.meas_priced_s, r.meas_logged_s)]
    if not n or not all(have) or not any(r.meas_logged_s):
        return None
    out: dict[str, list[float]] = {k: [] for k in TERMS}
    for s in range(r.warmup, n):
        m = r.meas_rollout_s[s]
        if m <= 0:
            continue
        b, p, lg = r.pred_busy_s[s], r.meas_priced_s[s], r.meas_logged_s[s]
        out["rules"].append((b - p) / m)
        out["cost"].append((p - lg) / m)
        out["outside"].append(((r.pred_rollout_s[s] - b) - (m - lg)) / m)
    return out if out["rules"] else None


def pooled_terms(runs: Sequence[SchedulerComparison]) -> dict[str, dict[str, float]] | None:
    """Each term over every step of ``runs`` (a scheduler's rounds): median |share| and median
    share (its bias); None where no run has the iterations to split."""
    got = [t for t in (step_terms(r) for r in runs) if t is not None]
    if not got:
        return None
    out = {}
    for k in TERMS:
        xs = [x for t in got for x in t[k]]
        out[k] = {"median_abs": median(abs(x) for x in xs), "median": median(xs), "steps": len(xs)}
    return out


def cause_text(terms: Mapping[str, Mapping[str, float]] | None,
               decisions: Mapping[str, Any] | None = None) -> str | None:
    """The measured cause in words: decisions that differ (from the step where they start), else
    the term with the largest median |share|, with the others beside it; None when unmeasured."""
    if decisions and decisions.get("first_mismatch") is not None:
        fm = decisions["first_mismatch"]
        spread = decisions.get("admission_spread_s")
        seen = (f"; live, the requests sent together at a step's start got their first token "
                f"over {1e3 * spread:.0f} ms (median), which the simulation, delivering them "
                "together, does not have" if spread else "")
        return (f"the decisions differ from step {fm['step']} ({fm['what']}): a decision "
                f"mismatch, not the cost{seen}")
    if not terms:
        return None
    top = max(terms, key=lambda k: terms[k]["median_abs"])
    rest = ", ".join(f"{k} {100 * terms[k]['median']:+.1f}%" for k in terms if k != top)
    return (f"{TERMS[top]}: {100 * terms[top]['median']:+.1f}% of the live rollout per step "
            f"(median; others: {rest})")


def gain_cause(a: Mapping[str, Mapping[str, float]] | None,
               base: Mapping[str, Mapping[str, float]] | None,
               decisions: Mapping[str, Any] | None = None) -> str | None:
    """Why a gain over sync is off: the scheduler's and sync's errors do not cancel; the term
    whose median share differs most between the two, or the scheduler's decision mismatch."""
    if decisions and decisions.get("first_mismatch") is not None:
        return cause_text(None, decisions)
    if not a or not base:
        return None
    diff = {k: a[k]["median"] - base[k]["median"] for k in TERMS}
    top = max(diff, key=lambda k: abs(diff[k]))
    return (f"its error and sync's do not cancel in {TERMS[top]} ({100 * a[top]['median']:+.1f}% "
            f"vs {100 * base[top]['median']:+.1f}% of the rollout)")
