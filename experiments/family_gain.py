"""APRIL's gain over sync under SGLang's rules and under vLLM's (the `vllm` engine family), on
the default scenario, a KV-bound one and a 32k reasoning one: the table in docs/simulator.md's
vLLM family section.

    python experiments/family_gain.py               # 5 paired seeds, 10 steps, the three scenarios
    python experiments/family_gain.py --seeds 2 --steps 4   # quicker

Writes experiments/results/family_gain.json and .md. Per scenario, family and seed: APRIL's
rollout tok/s / sync's on the same seed (common random numbers: the same groups) - 1, warm-up
steps left out; then per seed the difference vLLM - SGLang of those gains (paired twice), mean ±
sd across seeds. Runs are scaled down to finish on a laptop core: `--steps` steps per run (the
first left out as warm-up) instead of each scenario's own.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

from compare_schedulers import simulate  # noqa: E402

from aprilsim.config import Scenario, default_scenario, load_scenario  # noqa: E402

FAMILIES = ("sglang", "vllm")
KEY = "rollout_throughput_tok_s"


def scenarios(steps: int) -> dict[str, Scenario]:
    """The three scenarios at `steps` steps, the first left out as warm-up."""
    base = default_scenario()
    long = base.model_copy(update={
        "max_response_len": 32_768,
        "lengths": {"family": "lognormal", "mu": 8.9, "sigma": 1.2}})
    out = {"default": base,
           "kv_bound": load_scenario(ROOT / "experiments" / "scenarios" / "kv_bound.toml"),
           "reasoning_32k": long}
    return {k: sc.model_copy(update={"steps": steps, "warmup_steps": 1}) for k, sc in out.items()}


def under(sc: Scenario, family: str) -> Scenario:
    """`sc` with its engines under `family`'s rules (each family's own defaults)."""
    return sc.model_copy(update={"cluster": sc.cluster.model_copy(update={"family": family})})


def gains(sc: Scenario, seeds: list[int]) -> list[float]:
    """APRIL's rollout tok/s over sync's - 1, seed by seed."""
    return [simulate(sc, "april", None, s)[KEY] / simulate(sc, "sync", None, s)[KEY] - 1
            for s in seeds]


def _mean_sd(xs: list[float]) -> tuple[float, float]:
    a = np.array(xs)
    return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5, help="paired seeds (common random numbers)")
    ap.add_argument("--steps", type=int, default=10, help="steps per run, the first warm-up")
    args = ap.parse_args()
    rows = []
    for tag, sc in scenarios(args.steps).items():
        seeds = [sc.seed + k for k in range(args.seeds)]
        got = {}
        for fam in FAMILIES:
            print(f"family_gain: {tag} under {fam} x {args.seeds} seeds ...", file=sys.stderr)
            got[fam] = gains(under(sc, fam), seeds)
        diff = [v - s for v, s in zip(got["vllm"], got["sglang"], strict=True)]
        row = {"scenario": tag, "steps": args.steps, "seeds": seeds, **got, "diff": diff}
        for name, xs in (*got.items(), ("diff", diff)):
            row[f"{name}_mean"], row[f"{name}_sd"] = _mean_sd(xs)
        rows.append(row)
    out = ROOT / "experiments" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "family_gain.json").write_text(json.dumps(rows, indent=2) + "\n")
    lines = ["| scenario | APRIL vs sync, sglang | APRIL vs sync, vllm | vllm - sglang (paired) "
             "| min .. max of the difference |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['scenario']} | {r['sglang_mean']:+.1%} ± {r['sglang_sd']:.1%} | "
                     f"{r['vllm_mean']:+.1%} ± {r['vllm_sd']:.1%} | {r['diff_mean']:+.1%} ± "
                     f"{r['diff_sd']:.1%} | {min(r['diff']):+.1%} .. {max(r['diff']):+.1%} |")
    text = "\n".join(lines) + (f"\n\n{args.seeds} paired seeds, {args.steps} steps per run (the "
                               "first left out as warm-up); mean ± sd across seeds.\n")
    (out / "family_gain.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
