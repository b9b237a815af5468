"""The validation report: ``report.json``, ``report.md`` and figures, from paired comparisons.

The targets and their verdicts are :mod:`aprilsim.validate.targets`'s; the decision agreement
(:mod:`aprilsim.validate.decisions`) and the machine check (what the client and the machine did
during each round, from ``real.machine``) travel beside them. A figure that was not measured is
n/a, never met. Where a target is not met the report says why, from what was measured: the
decisions that differ (first), else the split of the rollout-time error into engine rules, cost
per iteration and time outside the engines' steps (:mod:`aprilsim.validate.causes`), with the
fit's own errors as context.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .causes import cause_text, gain_cause
from .compare import SchedulerComparison
from .report_md import collapsed, markdown
from .targets import (
    RANK_TIE,
    TARGET_GAIN_PP,
    TARGET_PRICED_ERR,
    TARGET_STEP_ERR,
    targets,
)
from .verdict import ONE_ROUND, summary_state

__all__ = ["RANK_TIE", "TARGET_GAIN_PP", "TARGET_PRICED_ERR", "TARGET_STEP_ERR", "collapsed",
           "explain", "report_dict", "report_markdown", "targets", "write_figures", "write_report"]


def _fit_context(fit: Mapping[str, Any]) -> list[str]:
    """What the fit itself says about the cost per iteration (context for a gap)."""
    out = []
    if collapsed(fit):
        return ["The compute fit collapsed (coefficients about 0 or every step missed): the "
                "simulation ran the step-interval fit."]
    if fit.get("decode_median_err", 0) > TARGET_STEP_ERR:
        out.append(f"The decode cost a+b*B+c*K fits the live iterations with "
                   f"{100 * fit['decode_median_err']:.1f}% median error.")
    if fit.get("prefill_median_err", 0) > 2 * TARGET_STEP_ERR:
        out.append(f"Prefill p0+p1*n+pr*requests fits with {100 * fit['prefill_median_err']:.1f}% "
                   f"median error; prefill takes {100 * (1 - fit.get('decode_share', 1)):.0f}% of "
                   "the engines' compute.")
    return out


def explain(rows: Sequence[SchedulerComparison], fit: Mapping[str, Any],
            t: Mapping[str, Any] | None = None, pool: Mapping[str, Any] | None = None,
            decisions: Mapping[str, Mapping[str, Any]] | None = None) -> list[str]:
    """For every scheduler whose step error or gain is not met: its figure, its decisions, the
    measured split of its error (the cause), and the fit's errors as context."""
    t = t if t is not None else targets(rows, pool, decisions)
    dec = decisions or {}
    ps = (pool or {}).get("schedulers", {})
    out = []
    step = t["step_rollout_error"]
    for lab, err in step["by_scheduler"].items():
        v = step.get("by_scheduler_verdict", {}).get(lab)
        if err is None or v is None or v["verdict"] == "met":
            continue
        terms = ps.get(lab, {}).get("terms")
        if terms is None:
            terms = next((_one_terms(r) for r in rows if r.label == lab), None)
        why = [f"{lab}: median per-step rollout error {100 * err:.1f}% ({v['verdict']})."]
        d = dec.get(lab)
        if d is not None and d.get("share") is not None:
            why.append(f"Decisions agree in {100 * d['share']:.0f}% of {d['compared']} steps.")
        cause = cause_text(terms, d)
        why.append(f"Cause: {cause}." if cause else "Cause: not measured (no live iterations).")
        why += _fit_context(fit)
        out.append(" ".join(why))
    for lab, g in t["gain_vs_sync_pp"]["by_scheduler"].items():
        v = t["gain_vs_sync_pp"].get("by_scheduler_verdict", {}).get(lab)
        if v is None or v["verdict"] == "met":
            continue
        cause = gain_cause(ps.get(lab, {}).get("terms"), ps.get("sync", {}).get("terms"),
                           dec.get(lab))
        out.append(f"{lab}: gain over sync predicted {100 * g['predicted']:+.1f}%, measured "
                   f"{100 * g['measured']:+.1f}% ({g['diff_pp']:+.1f} pp; {v['verdict']}): "
                   + (cause or "cause not measured") + ".")
    return out


def _one_terms(r: SchedulerComparison):
    from .causes import pooled_terms

    return pooled_terms([r])


def warnings(meta: Mapping[str, Any], fit: Mapping[str, Any],
             machine: Mapping[str, Any] | None) -> list[str]:
    """What a reader must know before the numbers: one round, rounds left out, limits exceeded,
    a collapsed fit."""
    out = []
    if meta.get("rounds", 1) == 1:
        out.append(f"{ONE_ROUND[0].upper()}{ONE_ROUND[1:]}: an error above its bound and every "
                   "gain and ranking read undecided.")
    if machine:
        left = machine.get("starved_rounds") or []
        if left:
            out.append(f"{len(left)} of {machine.get('rounds', '?')} rounds left out of every "
                       f"verdict, starved: {'; '.join(machine.get('why', []))} (the machine "
                       "check lists every run).")
        out += list(machine.get("warnings", []))
    out += list(meta.get("warnings", []))
    if collapsed(fit):
        out.append("The compute fit collapsed (coefficients about 0, median error "
                   f"{100 * fit.get('decode_median_err', 0):.0f}%): it is not shown as a fit.")
    return out


def report_dict(rows: Sequence[SchedulerComparison], meta: dict[str, Any], fit: dict[str, Any],
                pool: dict[str, Any] | None = None,
                extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The JSON report. ``pool``: the judged rounds' pooled figures; ``extra``: ``decisions``
    (per scheduler, ``{"pooled": ..., "runs": {round: agreement}}``) and ``machine`` (the
    machine check), where a live validate measured them."""
    decisions, machine = (extra or {}).get("decisions"), (extra or {}).get("machine")
    pooled_dec = {lab: d["pooled"] for lab, d in (decisions or {}).items()}
    meta = {"rounds": (pool or {}).get("rounds", 1), **meta}
    t = targets(rows, pool, pooled_dec)
    keys = ("step_rollout_error", "step_priced_error", "gain_vs_sync_pp", "gain_priced_pp",
            "ranking", "decision_agreement")
    from .verdict import Verdict

    state = summary_state([Verdict(t[k]["verdict"], "") if t[k]["verdict"] else None for k in keys])
    return {"meta": meta, "calibration": fit, "targets": t, "verdict": state, "rounds": pool,
            "schedulers": [r.to_dict() for r in rows],
            "explanations": explain(rows, fit, t, pool, pooled_dec),
            "decisions": dict(decisions or {}), "machine": dict(machine or {}),
            "warnings": warnings(meta, fit, machine)}


def report_markdown(rep: dict[str, Any], figures: Sequence[str] = ()) -> str:
    """The Markdown report (figures given as paths relative to the report)."""
    return markdown(rep, figures)


def write_figures(rows: Sequence[SchedulerComparison], out: Path, prefix: str = "") -> list[Path]:
    """Predicted vs measured rollout time per step, and rollout throughput per scheduler."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for i, r in enumerate(rows):
        col = f"C{i}"
        steps = range(len(r.meas_rollout_s))
        ax.plot(steps, r.meas_rollout_s, "o-", color=col, label=f"{r.label} measured")
        ax.plot(steps, r.pred_rollout_s, "x--", color=col, label=f"{r.label} predicted")
    ax.set_xlabel("step")
    ax.set_ylabel("rollout time (s, wall)")
    ax.legend(fontsize=7, ncol=2)
    ax.set_title("rollout time per step: simulation vs live")
    fig.tight_layout()
    p = out / f"{prefix}rollout_per_step.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)
    fig, ax = plt.subplots(figsize=(6, 3.2))
    x = range(len(rows))
    key = "rollout_throughput_tok_s"
    ax.bar([i - 0.2 for i in x], [r.predicted[key] for r in rows], 0.4, label="predicted")
    ax.bar([i + 0.2 for i in x], [r.measured[key] for r in rows], 0.4, label="measured")
    ax.set_xticks(list(x), [r.label for r in rows], fontsize=8)
    ax.set_ylabel("rollout throughput (tok/s)")
    ax.legend()
    fig.tight_layout()
    p = out / f"{prefix}throughput.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)
    return paths


def write_report(rep: dict[str, Any], out: Path, figures: Sequence[Path] = ()) -> None:
    """``report.json`` and ``report.md`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(rep, indent=2, default=str))
    rel = [str(Path(f).relative_to(out)) if Path(f).is_relative_to(out) else str(f)
           for f in figures]
    (out / "report.md").write_text(report_markdown(rep, rel))
