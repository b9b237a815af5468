"""Decisions apart from costs: what the scheduler decided, live and simulated, step by step.

A time error says how long; this says *what*. Per step of one scheduler's live run and its
simulation: groups trained, surplus groups dropped, requests aborted, tokens resumed (carried
into resubmissions), off-policy token share, and the requests in flight on each engine (the
time-weighted mean over the step's rollout, from the traces' request spans: submitted and not
yet ended, queued on the engine or running). A step *agrees* when every decision matches within
its tolerance (:data:`TOLERANCE`); the first step that does not is where a mismatch starts, and
everything after it may follow from it (APRIL's buffer carries it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aprilsim.metrics.records import RunResult, StepRecord
from aprilsim.metrics.trace import Trace

# decision -> (absolute tolerance, relative tolerance): |live - sim| <= max(abs, rel * max(|.|))
TOLERANCE: dict[str, tuple[float, float]] = {
    "groups trained": (0.0, 0.0),
    "surplus dropped": (0.0, 0.0),
    "requests aborted": (1.0, 0.10),
    "tokens resumed": (8.0, 0.10),
    "off-policy share": (0.05, 0.0),
    "in flight per engine": (2.0, 0.15),
}


def _aborted_by_step(steps: Sequence[StepRecord], trace: Trace | None) -> list[int] | None:
    """Requests that ended by an abort, each counted in the last step begun before it ended."""
    if trace is None:
        return None
    starts = [s.rollout_start_s for s in steps]
    out = [0] * len(steps)
    for sp in trace.requests:
        if sp.reason != "abort":
            continue
        k = max((i for i, t in enumerate(starts) if t <= sp.end_s + 1e-9), default=None)
        if k is not None:
            out[k] += 1
    return out


def _in_flight(step: StepRecord, trace: Trace | None) -> list[float] | None:
    """Per engine, the time-weighted mean of requests in flight over the step's rollout."""
    if trace is None or step.rollout_time_s <= 0:
        return None
    lo, hi = step.rollout_start_s, step.rollout_start_s + step.rollout_time_s
    out = [0.0] * max(1, trace.n_engines)
    for sp in trace.requests:
        if 0 <= sp.engine < len(out):
            out[sp.engine] += max(0.0, min(hi, sp.end_s) - max(lo, sp.submit_s))
    return [x / (hi - lo) for x in out]


def step_decisions(result: RunResult, trace: Trace | None) -> list[dict[str, Any]]:
    """Per step: every decision of :data:`TOLERANCE` (aborts and in-flight None without a trace)."""
    aborted = _aborted_by_step(result.steps, trace)
    out = []
    for i, s in enumerate(result.steps):
        st = s.scheduler_stats or {}
        out.append({
            "groups trained": s.trained_groups,
            "surplus dropped": int(st.get("dropped_groups", 0)),
            "requests aborted": None if aborted is None else aborted[i],
            "tokens resumed": s.resumed_tokens,
            "off-policy share": s.offpolicy_tokens / s.trained_tokens if s.trained_tokens else 0.0,
            "in flight per engine": _in_flight(s, trace),
        })
    return out


SENT_TOGETHER_S = 0.05  # requests sent within this of a step's start count as sent together


def admission_spread(result: RunResult, trace: Trace | None) -> float | None:
    """Median over the steps of how far apart the requests sent together at a step's start got
    their first token (live traces record it): an engine that admits them over many iterations
    (an API server parsing one request after another on a loaded CPU) starts some of them
    iterations late, which reorders which groups finish first. None where not observed."""
    if trace is None:
        return None
    spreads = []
    for s in result.steps:
        lo = s.rollout_start_s
        ft = [sp.first_token_s for sp in trace.requests
              if lo <= sp.submit_s <= lo + SENT_TOGETHER_S and sp.first_token_s is not None]
        if len(ft) >= 2:
            spreads.append(max(ft) - min(ft))
    return sorted(spreads)[len(spreads) // 2] if spreads else None


def _agrees(name: str, live: Any, sim: Any) -> bool | None:
    if live is None or sim is None:
        return None
    ab, rel = TOLERANCE[name]
    pairs = list(zip(live, sim)) if isinstance(live, list) else [(live, sim)]
    if isinstance(live, list) and len(live) != len(sim):
        return False
    return all(abs(a - b) <= max(ab, rel * max(abs(a), abs(b))) for a, b in pairs)


def _fmt(x: Any) -> str:
    if isinstance(x, list):
        return "/".join(f"{v:.1f}" for v in x)
    return f"{x:.3f}" if isinstance(x, float) else str(x)


def agreement(live: RunResult, live_trace: Trace | None, sim: RunResult,
              sim_trace: Trace | None) -> dict[str, Any]:
    """Step by step, live vs simulated decisions: rows, steps that agree, and the first mismatch
    (``{"step", "what"}`` naming each decision off there, or None)."""
    a, b = step_decisions(live, live_trace), step_decisions(sim, sim_trace)
    rows, agree, first = [], 0, None
    for i, (x, y) in enumerate(zip(a, b)):
        cells = {k: {"live": x[k], "sim": y[k], "agree": _agrees(k, x[k], y[k])} for k in TOLERANCE}
        ok = all(c["agree"] is not False for c in cells.values())
        agree += ok
        if not ok and first is None:
            off = [f"{k} {_fmt(c['live'])} live vs {_fmt(c['sim'])} simulated"
                   for k, c in cells.items() if c["agree"] is False]
            first = {"step": i, "what": "; ".join(off)}
        rows.append({"step": i, "agree": ok, "cells": cells})
    return {"steps": rows, "agree_steps": agree, "compared": len(rows), "first_mismatch": first,
            "admission_spread_s": admission_spread(live, live_trace)}


def live_agreement(runs: Sequence[tuple[RunResult, Trace | None]]) -> dict[str, Any]:
    """How often one scheduler's live runs (the same work, rounds apart) agree with one another,
    step by step, every pair pooled: the repeatability of the live decisions, the floor a
    deterministic simulation's agreement is read against."""
    agree = compared = pairs = 0
    for i, (a, ta) in enumerate(runs):
        for b, tb in runs[i + 1:]:
            got = agreement(a, ta, b, tb)
            agree += got["agree_steps"]
            compared += got["compared"]
            pairs += 1
    return {"share": agree / compared if compared else None, "agree_steps": agree,
            "compared": compared, "pairs": pairs}


def pooled_agreement(runs: Sequence[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    """One scheduler's agreement over its (round, agreement) runs: the share of steps that agree
    and the earliest mismatch (its round and step)."""
    compared = sum(a["compared"] for _, a in runs)
    agree = sum(a["agree_steps"] for _, a in runs)
    firsts = [(a["first_mismatch"]["step"], r, a["first_mismatch"]) for r, a in runs
              if a["first_mismatch"] is not None]
    first = None
    if firsts:
        step, rnd, fm = min(firsts, key=lambda t: (t[0], t[1]))
        first = {**fm, "round": rnd}
    spread = sorted(a["admission_spread_s"] for _, a in runs
                    if a.get("admission_spread_s") is not None)
    return {"share": agree / compared if compared else None, "agree_steps": agree,
            "compared": compared, "first_mismatch": first,
            "rounds_with_mismatch": len(firsts), "rounds": len(runs),
            "admission_spread_s": spread[len(spread) // 2] if spread else None}
