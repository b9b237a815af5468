"""The validation report: ``report.json``, ``report.md`` and figures, from paired comparisons.

Targets (issue 19): median per-step rollout-time error <= 10 % (wall clock; the engine time of
the logged iterations priced by the same cost, which no machine load moves, <= 5 %), every gain
over sync within 3 percentage points, scheduler ranking preserved. A figure that was not
measured is reported as n/a, never as met. Where one is missed the report names the term
that explains the gap, from what was measured: the fit error of the per-iteration cost (decode
vs prefill), the runner overhead between engine steps, and the share of the rollout that the
engines were not computing (idle waiting for the runner, client-side work, other processes).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .compare import METRICS, SchedulerComparison, gains, ranking, ranking_preserved

TARGET_STEP_ERR = 0.10  # wall-clock per-step rollout time
TARGET_PRICED_ERR = 0.05  # engine time of the logged iterations, priced
TARGET_GAIN_PP = 3.0
RANK_TIE = 0.02  # measured throughputs within 2 % of each other may swap places


def _worst(xs) -> float | None:
    """The largest of the measured values; None when nothing was measured (never 0: a figure
    that was not measured is not met)."""
    vals = [x for x in xs if x is not None]
    return max(vals) if vals else None


def _met(worst: float | None, bound: float) -> bool | None:
    return None if worst is None else worst <= bound


def targets(rows: Sequence[SchedulerComparison], pool: dict[str, Any] | None = None) -> dict[str, Any]:
    """Each target, the figure measured against it, and whether it is met (None: not measured,
    shown as n/a). With ``pool`` (:func:`aprilsim.validate.rounds.pooled` over repeated rounds)
    the step errors are pooled over the rounds, the gains are the paired means, the ranking must
    hold in every round, and each scheduler's noise floor stands beside its error. With two
    rounds or more the step error is the prediction's against the mean of the rounds' measured
    step (noise floor: that mean's); the single-run figures stay beside it."""
    single: dict[str, Any] = {}
    single_noise: dict[str, Any] = {}
    if pool is not None and pool.get("rounds", 0) >= 1:
        ps = pool["schedulers"]
        single = {lab: v["step_rollout_median_abs"] for lab, v in ps.items()}
        single_noise = {lab: v["noise_floor"] for lab, v in ps.items()}
        if pool["rounds"] >= 2:
            errs = {lab: v.get("step_rollout_vs_mean_median_abs") for lab, v in ps.items()}
            noise = {lab: v.get("noise_floor_of_mean") for lab, v in ps.items()}
        else:
            errs, noise = dict(single), dict(single_noise)
        priced = {lab: v["step_priced_median_abs"] for lab, v in ps.items()}
        g = {lab: {"predicted": v["predicted"], "measured": v["measured"]["mean"],
                   "diff_pp": v["diff_pp"]["mean"], "diff_pp_half_width": v["diff_pp"]["half_width"],
                   "measured_half_width": v["measured"]["half_width"], "rounds": v["diff_pp"]["n"]}
             for lab, v in pool["gains"].items()}
        rk = pool["ranking"]
        rank_met = None if not rk["rounds"] or len(rows) < 2 else rk["preserved_rounds"] == rk["rounds"]
        ranking_measured = rk["measured_by_round"][0] if rk["measured_by_round"] else []
    else:
        errs = {r.label: r.errors().get("step_rollout_median_abs") for r in rows}
        priced = {r.label: r.errors().get("step_priced_median_abs") for r in rows}
        noise = {r.label: None for r in rows}
        g = gains(rows)
        rank_met = ranking_preserved(rows, RANK_TIE) if len(rows) > 1 else None
        ranking_measured = ranking(rows, "measured")
        rk = {"preserved_rounds": int(bool(rank_met)), "rounds": 1}
    wg = _worst(abs(x["diff_pp"]) for x in g.values() if x.get("diff_pp") is not None)
    gr = gains(rows)
    wgp = _worst(abs(x["diff_priced_pp"]) for x in gr.values() if "diff_priced_pp" in x)
    we, wp = _worst(errs.values()), _worst(priced.values())
    priced_rank = None
    if len(rows) > 1 and all(r.meas_priced_s for r in rows):
        priced_rank = ranking_preserved(rows, RANK_TIE, side="priced")
    return {
        "step_rollout_error": {"bound": TARGET_STEP_ERR, "worst": we, "by_scheduler": errs,
                               "noise_floor": noise, "met": _met(we, TARGET_STEP_ERR),
                               "single_run": single, "single_run_noise_floor": single_noise,
                               "against": "mean of the rounds" if pool and pool.get("rounds", 0) >= 2
                               else "each run"},
        "step_priced_error": {"bound": TARGET_PRICED_ERR, "worst": wp, "by_scheduler": priced,
                              "met": _met(wp, TARGET_PRICED_ERR)},
        "gain_vs_sync_pp": {"bound": TARGET_GAIN_PP, "worst": wg, "by_scheduler": g,
                            "met": _met(wg, TARGET_GAIN_PP)},
        "gain_priced_pp": {"bound": TARGET_GAIN_PP, "worst": wgp, "met": _met(wgp, TARGET_GAIN_PP)},
        "ranking": {"predicted": ranking(rows, "predicted"), "measured": ranking_measured,
                    "tie": RANK_TIE, "preserved_rounds": rk["preserved_rounds"],
                    "rounds": rk["rounds"], "met": rank_met},
        "ranking_priced": {"priced": ranking(rows, "priced") if priced_rank is not None else [],
                           "tie": RANK_TIE, "met": priced_rank},
    }


def explain(rows: Sequence[SchedulerComparison], fit: dict[str, Any]) -> list[str]:
    """Which engine rule or cost term explains each missed target (from measured figures)."""
    out = []
    for r in rows:
        e = r.errors()
        med = e.get("step_rollout_median_abs")
        if med is None or med <= TARGET_STEP_ERR:
            continue
        why = [f"{r.label}: median per-step rollout error {100 * med:.1f}% "
               f"(bias {100 * e.get('step_rollout_median', 0):+.1f}%)."]
        pe, le, share = (e.get(k) for k in ("step_priced_median_abs", "step_logged_median_abs",
                                            "engine_time_share"))
        if pe is not None:
            why.append(f"Engine rules and scheduler (simulated busiest-engine time vs the logged "
                       f"iterations priced by the same cost): {100 * pe:.1f}% median"
                       f" ({'explains little' if pe <= TARGET_PRICED_ERR else 'a term of the gap'}).")
        if le is not None:
            why.append(f"Cost per iteration (simulated vs logged step intervals of the busiest "
                       f"engine): {100 * le:.1f}% median, bias {100 * e.get('step_logged_median', 0):+.1f}%"
                       " (the fitted cost vs what the iterations took this time: machine load "
                       "shifts it from step to step).")
        if share is not None and share < 0.95:
            why.append(f"The busiest engine stepped during {100 * share:.0f}% of the live rollout: "
                       "the rest is time no engine step covers (the runner submitting and "
                       "crediting requests, the event loop, other processes).")
        if fit.get("decode_median_err", 0) > TARGET_STEP_ERR:
            why.append(f"The decode cost a+b*B+c*K fits the logged iterations with "
                       f"{100 * fit['decode_median_err']:.1f}% median error (a CPU engine's "
                       "iteration time is mostly Python overhead and noisy).")
        if fit.get("prefill_median_err", 0) > 2 * TARGET_STEP_ERR:
            why.append(f"Prefill p0+p1*n+pr*requests fits with {100 * fit['prefill_median_err']:.1f}% median "
                       f"error; prefill takes {100 * (1 - fit.get('decode_share', 1)):.0f}% of the "
                       "engines' compute.")
        pe_fit, pe_no_pr = fit.get("prefill_median_err", 0.0), fit.get("prefill_without_pr_err", 0.0)
        if pe_no_pr > 0.1 and pe_fit < 0.7 * pe_no_pr:
            why.append(f"Prefill costs per request (the per-request term pr "
                       f"{1e3 * fit.get('pr', 0.0):.3f} ms fits it with {100 * pe_fit:.0f}% median "
                       f"error, p0 + p1*sum(n) alone with {100 * pe_no_pr:.0f}%): priced with pr.")
        out.append(" ".join(why))
    for label, g in gains(rows).items():
        if abs(g["diff_pp"]) > TARGET_GAIN_PP:
            out.append(f"{label}: gain over sync predicted {100 * g['predicted']:+.1f}%, measured "
                       f"{100 * g['measured']:+.1f}% ({g['diff_pp']:+.1f} pp): the gap of the two "
                       "runs' rollout-time errors above does not cancel.")
    return out


def report_dict(rows: Sequence[SchedulerComparison], meta: dict[str, Any], fit: dict[str, Any],
                pool: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON report (``pool``: the rounds' pooled figures, when the runs were repeated)."""
    return {"meta": meta, "calibration": fit, "targets": targets(rows, pool), "rounds": pool,
            "schedulers": [r.to_dict() for r in rows], "explanations": explain(rows, fit)}


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:+.1f}%"


def _abs_pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _pp(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1f} pp"


def _yes(met: bool | None) -> str:
    return "n/a" if met is None else ("yes" if met else "NO")


def _rounds(rk: dict[str, Any]) -> str:
    n = rk.get("rounds", 1)
    return f" (preserved in {rk.get('preserved_rounds', 0)}/{n} rounds)" if n > 1 else ""


def _noise(t: dict[str, Any]) -> str:
    nf = [x for x in t["step_rollout_error"].get("noise_floor", {}).values() if x is not None]
    return f" (noise floor {100 * max(nf):.1f}%)" if nf else ""


def _num(x: float | None) -> str:
    if x is None:  # not measured (offline validation: the log's side)
        return "n/a"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def report_markdown(rep: dict[str, Any], figures: Sequence[str] = ()) -> str:
    """The Markdown report (figures given as paths relative to the report)."""
    m, t, cal = rep["meta"], rep["targets"], rep["calibration"]
    lines = [f"# aprilsim validate: {m.get('scenario', '')}", "",
             f"{m.get('engines', '')}; lengths x{m.get('scale', 1):.4g}, seed {m.get('seed')}, "
             f"{m.get('steps')} steps (warm-up left out), limits {m.get('limits')}.", "",
             "## Targets", "",
             "| target | bound | measured | met |", "|---|---|---|---|",
             f"| median per-step rollout-time error (worst scheduler; against "
             f"{t['step_rollout_error'].get('against', 'each run')}) | <= {100 * t['step_rollout_error']['bound']:.0f}% "
             f"| {_abs_pct(t['step_rollout_error']['worst'])}{_noise(t)} | {_yes(t['step_rollout_error']['met'])} |",
             f"| engine-time error per step, logged iterations priced (load-independent) | <= "
             f"{100 * t['step_priced_error']['bound']:.0f}% | {_abs_pct(t['step_priced_error']['worst'])} "
             f"| {_yes(t['step_priced_error']['met'])} |",
             f"| gain over sync, predicted - measured (worst) | <= {t['gain_vs_sync_pp']['bound']:.0f} pp "
             f"| {_pp(t['gain_vs_sync_pp']['worst'])} | {_yes(t['gain_vs_sync_pp']['met'])} |",
             f"| gain over sync, predicted - priced live (worst) | <= {t['gain_priced_pp']['bound']:.0f} pp "
             f"| {_pp(t['gain_priced_pp']['worst'])} | {_yes(t['gain_priced_pp']['met'])} |",
             f"| ranking by rollout throughput | preserved | predicted {' > '.join(t['ranking']['predicted'])}; "
             f"measured {' > '.join(t['ranking']['measured'])}{_rounds(t['ranking'])} | {_yes(t['ranking']['met'])} |",
             f"| ranking, live priced | preserved | {' > '.join(t['ranking_priced']['priced']) or 'n/a'} "
             f"| {_yes(t['ranking_priced']['met'])} |",
             "", "## Per scheduler (predicted / measured, relative error)", "",
             "| scheduler | " + " | ".join(lab for lab, _ in METRICS.values())
             + " | per-step rollout err: median abs [p10, p90] | gain over sync pred / meas |",
             "|---|" + "---|" * (len(METRICS) + 2)]
    g = t["gain_vs_sync_pp"]["by_scheduler"]
    for s in rep["schedulers"]:
        e = s["errors"]
        cells = [f"{_num(s['predicted'][k])} / {_num(s['measured'][k])} ({_pct(e.get(k))})" for k in METRICS]
        step = (f"{100 * e['step_rollout_median_abs']:.1f}% [{_pct(e['step_rollout_p10'])}, "
                f"{_pct(e['step_rollout_p90'])}]" if "step_rollout_median_abs" in e else "n/a")
        gg = g.get(s["label"])
        gain = f"{_pct(gg['predicted'])} / {_pct(gg['measured'])}" if gg else "(base)"
        lines.append(f"| {s['label']} | " + " | ".join(cells) + f" | {step} | {gain} |")
    pool = rep.get("rounds")
    if pool and pool.get("rounds", 0) > 1:
        lines += ["", f"## Rounds: model error beside the noise floor ({pool['rounds']} interleaved rounds, same seed)", "",
                  "| scheduler | per-step rollout error vs the rounds' mean, median abs | noise floor of "
                  "that mean (floor / sqrt(R); split halves) | single-run error, median abs (pooled) "
                  "| noise floor of one run (same steps repeated) "
                  "| gain over sync: predicted | measured (mean +- 95%) | predicted - measured (pp, +- 95%) |",
                  "|---|---|---|---|---|---|---|---|"]
        for lab, v in pool["schedulers"].items():
            gg = pool["gains"].get(lab)
            if gg:
                m, d = gg["measured"], gg["diff_pp"]
                hw = "" if m["half_width"] is None else f" +- {100 * m['half_width']:.1f}"
                dhw = "" if d["half_width"] is None else f" +- {d['half_width']:.1f}"
                gcells = f"{_pct(gg['predicted'])} | {100 * m['mean']:+.1f}%{hw} | {d['mean']:+.1f}{dhw}"
            else:
                gcells = "(base) | | "
            lines.append(f"| {lab} | {_abs_pct(v.get('step_rollout_vs_mean_median_abs'))} | "
                         f"{_abs_pct(v.get('noise_floor_of_mean'))}; {_abs_pct(v.get('noise_floor_of_mean_split_half'))} | "
                         f"{_abs_pct(v['step_rollout_median_abs'])} | {_abs_pct(v['noise_floor'])} | {gcells} |")
    lines += ["", "## Calibration", ""]
    if cal.get("n_decode") is None:  # a cost given, not fitted here (offline: replay-validate)
        coef = ", ".join(f"{k} {cal[k]:.4g}" for k in ("a", "b", "c", "p0", "p1", "p2", "pr")
                         if cal.get(k) is not None)
        lines += [f"The simulation ran the cost of {m.get('calibration_from', '')}: "
                  f"{coef or 'tabulated f(B) + g(B) x K'} (s; given, not fitted here).", ""]
    else:
        lines += [
              f"From {m.get('calibration_from', '')} ({cal.get('source', '')}): decode "
              f"a {1e3 * cal['a']:.3f} ms + b {1e6 * cal['b']:.1f} us x B + c {cal['c']:.3g} s x K; "
              f"prefill p0 {1e3 * cal['p0']:.3f} ms + p1 {1e6 * cal['p1']:.2f} us x n + pr "
              f"{1e3 * cal.get('pr', 0.0):.3f} ms x requests (compute, relative "
              f"errors). The simulation runs the fit to step-end-to-step-end intervals (absolute errors): "
              f"a {1e3 * cal['wall']['a']:.3f} ms, b {1e6 * cal['wall']['b']:.1f} us, c {cal['wall']['c']:.3g}, "
              f"p0 {1e3 * cal['wall']['p0']:.3f} ms, p1 {1e6 * cal['wall']['p1']:.2f} us, pr "
              f"{1e3 * cal['wall'].get('pr', 0.0):.3f} ms. Median gap "
              f"between busy steps {1e3 * cal['overhead_s']:.3f} ms. Fit error (median, compute): "
              f"decode {100 * cal['decode_median_err']:.1f}% over {cal['n_decode']} iterations, prefill "
              f"{100 * cal['prefill_median_err']:.1f}% over {cal['n_prefill']}; decode "
              f"{100 * cal['decode_share']:.0f}% of the engines' compute.", ""]
    if rep["explanations"]:
        lines += ["## Gaps", ""] + [f"- {x}" for x in rep["explanations"]] + [""]
    if figures:
        single = [f for f in figures if not Path(f).stem.endswith(("_sim", "_live"))]
        lines += ["## Figures", ""] + [f"![{Path(f).stem}]({f})" for f in single] + [""]
        sims = [f for f in figures if Path(f).stem.endswith("_sim")]
        if sims:  # the timelines side by side: simulation | live
            lines += ["| simulated | live |", "|---|---|"]
            for f in sims:
                live = next((g for g in figures if Path(g).stem == Path(f).stem[:-4] + "_live"), "")
                lines.append(f"| ![{Path(f).stem}]({f}) | " + (f"![{Path(live).stem}]({live})" if live else "") + " |")
            lines.append("")
    return "\n".join(lines)


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
    ax.set_ylabel("rollout time (s)")
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
    (out / "report.json").write_text(json.dumps(rep, indent=2))
    rel = [str(Path(f).relative_to(out)) if Path(f).is_relative_to(out) else str(f) for f in figures]
    (out / "report.md").write_text(report_markdown(rep, rel))
