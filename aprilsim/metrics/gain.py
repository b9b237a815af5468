"""The gain decomposition: where a scheduler's rollout-throughput gain over sync comes from.

Rollout throughput is R = G / T (generated tokens per second of rollout). With E engines, the
engine-seconds of the rollout phase split exactly into E*T = idle + prefill + re-prefill + batch
+ context + speculative (`engine_time`; agentic runs split a tool-wait part off idle: the
engine-seconds during which every episode in flight waits on a tool call), so the
engine-seconds per generated token are
tau = E*T / G = sum_k tau_k with tau_k = C_k / G, and for a scheduler x against a baseline b on
the same engines

    R_x / R_b - 1 = tau_b / tau_x - 1 = sum_k (tau_k,b - tau_k,x) / tau_x

an identity: the parts add up to the measured gain (docs/metrics.md, "Gain decomposition").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["ALL_COMPONENTS", "COMPONENTS", "components", "decompose", "engine_time",
           "fixed_iteration_cost", "mean_parts"]

# the parts of the engine time, in the order they are printed and stacked
COMPONENTS = ("idle", "batch", "context", "prefill", "reprefill", "speculative")
# with the tool-wait part of agentic runs (in their `engine_time` only), in printing order
ALL_COMPONENTS = ("idle", "tool_wait", "batch", "context", "prefill", "reprefill", "speculative")
LABELS = {"idle": "idle", "tool_wait": "tool wait", "batch": "batch", "context": "context",
          "prefill": "prefill", "reprefill": "re-prefill", "speculative": "speculative"}


def components(*times: Mapping[str, Any]) -> tuple[str, ...]:
    """The parts these engine times (or decompositions' parts) split into: `COMPONENTS`, with
    the tool-wait part where any of them has it (agentic runs)."""
    return tuple(k for k in ALL_COMPONENTS if k in COMPONENTS or any(k in t for t in times))


def fixed_iteration_cost(cost: Any) -> float:
    """Seconds every decode iteration pays whatever its batch (f(B) extrapolated to B = 0;
    `a` of a CostModel): what a larger batch amortises over more tokens."""
    f1 = cost.coefficients(1)[0]
    f2 = cost.coefficients(2)[0]
    return max(0.0, 2 * f1 - f2)


def engine_time(steps: Sequence[Any], n_engines: int, iteration_cost_s: float) -> dict[str, float]:
    """Engine-seconds of the rollout phases of `steps` (StepRecords), by component; they sum to
    n_engines x the rollout time exactly (context is what busy time leaves)."""
    roll = sum(s.rollout_time_s for s in steps)
    busy = sum(s.busy_time_s for s in steps)
    pf = sum(s.prefill_time_s for s in steps)
    ptok = sum(s.prefill_tokens for s in steps)
    resumed = sum(s.resumed_tokens for s in steps)
    reprefill = pf * min(1.0, resumed / ptok) if ptok else 0.0
    batch = sum(s.decode_iterations for s in steps) * iteration_cost_s
    spec = sum(getattr(s, "speculative_time_s", 0.0) for s in steps)
    agents = [a for s in steps if (a := getattr(s, "agent", None)) is not None]
    out = {
        "idle": n_engines * roll - busy,
        "batch": batch,
        "context": busy - pf - batch - spec,
        "prefill": pf - reprefill,
        "reprefill": reprefill,
        # what speculative decoding changed: decode seconds less the same steps' plain cost
        # (negative when it saves; batch and context are then the plain model's)
        "speculative": spec,
    }
    if agents:  # every episode in flight waits on a tool: the engines have nothing to run
        wait = n_engines * sum(a.tool_wait_s for a in agents)
        out["idle"] -= wait
        out["tool_wait"] = wait
    return out


def decompose(row: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
    """`row`'s rollout-throughput gain over `base` (two summary rows, same engines), split into
    the parts of `COMPONENTS` (they add up to `gain`), plus the waste and the costs."""
    g_x, g_b = row["generated_tokens"], base["generated_tokens"]
    t_x, t_b = row["engine_time_s"], base["engine_time_s"]
    tau_x = sum(t_x.values()) / g_x if g_x else 0.0
    if not tau_x or not g_b:
        return {}
    parts = {k: (t_b.get(k, 0.0) / g_b - t_x.get(k, 0.0) / g_x) / tau_x
             for k in components(t_x, t_b)}
    gain = row["rollout_throughput_tok_s"] / base["rollout_throughput_tok_s"] - 1.0
    kept_x = (g_x - row["wasted_tokens"]) / g_x
    kept_b = (g_b - base["wasted_tokens"]) / g_b
    kept_gain = (1.0 + gain) * kept_x / kept_b - 1.0
    return {
        "baseline": base["scheduler"],
        "gain": gain,
        "parts": parts,
        "wasted": kept_gain - gain,  # what discarded tokens take off: kept gain = gain + wasted
        "kept_gain": kept_gain,
        "offpolicy_token_fraction": row["offpolicy_token_fraction"],
        "length_bias": row["length_bias"],
    }


def mean_parts(decs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The seed-by-seed decompositions averaged (means are linear: the parts still add up)."""
    decs = [d for d in decs if d]
    if not decs:
        return {}
    n = len(decs)
    out: dict[str, Any] = {"baseline": decs[0]["baseline"], "seeds": n}
    for key in ("gain", "wasted", "kept_gain", "offpolicy_token_fraction", "length_bias"):
        out[key] = sum(d[key] for d in decs) / n
    keys = components(*(d["parts"] for d in decs))
    out["parts"] = {k: sum(d["parts"].get(k, 0.0) for d in decs) / n for k in keys}
    return out


def gain_lines(decs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The compact block `aprilsim simulate` prints under its table (one line per scheduler)."""
    decs = {k: v for k, v in decs.items() if v}
    if not decs:
        return []
    base = next(iter(decs.values()))["baseline"]
    shown = components(*(d["parts"] for d in decs.values()))  # tool wait: agentic runs
    heads = ["scheduler", f"gain vs {base}", *(LABELS[k] for k in shown), "| wasted",
             "kept gain", "| off-policy", "len bias"]
    cells = []
    for name, d in decs.items():
        cells.append([name, f"{d['gain']:+.1%}", *(f"{d['parts'].get(k, 0.0):+.1%}" for k in shown),
                      f"{d['wasted']:+.1%}", f"{d['kept_gain']:+.1%}",
                      f"{d['offpolicy_token_fraction']:.0%}", f"{d['length_bias']:+.1%}"])
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]

    def line(xs: list[str]) -> str:
        return "  ".join(x.rjust(w) if i else x.ljust(w)
                         for i, (x, w) in enumerate(zip(xs, widths)))

    seeds = next(iter(decs.values())).get("seeds", 1)
    title = (f"where the rollout tok/s gain over {base} comes from (gain = the parts; "
             f"{'mean of ' + str(seeds) + ' paired seeds' if seeds > 1 else 'same seed'}; "
             "docs/metrics.md#gain-decomposition):")
    return [title, line(heads), *map(line, cells)]


def gain_vs_sync(runs: dict[str, list[dict[str, Any]]]) -> dict[str, tuple[dict, list[dict]]]:
    """scheduler -> (its gain decomposition over sync averaged over the seeds, seed by seed),
    for every scheduler but sync when sync ran (aprilsim.metrics.gain)."""
    base = runs.get("sync")
    if base is None:
        return {}
    out = {}
    for name, rows in runs.items():
        if name != "sync":
            decs = [decompose(r, b) for r, b in zip(rows, base)]
            out[name] = (mean_parts(decs), decs)
    return out
