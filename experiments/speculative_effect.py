"""What each speculative acceptance model does to sync, APRIL and Seer on the default scenario.

    nice python experiments/speculative_effect.py          # 5 paired seeds
    python experiments/speculative_effect.py --seeds 2     # quicker

Each row sets `[cluster] speculative` (docs/simulator.md#speculative-decoding) and runs sync
(round robin), sync with veRL's group dispatch, APRIL and seer on the same seeds (common random
numbers; the warm-up step left out). Ratios are paired per seed, mean with the 95 % t interval;
seer's `speculative` part is its share of the gain over round-robin sync that speculative
decoding makes (the gain decomposition, docs/metrics.md). The "history" row runs a dataset of two
steps' prompts (they repeat every two steps, so drafts from the prompt's earlier epoch exist);
its baselines run the same workload. Writes experiments/results/speculative_effect.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

from compare_schedulers import simulate  # noqa: E402

from aprilsim.config import SpeculativeSection, default_scenario  # noqa: E402
from aprilsim.metrics.gain import decompose  # noqa: E402
from aprilsim.sweep.stats import t_interval  # noqa: E402

SETTINGS: list[tuple[str, dict | None, bool]] = [
    # label, `[cluster] speculative` (None: off), prompts repeat every two steps
    ("off", None, False),
    ("model: EAGLE-3 at NeMo-RL's 2.26 accepted tokens, k 4", {"acceptance": "model"}, False),
    ("model, the same, losing 2 % per policy version (never retrained)",
     {"acceptance": "model", "staleness": 0.02}, False),
    ("group: Seer's grouped drafts, 1.70 -> 2.85, k <= 4", {"acceptance": "group",
                                                            "draft_budget": 128}, False),
    ("history: the prompt's previous epoch, 1.70 / 2.85, k 4", {"acceptance": "history"}, True),
    ("siblings (engine-local), p0 0.5 .. p_max 0.9, k <= 6",
     {"acceptance": "siblings", "k_max": 6, "draft_budget": 256, "overhead_s": 0.001}, False),
]


def _scenario(spec: dict | None, repeat: bool):
    # the embedded default at 10 steps, 1 left out: the figures in docs/ were made so
    sc = default_scenario().model_copy(update={"steps": 10, "warmup_steps": 1})
    if spec is not None:
        sc = sc.model_copy(update={"cluster": sc.cluster.model_copy(
            update={"speculative": SpeculativeSection(**spec)})})
    if repeat:
        sc = sc.model_copy(update={"workload": sc.workload.model_copy(
            update={"dataset_prompts": 2 * sc.batch_size})})
    return sc


def _ratio(runs: list[dict], base: list[dict], key: str = "rollout_throughput_tok_s") -> str:
    mean, _, lo, hi = t_interval([r[key] / b[key] for r, b in zip(runs, base, strict=True)])
    return f"{mean:.2f}x [{lo:.2f}, {hi:.2f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    args = ap.parse_args()
    lines = ["| setting | sync tok/s | APRIL vs sync | seer vs sync | seer vs sync (veRL's "
             "dispatch) | seer's `speculative` part |", "|---|---|---|---|---|---|"]
    for label, spec, repeat in SETTINGS:
        print(f"speculative_effect: {label} ...", file=sys.stderr)
        sc = _scenario(spec, repeat)
        grouped = sc.model_copy(update={"schedulers": {**sc.schedulers,
                                                       "sync": {"dispatch": "group"}}})
        seeds = [sc.seed + k for k in range(args.seeds)]
        sync = [simulate(sc, "sync", None, s) for s in seeds]
        gsync = [simulate(grouped, "sync", None, s) for s in seeds]
        april = [simulate(sc, "april", None, s) for s in seeds]
        seer = [simulate(sc, "seer", None, s) for s in seeds]
        part = statistics.fmean(decompose(r, b)["parts"]["speculative"]
                                for r, b in zip(seer, sync, strict=True))
        tok = statistics.fmean(r["rollout_throughput_tok_s"] for r in sync)
        lines.append(f"| {label} | {tok:,.0f} | {_ratio(april, sync)} | {_ratio(seer, sync)} | "
                     f"{_ratio(seer, gsync)} | {part:+.1%} |")
        print(lines[-1], file=sys.stderr)
    head = (f"default scenario, {args.seeds} paired seeds, warm-up left out; ratios: mean [95 % "
            "t interval] of the per-seed ratio\n\n")
    out = ROOT / "experiments" / "results" / "speculative_effect.md"
    out.write_text(head + "\n".join(lines) + "\n")
    print(head + "\n".join(lines))


if __name__ == "__main__":
    main()
