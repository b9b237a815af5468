"""The report half of ``aprilsim validate``: from a :class:`real.validate.Validation` to the
machine check, the decision agreement, the pooled comparisons of the rounds judged (starved
rounds left out) and ``report.md`` / ``report.json`` / figures."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .validate_types import LiveOutcome, Validation


def live_notes(v: Validation) -> dict[str, Any]:
    """What the engines said about the runs: timing source, the reconstruction's error against
    the engine's own log (or vLLM's iteration count), vLLM's prefix-cache hits and preemptions,
    and what the engines counted themselves (engine-reported figures)."""
    import numpy as np

    recon = [e for o in v.live for e in o.recon_error if e]
    out: dict[str, Any] = {"timing": sorted({t for o in v.live for t in o.timing})}
    if recon and "matched_share" in recon[0]:
        keys = [k for k in recon[0] if k not in ("logged", "reconstructed")]
        out["reconstruction_vs_log"] = {k: float(np.median([e[k] for e in recon if k in e]))
                                        for k in keys}
    elif recon:
        out["reconstruction_vs_vllm_metrics"] = {
            "count_rel_err_median": float(np.median([e["count_rel_err"] for e in recon])),
            "runs": len(recon)}
    cs = [c for o in v.live for c in o.counters if c]
    if cs and not any("prefix_queries" in c for c in cs):  # SGLang's counters
        out["engine_counters"] = {"iterations": sum(c.get("iterations", 0) for c in cs),
                                  "busy_s": sum(c.get("busy_s", 0) for c in cs)}
    elif cs:
        q = sum(c.get("prefix_queries", 0) for c in cs)
        out["vllm"] = {"prefix_cache_hit_share": (sum(c.get("prefix_hits", 0) for c in cs) / q
                                                  if q else None),
                       "preemptions": sum(c.get("preemptions", 0) for c in cs),
                       "iterations": sum(c.get("iterations", 0) for c in cs)}
    out["engine_reported"] = _engine_reported(v.live)
    return out


def _engine_reported(live: list[LiveOutcome]) -> str | None:
    """The engines' own counts and times over the runs, in words (None where they report none):
    the bundled engine's step log (compute seconds), vLLM's iteration counter and inter-token
    latency (engine-core timestamps), SGLang's forward passes and their GPU seconds."""
    logged = [(len(rows), sum(float(r.get("duration_s", 0.0)) for r in rows))
              for o in live for i, rows in enumerate(o.rows)
              if i < len(o.timing) and o.timing[i] == "iteration log"]
    cs = [c for o in live for c in o.counters if c and c.get("iterations")]
    parts = []
    if logged:
        parts.append(f"the bundled engines' step logs: {sum(n for n, _ in logged):,} iterations, "
                     f"{sum(t for _, t in logged):.1f} s of compute")
    vl = [c for c in cs if "itl_count" in c]
    if vl:
        itl = sum(c.get("itl_sum_s", 0.0) for c in vl) / max(1.0, sum(c["itl_count"] for c in vl))
        parts.append(f"vLLM's counters: {sum(c['iterations'] for c in vl):,.0f} iterations, "
                     f"mean inter-token latency {1e3 * itl:.2f} ms")
    sg = [c for c in cs if "busy_s" in c]
    if sg:
        parts.append(f"SGLang's counters: {sum(c['iterations'] for c in sg):,.0f} forward passes, "
                     f"{sum(c['busy_s'] for c in sg):.1f} s")
    return "; ".join(parts) or None


def starved_rounds(v: Validation) -> tuple[list[int], list[str]]:
    """The rounds whose machine check flagged a run, and why: per threshold crossed, the runs
    that crossed it and the range of their figures (every run's are in the machine table)."""
    from aprilsim.validate.starvation import (
        BURST_SHARE,
        LAG_P99_MS,
        OTHER_CPU_SHARE,
        RUN_DELAY_SHARE,
    )

    flagged = [o for o in v.live if o.machine.get("starved")]
    crossed = (("the client waited for a CPU", "run_delay_share", RUN_DELAY_SHARE, 100,
                "% of the wall"),
               ("event-loop lag p99", ("loop_lag_ms", "p99"), LAG_P99_MS, 1, " ms"),
               ("tokens delivered in bursts", "burst_share", BURST_SHARE, 100, "%"),
               ("other processes took", "other_cpu_share", OTHER_CPU_SHARE, 100, "% of the CPUs"))
    why = []
    for name, key, bound, k, unit in crossed:
        xs = [_figure(o.machine, key) for o in flagged]
        xs = [x for x in xs if x is not None and x > bound]
        if xs:
            lo, hi = f"{k * min(xs):.0f}", f"{k * max(xs):.0f}"
            why.append(f"{name} {lo if lo == hi else f'{lo}-{hi}'}{unit} in {len(xs)} run(s) "
                       f"(> {k * bound:.0f})")
    return sorted({o.round for o in flagged}), why


def _figure(machine: dict[str, Any], key) -> float | None:
    if isinstance(key, tuple):
        return (machine.get(key[0]) or {}).get(key[1])
    return machine.get(key)


def running_warnings(v: Validation) -> list[str]:
    """Where an engine's own metrics show more requests running than the simulation assumed
    (one line per scheduler: the most over its rounds)."""
    cap = v.limits.get("max_running")
    peak: dict[str, tuple[int, int]] = {}
    for o in v.live:
        worst = max((r for eng in o.running for _, r, _ in eng), default=0)
        if cap and worst > cap:
            n, top = peak.get(o.label, (0, 0))
            peak[o.label] = (n + 1, max(top, worst))
    return [f"{lab}: the engine's metrics show up to {top} requests running at once (in {n} "
            f"run(s)); the simulation assumed max_running {cap} "
            f"({v.facts.get('max_running_source', 'see the checks')}): give --max-running {top}"
            for lab, (n, top) in peak.items()]


def machine_report(v: Validation, judged: list[int], why: list[str],
                   setting: str) -> dict[str, Any]:
    """The machine check of every run, the starved rounds and the warnings it raises."""
    runs = [{"label": o.label, "round": o.round, **o.machine} for o in v.live if o.machine]
    return {"runs": runs, "rounds": len(v.rounds), "judged_rounds": judged,
            "starved_rounds": sorted({o.round for o in v.live} - set(judged)), "why": why,
            "setting": setting, "warnings": running_warnings(v)}


def decision_tables(v: Validation, judged: list[int]) -> dict[str, Any]:
    """Per scheduler: its decision agreement in every round, pooled over the judged ones."""
    from aprilsim.validate.decisions import agreement, live_agreement, pooled_agreement

    out: dict[str, Any] = {}
    for o in v.live:
        a = agreement(o.result, o.trace, v.sim_for(o.label, o.round),
                      v.sim_trace_for(o.label, o.round))
        out.setdefault(o.label, {"runs": {}})["runs"][o.round] = a
    for label, d in out.items():
        d["pooled"] = pooled_agreement([(r, a) for r, a in sorted(d["runs"].items())
                                        if r in judged])
        d["pooled_all_rounds"] = pooled_agreement(sorted(d["runs"].items()))
        d["pooled"]["live_floor"] = live_agreement(
            [(o.result, o.trace) for o in v.live if o.label == label and o.round in judged])
    return out


def _setting(v: Validation) -> str:
    pins = [c for c in v.checks if c.startswith("pinned")]
    return pins[0] if pins else ("not pinned (--pin puts the client and the engines on "
                                 "separate cores)")


def write_all(v: Validation, out: Path, figures: bool = True) -> dict[str, Any]:
    """Compare, draw and write ``out/report.md``, ``out/report.json`` and the figures."""
    from aprilsim.validate.report import report_dict, write_figures, write_report
    from aprilsim.validate.rounds import pooled

    from .validate_types import comparisons

    left, why = starved_rounds(v)
    judged = [r for r in range(len(v.rounds)) if r not in left]
    by_round = [comparisons(v, r) for r in judged]
    rows = by_round[0] if by_round else comparisons(v, 0)
    meta = {"scenario": v.scenario.name, "schedulers": v.specs, "scale": v.scale, "seed": v.seed,
            "steps": v.steps, "engines": v.engines, "limits": v.limits, "facts": v.facts,
            "calibration_from": v.calibration_from, "held_out": v.held_out, "checks": v.checks,
            "rounds": len(by_round), "rounds_run": len(v.rounds), "timings": v.timings,
            "live": live_notes(v),
            "runner_overhead_per_request_s": {o.label: o.overhead_per_request_s
                                              for o in v.live if o.round == 0},
            "live_wall_s": {f"{o.label}#{o.round}": o.wall_s for o in v.live}}
    if not judged:
        meta["warnings"] = ["Every round was starved: no round is left to judge, every target "
                            "reads undecided."]
    rep = report_dict(rows, meta, v.fit.to_dict(), pooled(by_round) if by_round else {"rounds": 0},
                      {"decisions": decision_tables(v, judged),
                       "machine": machine_report(v, judged, why, _setting(v))})
    out.mkdir(parents=True, exist_ok=True)
    figs: list[Path] = []
    if figures:
        figs = write_figures(rows, out)
        from aprilsim.report.timeline import write_timeline

        first = judged[0] if judged else 0
        for o in (o for o in v.live if o.round == first):
            safe = "".join(ch if ch.isalnum() else "_" for ch in o.label)
            tr = v.sim_trace_for(o.label, o.round)
            if tr is not None:
                figs.append(write_timeline(tr, out / f"timeline_{safe}_sim.png"))
            figs.append(write_timeline(o.trace, out / f"timeline_{safe}_live.png"))
    write_report(rep, out, figs)
    return rep
