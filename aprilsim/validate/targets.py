"""The validation targets (issue 19) and their three-state verdicts (issue 35).

Targets: median per-step rollout-time error <= 10 % (wall clock) and the busiest engine's priced
engine time <= 5 %, every gain over sync within 3 pp (wall clock and priced), the scheduler
ranking preserved (both). Every figure is pooled over the rounds judged (starved rounds left
out by the caller); each target gets a verdict, met / missed / undecided with its reason
(:mod:`aprilsim.validate.verdict`), per scheduler and over all; a missed one names its measured
cause (:mod:`aprilsim.validate.causes`). ``met`` stays beside it: True met, False missed, None
undecided or not measured.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .causes import cause_text, gain_cause, pooled_terms
from .compare import SchedulerComparison, gains, ranking
from .rounds import rank_pairs
from .verdict import (
    Verdict,
    agreement_verdict,
    combined,
    error_verdict,
    interval_verdict,
    ranking_verdict,
)

TARGET_STEP_ERR = 0.10  # wall-clock per-step rollout time
TARGET_PRICED_ERR = 0.05  # engine time of the live iterations, priced
TARGET_GAIN_PP = 3.0
RANK_TIE = 0.02  # measured throughputs within 2 % of each other may swap places
TARGET_DECISIONS = 0.95  # steps whose decisions agree, live vs simulated (issue 35)


def _worst(xs) -> float | None:
    """The largest of the measured values; None when nothing was measured."""
    vals = [x for x in xs if x is not None]
    return max(vals) if vals else None


def _floor(*xs: float | None) -> float | None:
    """The larger of the floor estimates given (the conservative one); None when none is."""
    got = [x for x in xs if x is not None]
    return max(got) if got else None


def _judged(target: dict[str, Any], by: Mapping[str, Verdict | None]) -> dict[str, Any]:
    """``target`` with its per-scheduler and overall verdicts (and the ``met`` flag) filled in."""
    v = combined(by)
    target["by_scheduler_verdict"] = {k: x.to_dict() for k, x in by.items() if x is not None}
    target["verdict"] = None if v is None else v.state
    target["reason"] = "not measured" if v is None else v.reason
    target["met"] = None if v is None else v.met
    return target


def _priced_cause(decisions: Mapping[str, Any] | None) -> str:
    return cause_text(None, decisions) or ("the same decisions, other iterations (the engine's "
                                           "admission, batching or aborts)")


class _Figures:
    """The per-scheduler figures the targets judge: pooled over rounds, or one run's."""

    def __init__(self, rows: Sequence[SchedulerComparison], pool: dict[str, Any] | None) -> None:
        self.rounds = pool.get("rounds", 0) if pool else 1
        self.rows = rows
        if pool is not None and self.rounds >= 1:
            ps = pool["schedulers"]
            many = self.rounds >= 2
            self.single = {lab: v["step_rollout_median_abs"] for lab, v in ps.items()}
            self.single_noise = {lab: v["noise_floor"] for lab, v in ps.items()}
            key = "step_rollout_vs_mean_median_abs" if many else "step_rollout_median_abs"
            self.errs = {lab: v.get(key) for lab, v in ps.items()}
            self.noise = {lab: v.get("noise_floor_of_mean") if many else None
                          for lab, v in ps.items()}
            self.floor = {lab: _floor(v.get("noise_floor_of_mean"),
                                      v.get("noise_floor_of_mean_split_half")) if many else None
                          for lab, v in ps.items()}
            pk = "step_priced_vs_mean_median_abs" if many else "step_priced_median_abs"
            self.priced = {lab: v.get(pk) for lab, v in ps.items()}
            self.priced_floor = {lab: v.get("priced_noise_floor_of_mean") if many else None
                                 for lab, v in ps.items()}
            self.terms = {lab: v.get("terms") for lab, v in ps.items()}
            self.gain = {lab: {"predicted": v["predicted"], "measured": v["measured"]["mean"],
                               "diff_pp": v["diff_pp"]["mean"],
                               "diff_pp_half_width": v["diff_pp"]["half_width"],
                               "measured_half_width": v["measured"]["half_width"],
                               "rounds": v["diff_pp"]["n"], "priced": v.get("diff_priced_pp")}
                         for lab, v in pool["gains"].items()}
            rk = pool["ranking"]
            self.rank = rk
            self.pairs, self.priced_pairs = rk.get("pairs", []), rk.get("priced_pairs", [])
            self.measured_order = rk["measured_by_round"][0] if rk["measured_by_round"] else []
        else:
            self._one_run(rows)

    def _one_run(self, rows: Sequence[SchedulerComparison]) -> None:
        self.errs = {r.label: r.errors().get("step_rollout_median_abs") for r in rows}
        self.single, self.single_noise = {}, {}
        self.noise = {r.label: None for r in rows}
        self.floor = dict(self.noise)
        self.priced = {r.label: r.errors().get("step_priced_median_abs") for r in rows}
        self.priced_floor = dict(self.noise)
        self.terms = {r.label: pooled_terms([r]) for r in rows}
        self.gain = {lab: {**g, "diff_pp_half_width": None, "rounds": 1,
                           "priced": None if "diff_priced_pp" not in g else
                           {"mean": g["diff_priced_pp"], "half_width": None, "n": 1}}
                     for lab, g in gains(rows).items()}
        self.rank = {"preserved_rounds": None, "rounds": 1}
        self.pairs = rank_pairs([rows], "predicted", "measured")
        self.priced_pairs = rank_pairs([rows], "engine", "priced")
        self.measured_order = ranking(rows, "measured")


def targets(rows: Sequence[SchedulerComparison], pool: dict[str, Any] | None = None,
            decisions: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """Each target: the figure measured against it, the noise beside it, and its verdict.
    ``pool``: :func:`aprilsim.validate.rounds.pooled` over the rounds judged (R >= 2: the step
    error is the prediction's against the rounds' mean, beside that mean's noise floor; the gains
    are the paired means with their intervals); without it, one run's figures, which decide
    nothing beyond what a point value can. ``decisions``: per scheduler, its pooled decision
    agreement (a mismatch is named as the cause before any cost term)."""
    f, dec = _Figures(rows, pool), decisions or {}
    step = {"bound": TARGET_STEP_ERR, "worst": _worst(f.errs.values()), "by_scheduler": f.errs,
            "noise_floor": f.noise, "floor_judged": f.floor, "single_run": f.single,
            "single_run_noise_floor": f.single_noise,
            "against": "mean of the rounds" if f.rounds >= 2 else "each run"}
    _judged(step, {lab: error_verdict(e, f.floor.get(lab), TARGET_STEP_ERR,
                                      cause_text(f.terms.get(lab), dec.get(lab)))
                   for lab, e in f.errs.items()})
    priced = {"bound": TARGET_PRICED_ERR, "worst": _worst(f.priced.values()),
              "by_scheduler": f.priced, "noise_floor": f.priced_floor}
    _judged(priced, {lab: error_verdict(e, f.priced_floor.get(lab), TARGET_PRICED_ERR,
                                        _priced_cause(dec.get(lab)))
                     for lab, e in f.priced.items()})
    gain = {"bound": TARGET_GAIN_PP,
            "by_scheduler": {k: {x: y for x, y in g.items() if x != "priced"}
                             for k, g in f.gain.items()},
            "worst": _worst(abs(g["diff_pp"]) for g in f.gain.values()
                            if g.get("diff_pp") is not None)}
    _judged(gain, {lab: interval_verdict(g["diff_pp"], g["diff_pp_half_width"], TARGET_GAIN_PP,
                                         cause=gain_cause(f.terms.get(lab), f.terms.get("sync"),
                                                          dec.get(lab)))
                   for lab, g in f.gain.items()})
    gp = {lab: g["priced"] for lab, g in f.gain.items() if g.get("priced") and g["priced"]["n"]}
    gprice = {"bound": TARGET_GAIN_PP, "by_scheduler": gp,
              "worst": _worst(abs(x["mean"]) for x in gp.values() if x["mean"] is not None)}
    _judged(gprice, {lab: interval_verdict(x["mean"], x["half_width"], TARGET_GAIN_PP,
                                           cause=_priced_cause(dec.get(lab)))
                     for lab, x in gp.items()})
    out = {"step_rollout_error": step, "step_priced_error": priced, "gain_vs_sync_pp": gain,
           "gain_priced_pp": gprice, **_rankings(rows, f), "decision_agreement": _decisions(dec)}
    if pool is not None and pool.get("rounds", 1) == 0:  # every round left out (starved)
        for t in out.values():
            t.update(verdict="undecided", met=None, by_scheduler_verdict={},
                     reason="no round left to judge: every round was starved")
    return out


def _share(agree: int, compared: int) -> float | None:
    return agree / compared if compared else None


def _decisions(dec: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The steps whose decisions agree, pooled over the schedulers and the rounds judged, against
    :data:`TARGET_DECISIONS` and beside the live rounds' agreement with one another."""
    tot = [0, 0, 0, 0]  # agree, compared; live agree, live compared
    by: dict[str, Verdict | None] = {}
    shares, floors = {}, {}
    first = None
    for lab, p in dec.items():
        fl = p.get("live_floor") or {}
        fm = p.get("first_mismatch")
        where = None if fm is None else f"{lab} round {fm['round'] + 1}, step {fm['step']}: " \
                                        f"{fm['what']}"
        first = first or where
        shares[lab], floors[lab] = p.get("share"), fl.get("share")
        by[lab] = agreement_verdict(p.get("share"), fl.get("share"), TARGET_DECISIONS, where)
        tot = [tot[0] + p.get("agree_steps", 0), tot[1] + p.get("compared", 0),
               tot[2] + fl.get("agree_steps", 0), tot[3] + fl.get("compared", 0)]
    share, live = _share(tot[0], tot[1]), _share(tot[2], tot[3])
    v = agreement_verdict(share, live, TARGET_DECISIONS, first)
    return {"bound": TARGET_DECISIONS, "worst": share, "share": share, "live_share": live,
            "steps": tot[1], "by_scheduler": shares, "live_floor": floors,
            "by_scheduler_verdict": {k: x.to_dict() for k, x in by.items() if x is not None},
            "verdict": None if v is None else v.state,
            "reason": "not measured" if v is None else v.reason,
            "met": None if v is None else v.met}


def _rankings(rows: Sequence[SchedulerComparison], f: _Figures) -> dict[str, Any]:
    rk = {"predicted": ranking(rows, "predicted"), "measured": f.measured_order, "tie": RANK_TIE,
          "preserved_rounds": f.rank.get("preserved_rounds"), "rounds": f.rank.get("rounds", 1),
          "pairs": f.pairs}
    v = ranking_verdict(f.pairs, RANK_TIE) if len(rows) > 1 else None
    rk.update(verdict=None if v is None else v.state, met=None if v is None else v.met,
              reason="not measured (one scheduler)" if v is None else v.reason)
    pv = ranking_verdict(f.priced_pairs, RANK_TIE) if len(rows) > 1 and f.priced_pairs else None
    rp = {"priced": ranking(rows, "priced") if pv is not None else [], "tie": RANK_TIE,
          "pairs": f.priced_pairs, "verdict": None if pv is None else pv.state,
          "met": None if pv is None else pv.met,
          "reason": "not measured" if pv is None else pv.reason}
    return {"ranking": rk, "ranking_priced": rp}


TARGET_KEYS = ("step_rollout_error", "step_priced_error", "gain_vs_sync_pp", "gain_priced_pp",
               "ranking", "ranking_priced", "decision_agreement")
