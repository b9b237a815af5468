"""``report.md``: the validation report in Markdown, section by section, from ``report.json``'s
dict (:func:`aprilsim.validate.report.report_dict`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .compare import METRICS
from .decisions import TOLERANCE


def collapsed(fit: Mapping[str, Any]) -> bool:
    """True when the compute fit collapsed: its decode coefficients are about 0 or it misses
    every step (median error >= 95 %); such a fit is not printed as if it were one."""
    if fit.get("n_decode") is None or fit.get("given"):
        return False
    tiny = max(fit.get("a", 0.0), 1e3 * fit.get("b", 0.0), 1e6 * fit.get("c", 0.0)) < 1e-9
    return tiny or fit.get("decode_median_err", 0.0) >= 0.95


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:+.1f}%"


def _abs_pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _pp(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1f} pp"


def _num(x: float | None) -> str:
    if x is None:  # not measured (offline validation: the log's side)
        return "n/a"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _v(t: dict[str, Any]) -> str:
    return "n/a" if t.get("verdict") is None else (
        f"**{t['verdict']}**" if t["verdict"] != "met" else "met")


def _floor_note(t: dict[str, Any]) -> str:
    """The noise floor the worst scheduler's error was judged against."""
    errs = {k: v for k, v in t.get("by_scheduler", {}).items() if v is not None}
    floors = t.get("floor_judged") or t.get("noise_floor") or {}
    worst = max(errs, key=lambda k: errs[k], default=None)
    nf = floors.get(worst) if worst is not None else None
    return f" ({worst}; noise floor {100 * nf:.1f}%)" if nf is not None else " (no noise floor)"


def targets_section(rep: dict[str, Any]) -> list[str]:
    """The targets, each with its figure, bound, verdict and reason."""
    t = rep["targets"]
    s, p, g, gp = (t[k] for k in ("step_rollout_error", "step_priced_error", "gain_vs_sync_pp",
                                  "gain_priced_pp"))
    rk, rp = t["ranking"], t["ranking_priced"]
    rows = [
        (f"median per-step rollout-time error, wall clock (worst scheduler; against "
         f"{s.get('against', 'each run')})", f"<= {100 * s['bound']:.0f}%",
         f"{_abs_pct(s['worst'])}{_floor_note(s)}", s),
        ("engine-time error per step: the live iterations priced by the simulation's cost",
         f"<= {100 * p['bound']:.0f}%", f"{_abs_pct(p['worst'])}{_floor_note(p)}", p),
        ("gain over sync, predicted - measured, wall clock (worst; paired over rounds)",
         f"<= {g['bound']:.0f} pp", _pp(g["worst"]), g),
        ("gain over sync, predicted - priced live, engine time (worst; paired over rounds)",
         f"<= {gp['bound']:.0f} pp", _pp(gp["worst"]), gp),
        ("ranking by rollout throughput, wall clock", "preserved",
         f"predicted {' > '.join(rk['predicted'])}; measured {' > '.join(rk['measured'])}", rk),
        ("ranking, engine time (live priced)", "preserved", " > ".join(rp["priced"]) or "n/a", rp),
    ]
    dec = t.get("decision_agreement")
    if dec and dec.get("steps"):
        live = dec.get("live_share")
        rows.append(("steps whose decisions agree, live vs simulated (all schedulers, rounds "
                     "judged)", f">= {100 * dec['bound']:.0f}%",
                     f"{_abs_pct(dec['share'])} of {dec['steps']} (the live rounds with one "
                     f"another: {'n/a' if live is None else _abs_pct(live)})", dec))
    out = ["## Targets", "", f"Verdict: **{rep.get('verdict', 'n/a')}** (met / missed / "
           "undecided; see below for each).", "",
           "| target | bound | measured | verdict | why |", "|---|---|---|---|---|"]
    for name, bound, meas, tt in rows:
        out.append(f"| {name} | {bound} | {meas} | {_v(tt)} | {tt.get('reason', '')} |")
    return out + [""]


def _cell(c: dict[str, Any]) -> str:
    def f(x: Any) -> str:
        if x is None:
            return "n/a"
        if isinstance(x, list):
            return "/".join(f"{v:.1f}" for v in x)
        return f"{x:.2f}" if isinstance(x, float) else str(x)
    mark = "" if c["agree"] is not False else " **x**"
    return f"{f(c['live'])} / {f(c['sim'])}{mark}"


def decisions_section(rep: dict[str, Any]) -> list[str]:
    """The decision agreement: per scheduler over the judged rounds, then step by step for the
    first judged round (live / simulated; **x** marks a decision off beyond its tolerance)."""
    dec = rep.get("decisions") or {}
    if not dec:
        return []
    out = ["## Decision agreement (what the scheduler decided, live / simulated)", "",
           "Tolerances: " + "; ".join(f"{k} {a:g} or {100 * r:.0f}%" if r else f"{k} {a:g}"
                                      for k, (a, r) in TOLERANCE.items()) + ".", "",
           "| scheduler | steps agreeing (rounds judged) | all rounds | first mismatch | "
           "live: first "
           "tokens of requests sent together spread over (median) |", "|---|---|---|---|---|"]
    for lab, d in dec.items():
        p, a = d["pooled"], d.get("pooled_all_rounds") or d["pooled"]
        fm = (p if p["compared"] else a).get("first_mismatch")  # every round left out: all rounds'
        where = ("none" if fm is None else
                 f"round {fm['round'] + 1}, step {fm['step']}: {fm['what']}")
        spread = a.get("admission_spread_s")
        out.append(f"| {lab} | {_abs_pct(p['share'])} ({p['agree_steps']}/{p['compared']}) | "
                   f"{_abs_pct(a['share'])} ({a['agree_steps']}/{a['compared']}) | {where} | "
                   f"{'n/a' if spread is None else f'{1e3 * spread:.0f} ms'} |")
    out += ["", "| scheduler | step | " + " | ".join(TOLERANCE) + " |",
            "|---|---|" + "---|" * len(TOLERANCE)]
    for lab, d in dec.items():
        runs = d.get("runs") or {}
        first = runs[min(runs)] if runs else None
        for row in (first or {}).get("steps", []):
            out.append(f"| {lab} | {row['step']} | "
                       + " | ".join(_cell(row["cells"][k]) for k in TOLERANCE) + " |")
    return out + [""]


def machine_section(rep: dict[str, Any]) -> list[str]:
    """What the machine and the client did during each live run, and which rounds were left out."""
    mc = rep.get("machine") or {}
    runs = mc.get("runs") or []
    if not runs:
        return []
    out = ["## Machine check (during each live run)", "", mc.get("setting", ""), "",
           "| run | event-loop lag p50 / p99 / max (ms) | tokens delivered in bursts | longest "
           "silence (s) | client waited for a CPU | other processes' CPU share | starved |",
           "|---|---|---|---|---|---|---|"]
    for r in runs:
        lag = r.get("loop_lag_ms") or {}
        out.append(f"| {r['label']} round {r['round'] + 1} | {lag.get('p50', 0):.1f} / "
                   f"{lag.get('p99', 0):.1f} / {lag.get('max', 0):.1f} | "
                   f"{_abs_pct(r.get('burst_share'))} | {r.get('max_silence_s', 0):.2f} | "
                   f"{_abs_pct(r.get('run_delay_share'))} | {_abs_pct(r.get('other_cpu_share'))} | "
                   f"{'**yes**: ' + r['why'] if r.get('starved') else 'no'} |")
    return out + [""]


def clocks_section(rep: dict[str, Any]) -> list[str]:
    """Which figures are wall time and which engine time."""
    live = rep["meta"].get("live") or {}
    timing = ", ".join(live.get("timing", [])) or "n/a"
    eng = live.get("engine_reported")
    lines = ["## Clocks", "",
             "- **wall time** (the client's monotonic clock): rollout and step times, the per-step "
             "rollout-time error, the gain over sync, the ranking, the machine check;",
             "- **engine time**: the live iterations priced by the simulation's cost (engine-time "
             f"error, priced gain and ranking); the iterations come from: {timing} (an engine's "
             "own log is on its step clock; rebuilt iterations are on the client's clock, fitted "
             "to the engine's own iteration counter where it reports one);"]
    if eng:
        lines.append(f"- **engine-reported**: {eng}.")
    return lines + [""]


def _scheduler_table(rep: dict[str, Any]) -> list[str]:
    out = ["## Per scheduler, first judged round (predicted / measured, relative error)", "",
           "| scheduler | " + " | ".join(lab for lab, _ in METRICS.values())
           + " | per-step rollout err (wall): median abs [p10, p90] | gain over sync pred / meas |",
           "|---|" + "---|" * (len(METRICS) + 2)]
    g = rep["targets"]["gain_vs_sync_pp"]["by_scheduler"]
    for s in rep["schedulers"]:
        e = s["errors"]
        cells = [f"{_num(s['predicted'][k])} / {_num(s['measured'][k])} ({_pct(e.get(k))})"
                 for k in METRICS]
        step = (f"{100 * e['step_rollout_median_abs']:.1f}% [{_pct(e['step_rollout_p10'])}, "
                f"{_pct(e['step_rollout_p90'])}]" if "step_rollout_median_abs" in e else "n/a")
        gg = g.get(s["label"])
        gain = f"{_pct(gg['predicted'])} / {_pct(gg['measured'])}" if gg else "(base)"
        out.append(f"| {s['label']} | " + " | ".join(cells) + f" | {step} | {gain} |")
    return out + [""]


def rounds_section(rep: dict[str, Any]) -> list[str]:
    """Model error beside the noise floor, per scheduler, over the judged rounds."""
    pool = rep.get("rounds")
    if not pool or pool.get("rounds", 0) < 2:
        return []
    out = [f"## Rounds: model error beside the noise floor ({pool['rounds']} interleaved rounds "
           "judged, same seed)", "",
           "| scheduler | per-step rollout error vs the rounds' mean, median abs | noise floor of "
           "that mean (floor / sqrt(R); split halves) | single-run error, median abs (pooled) "
           "| noise floor of one run | engine-time error vs mean / its floor "
           "| gain over sync: predicted | measured (mean +- 95%) "
           "| predicted - measured (pp, +- 95%) |",
           "|---|---|---|---|---|---|---|---|---|"]
    for lab, v in pool["schedulers"].items():
        gg = pool["gains"].get(lab)
        if gg:
            meas, d = gg["measured"], gg["diff_pp"]
            hw = "" if meas["half_width"] is None else f" +- {100 * meas['half_width']:.1f}"
            dhw = "" if d["half_width"] is None else f" +- {d['half_width']:.1f}"
            gcells = (f"{_pct(gg['predicted'])} | {100 * meas['mean']:+.1f}%{hw} | "
                      f"{d['mean']:+.1f}{dhw}")
        else:
            gcells = "(base) | | "
        out.append(f"| {lab} | {_abs_pct(v.get('step_rollout_vs_mean_median_abs'))} | "
                   f"{_abs_pct(v.get('noise_floor_of_mean'))}; "
                   f"{_abs_pct(v.get('noise_floor_of_mean_split_half'))} | "
                   f"{_abs_pct(v['step_rollout_median_abs'])} | {_abs_pct(v['noise_floor'])} | "
                   f"{_abs_pct(v.get('step_priced_vs_mean_median_abs'))} / "
                   f"{_abs_pct(v.get('priced_noise_floor_of_mean'))} | {gcells} |")
    return out + [""]


def calibration_section(rep: dict[str, Any]) -> list[str]:
    """Where the cost came from and how well it fits; a given cost is not shown as a fit."""
    m, cal = rep["meta"], rep["calibration"]
    out = ["## Calibration", ""]
    coef = ", ".join(f"{k} {cal[k]:.4g}" for k in ("a", "b", "c", "p0", "p1", "p2", "pr")
                     if cal.get(k) is not None)
    if cal.get("n_decode") is None:  # a cost given, not fitted here (offline: replay-validate)
        return out + [f"The simulation ran the cost of {m.get('calibration_from', '')}: "
                      f"{coef or 'tabulated f(B) + g(B) x K'} (s; given, not fitted here).", ""]
    if cal.get("given"):
        return out + [f"The simulation ran the cost of {m.get('calibration_from', '')}: {coef} "
                      "(s; given, not fitted here). Its error against the live runs' iterations "
                      f"(median): decode {100 * cal['decode_median_err']:.1f}% over "
                      f"{cal['n_decode']}, prefill {100 * cal['prefill_median_err']:.1f}% over "
                      f"{cal['n_prefill']}.", ""]
    w = cal["wall"]
    wall = (f"The simulation runs the fit to step-end-to-step-end intervals (absolute errors): "
            f"a {1e3 * w['a']:.3f} ms, b {1e6 * w['b']:.1f} us, c {w['c']:.3g}, p0 "
            f"{1e3 * w['p0']:.3f} ms, p1 {1e6 * w['p1']:.2f} us, pr "
            f"{1e3 * w.get('pr', 0.0):.3f} ms. "
            f"Median gap between busy steps {1e3 * cal['overhead_s']:.3f} ms.")
    if collapsed(cal):
        return out + [f"From {m.get('calibration_from', '')}: the compute fit collapsed "
                      f"(coefficients about 0, median error {100 * cal['decode_median_err']:.0f}% "
                      f"over {cal['n_decode']} iterations) and is not shown. {wall}", ""]
    return out + [
        f"From {m.get('calibration_from', '')} ({cal.get('source', '')}): decode "
        f"a {1e3 * cal['a']:.3f} ms + b {1e6 * cal['b']:.1f} us x B + c {cal['c']:.3g} s x K; "
        f"prefill p0 {1e3 * cal['p0']:.3f} ms + p1 {1e6 * cal['p1']:.2f} us x n + pr "
        f"{1e3 * cal.get('pr', 0.0):.3f} ms x requests (compute, relative errors). {wall} Fit "
        f"error (median, compute): decode {100 * cal['decode_median_err']:.1f}% over "
        f"{cal['n_decode']} iterations, prefill {100 * cal['prefill_median_err']:.1f}% over "
        f"{cal['n_prefill']}; decode {100 * cal['decode_share']:.0f}% of the engines' compute.", ""]


def figures_section(figures: Sequence[str]) -> list[str]:
    if not figures:
        return []
    single = [f for f in figures if not Path(f).stem.endswith(("_sim", "_live"))]
    out = ["## Figures", ""] + [f"![{Path(f).stem}]({f})" for f in single] + [""]
    sims = [f for f in figures if Path(f).stem.endswith("_sim")]
    if sims:  # the timelines side by side: simulation | live
        out += ["| simulated | live |", "|---|---|"]
        for f in sims:
            live = next((g for g in figures if Path(g).stem == Path(f).stem[:-4] + "_live"), "")
            out.append(f"| ![{Path(f).stem}]({f}) | "
                       + (f"![{Path(live).stem}]({live})" if live else "") + " |")
        out.append("")
    return out


def replay_section(m: dict[str, Any]) -> list[str]:
    """An offline report's `## Replay` section: what the log holds, the timing key and what it
    spans, how much of the log each scheduler used (wrap, unlogged prompts)."""
    notes = [*m.get("replay", ()), *(f"{lab}: {n}" for lab, ns in m.get("usage", {}).items()
                                     for n in ns)]
    return ["## Replay", "", *(f"- {n}" for n in notes), ""] if notes else []


def markdown(rep: dict[str, Any], figures: Sequence[str] = ()) -> str:
    """The whole report."""
    m = rep["meta"]
    lines = [f"# aprilsim validate: {m.get('scenario', '')}", "",
             f"{m.get('engines', '')}; lengths x{m.get('scale', 1):.4g}, seed {m.get('seed')}, "
             f"{m.get('steps')} steps (warm-up left out), limits {m.get('limits')}.", ""]
    if rep.get("warnings"):
        lines += ["**Read first:**", ""] + [f"- {w}" for w in rep["warnings"]] + [""]
    lines += targets_section(rep) + decisions_section(rep) + replay_section(m)
    lines += _scheduler_table(rep)
    lines += rounds_section(rep) + machine_section(rep) + clocks_section(rep)
    lines += calibration_section(rep)
    if rep.get("explanations"):
        lines += ["## Gaps", ""] + [f"- {x}" for x in rep["explanations"]] + [""]
    return "\n".join(lines + figures_section(figures))
