"""Agentic rollouts: which scheduler wins with short tool calls, and which with long ones.

    python experiments/agents.py               # 3 paired seeds, a few minutes on two cores
    python experiments/agents.py --seeds 1 --steps 4

Two workloads, both GRPO groups of tool-using episodes (docs/agents.md) on the agentic example's
cluster (4 engines of Qwen3-4B on 2 H100s, the retained prefix cache, cache-aware routing):

* short tools: the `aprilsim scenario --example agentic` scenario (Search-R1 / ReTool-like:
  2-4 turns of ~300 tokens, tool calls of 0.1-1 s returning 100-500 tokens);
* long tools: a SWE-style agent in a sandbox (8-16 turns of ~200 tokens, tool calls of 5-30 s
  returning 200-1,500 tokens, a 32k response budget): the tool numbers are assumptions.

Every scheduler runs the same episodes on each seed (paired); the disaggregated ones (fully_async,
env_async: a trainer of their own) also run on half the engines, the other half standing for
their trainer's GPUs (the same GPUs as the colocated ones). Reported per scheduler, as means
over the seeds: trained episodes per second and step time (what a training run waits for),
rollout tokens per second and its gain over sync split into parts (the gain decomposition,
docs/metrics.md; agentic runs have a tool-wait part), the tool-wait share, the prefix-cache hit
share, tokens generated and prefilled, waste, and how off-policy the trained episodes are.
Writes experiments/results/agents.json and .md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from aprilsim.config import Scenario, example_scenario_text, scenario_from_dict
from aprilsim.metrics.gain import decompose, mean_parts
from aprilsim.scenario_limits import parse_toml
from aprilsim.sim.run import simulate

ROOT = Path(__file__).resolve().parents[1]
# (label, scheduler, share of the cluster's engines it rolls out on): the disaggregated ones
# have a trainer of their own, so they run twice: on every engine (more GPUs than the colocated
# ones use) and on half of them (the other half standing for the trainer's GPUs: the same GPUs)
SCHEDULERS = [("sync", "sync", 1.0), ("sync_turns", "sync_turns", 1.0), ("april", "april", 1.0),
              ("fully_async", "fully_async", 1.0), ("env_async", "env_async", 1.0),
              ("fully_async, same GPUs", "fully_async", 0.5),
              ("env_async, same GPUs", "env_async", 0.5)]
FIGURES = ["episodes_per_s", "mean_step_time_s", "rollout_throughput_tok_s", "tool_wait_share",
           "cache_hit_share", "turns_per_episode", "generated_tokens", "prefilled_tokens",
           "wasted_tokens", "offpolicy_token_fraction", "policy_versions_per_episode",
           "mean_context_tokens"]


def workloads(steps: int) -> dict[str, Scenario]:
    """The short-tool example and its long-tool (SWE-style) counterpart."""
    short = parse_toml(example_scenario_text("agentic"), "agentic example")
    short["steps"] = steps
    long = json.loads(json.dumps(short))
    long.update(name="agentic-swe", max_response_len=32_768)
    long["lengths"] = {"family": "lognormal", "mu": 5.3, "sigma": 0.8}  # ~200 tokens a turn
    long["workload"]["episodes"] = {"min_turns": 8, "max_turns": 16, "max_turn_len": 1024,
                                    "tool_s": {"low": 5.0, "high": 30.0},
                                    "tool_tokens": {"low": 200, "high": 1500}}
    return {"short tools (0.1-1 s, 2-4 turns)": scenario_from_dict(short),
            "long tools (5-30 s, 8-16 turns)": scenario_from_dict(long)}


def measure(sc: Scenario, seeds: list[int]) -> dict[str, Any]:
    """Every scheduler on every seed: per scheduler the figures' means and the decomposition."""
    rows: dict[str, list[dict[str, Any]]] = {}
    for label, name, share in SCHEDULERS:
        engines = max(1, int(sc.cluster.engines * share))
        run_sc = sc.model_copy(update={"cluster": sc.cluster.model_copy(
            update={"engines": engines})})
        for s in seeds:
            t0 = time.monotonic()
            rows.setdefault(label, []).append(simulate(run_sc, name, seed=s).summary())
            print(f"  {label} seed {s}: {time.monotonic() - t0:.1f} s", file=sys.stderr)
    out = {}
    shares = {label: share for label, _, share in SCHEDULERS}
    for name, rs in rows.items():
        fig = {k: sum(r[k] for r in rs) / len(rs) for k in FIGURES}
        if name != "sync":
            if shares[name] == 1.0:  # the decomposition compares runs on the same engines
                fig["gain_vs_sync"] = mean_parts([decompose(r, b)
                                                  for r, b in zip(rs, rows["sync"])])
            ratios = [r["episodes_per_s"] / b["episodes_per_s"] for r, b in zip(rs, rows["sync"])]
            fig["episodes_per_s_vs_sync"] = sum(ratios) / len(ratios)
        out[name] = fig
    return out


def table(name: str, res: dict[str, Any], seeds: int) -> list[str]:
    """One workload's markdown tables: the figures, then the gain decomposition."""
    lines = [f"### {name}", "", f"Means over {seeds} paired seeds.", "",
             "| scheduler | episodes/s | vs sync | step s | rollout tok/s | tool-wait | cache hit "
             "| generated | prefilled | wasted | off-policy tokens | versions/episode |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for sched, f in res.items():
        vs = f.get("episodes_per_s_vs_sync", 1.0)
        lines.append(
            f"| {sched} | {f['episodes_per_s']:.2f} | {vs:.2f}x | {f['mean_step_time_s']:.1f} | "
            f"{f['rollout_throughput_tok_s']:,.0f} | {f['tool_wait_share']:.1%} | "
            f"{f['cache_hit_share']:.1%} | {f['generated_tokens']:,.0f} | "
            f"{f['prefilled_tokens']:,.0f} | {f['wasted_tokens']:,.0f} | "
            f"{f['offpolicy_token_fraction']:.0%} | {f['policy_versions_per_episode']:.2f} |")
    parts = ["idle", "tool_wait", "batch", "context", "prefill", "reprefill"]
    lines += ["", "Rollout tok/s gain over sync, decomposed (the parts add up to the gain):", "",
              "| scheduler | gain | " + " | ".join(parts) + " | kept gain (less waste) |",
              "|---|---|" + "---|" * len(parts) + "---|"]
    for sched, f in res.items():
        d = f.get("gain_vs_sync")
        if d:
            lines.append(f"| {sched} | {d['gain']:+.1%} | "
                         + " | ".join(f"{d['parts'].get(p, 0.0):+.1%}" for p in parts)
                         + f" | {d['kept_gain']:+.1%} |")
    return [*lines, ""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    seeds = list(range(args.seeds))
    results = {}
    for name, sc in workloads(args.steps).items():
        print(name, file=sys.stderr)
        results[name] = measure(sc, seeds)
    out = ROOT / "experiments" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "agents.json").write_text(json.dumps(
        {"seeds": seeds, "steps": args.steps, "results": results}, indent=1) + "\n")
    md = ["# Agentic rollouts: schedulers on short and long tool calls", "",
          f"`python experiments/agents.py --seeds {args.seeds} --steps {args.steps}` "
          "(docs/agents.md explains the figures).", ""]
    for name, res in results.items():
        md += table(name, res, len(seeds))
    (out / "agents.md").write_text("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
