"""Every scheduler family with its source, what it assumes of the engines, and its gain over sync
on the default scenario and on a KV-bound one: the families table of docs/schedulers.md.

    python experiments/scheduler_families.py               # 5 paired seeds, both scenarios
    python experiments/scheduler_families.py --seeds 2     # quicker

Writes experiments/results/scheduler_families.json and .md. Gains are paired: per seed, this
scheduler's figure / sync's on the same seed (common random numbers: the same groups) - 1, then
mean ± sd across seeds; the scenario's warm-up steps are left out. Disaggregated schedulers get
the trainer on GPUs of their own besides the scenario's engines (as in compare_schedulers.py's
"+trainer GPUs" rows). `seer_history` runs on the same scenario with a dataset of two steps'
prompts (`workload.dataset_prompts`), so prompts repeat every two steps; its gain is paired
with sync on that same workload.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

from compare_schedulers import paired, simulate  # noqa: E402

from aprilsim.config import Scenario, load_scenario  # noqa: E402

# (label, scheduler, knobs, source, what it assumes of the engines)
FAMILIES: list[tuple[str, str, dict, str, str]] = [
    ("sync", "sync", {}, "the baseline (slime, verl)", "generate; nothing else"),
    ("april", "april", {}, "APRIL, arXiv 2509.18521 (slime `--partial-rollout`)",
     "abort all with partial output; resume re-prefills prompt + partial"),
    ("april_ds", "april_ds", {}, "slime `--partial-rollout` with DAPO's filter",
     "as april"),
    ("slime_dapo", "slime_dapo", {}, "slime's DAPO over-sampling", "abort all"),
    ("dynamic_sampling", "dynamic_sampling", {}, "DAPO, arXiv 2503.14476 (verl recipe)",
     "generate; nothing else"),
    ("tail_batching", "tail_batching", {}, "RollPacker, arXiv 2509.21009",
     "generate; nothing else (prompts re-run from scratch)"),
    ("async_one_step", "async_one_step", {}, "slime `train_async.py`, verl one-step-off-policy",
     "trainer GPUs of its own; weight sync between steps"),
    ("async_april", "async_april", {}, "slime `train_async.py` with `--partial-rollout`",
     "as april, plus a weight sync while generating"),
    ("fully_async", "fully_async", {}, "AReaL, arXiv 2505.24298",
     "weight update that pauses or interrupts in-flight requests"),
    ("sync (veRL's dispatch)", "sync", {"dispatch": "group"},
     "veRL's synchronous rollout (the Seer paper's baseline)",
     "generate; each group whole on one engine"),
    ("seer (KV pool)", "seer", {}, "Seer, arXiv 2511.14617 (scheduling, no speculative decoding)",
     "request priority, per-request routing, max_new_tokens per piece, moving a request's KV "
     "between engines through a global pool (simulated; priced by `[cluster] kv_transfer`)"),
    ("seer (re-prefill)", "seer", {"migrate_kv": False},
     "Seer, arXiv 2511.14617 (scheduling, no KV pool)",
     "request priority, per-request routing, max_new_tokens per piece"),
    ("seer_history (KV pool)", "seer_history", {},
     "RhymeRL, arXiv 2508.18588 (historical lengths) with Seer's dispatch",
     "as seer (KV pool); prompt ids that repeat across epochs"),
]
SCENARIOS = {"default": None, "kv_bound": ROOT / "experiments" / "scenarios" / "kv_bound.toml"}


def _with_dataset(sc: Scenario) -> Scenario:
    """The scenario with a dataset of two steps' prompts (they repeat every two steps)."""
    w = sc.workload.model_copy(update={"dataset_prompts": 2 * sc.batch_size})
    return sc.model_copy(update={"workload": w})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5, help="paired seeds (common random numbers)")
    ap.add_argument("--only", nargs="*", default=None,
                    help="labels to run (sync always runs); the other rows are kept from the "
                         "last results")
    args = ap.parse_args()
    rows: dict[str, dict] = {label: {"label": label, "scheduler": name, "knobs": knobs,
                                     "source": src, "assumes": assumes}
                             for label, name, knobs, src, assumes in FAMILIES}
    for tag, path in SCENARIOS.items():
        sc = load_scenario(path)
        if path is None:  # the embedded default at 10 steps, 1 left out: the figures were so
            sc = sc.model_copy(update={"steps": 10, "warmup_steps": 1})
        runs: dict[str, list[dict]] = {}
        for label, name, knobs, _, _ in FAMILIES:
            if args.only is not None and label != "sync" and label not in args.only:
                continue
            s = _with_dataset(sc) if name == "seer_history" else sc
            if knobs:
                table = {**s.schedulers, name: {**s.settings_for(name), **knobs}}
                s = s.model_copy(update={"schedulers": table})
            print(f"{tag}: {label} x {args.seeds} seeds ...", file=sys.stderr)
            runs[label] = [simulate(s, name, None, sc.seed + k) for k in range(args.seeds)]
        bases = {"": runs["sync"]}
        if any(rows[label]["scheduler"] == "seer_history" for label in runs):  # its own workload
            print(f"{tag}: sync on the repeating dataset ...", file=sys.stderr)
            bases["history"] = [simulate(_with_dataset(sc), "sync", None, sc.seed + k)
                                for k in range(args.seeds)]
        for label, got in runs.items():
            row = rows[label]
            base = bases["history" if row["scheduler"] == "seer_history" else ""]
            row[f"{tag}_gain"], row[f"{tag}_gain_sd"] = paired(got, base,
                                                               "rollout_throughput_tok_s")
            row[f"{tag}_samples_gain"], row[f"{tag}_samples_gain_sd"] = paired(
                got, base, "samples_per_s")
            row[f"{tag}_offpolicy"] = sum(r["offpolicy_token_fraction"] for r in got) / len(got)
            row[f"{tag}_tok_s"] = sum(r["rollout_throughput_tok_s"] for r in got) / len(got)
    out = ROOT / "experiments" / "results"
    out.mkdir(parents=True, exist_ok=True)
    if args.only is not None and (out / "scheduler_families.json").exists():  # keep the rest
        for old in json.loads((out / "scheduler_families.json").read_text()):
            row = rows.get(old["label"])
            if row is not None and "default_gain" not in row:
                row.update(old)
    done = [r for r in rows.values() if "default_gain" in r]
    (out / "scheduler_families.json").write_text(json.dumps(done, indent=2) + "\n")
    lines = [
        "| family | source | assumes of the engines | default: rollout tok/s vs sync | "
        "default: samples/s vs sync | KV-bound: rollout tok/s vs sync | "
        "KV-bound: samples/s vs sync | off-policy (default) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in done:
        lines.append(
            f"| `{r['scheduler']}`"
            + (f" {r['label'].split(' ', 1)[1]}" if " " in r["label"] else "")
            + f" | {r['source']} | {r['assumes']} | "
            f"{r['default_gain']:+.1%} ± {r['default_gain_sd']:.1%} | "
            f"{r['default_samples_gain']:+.1%} ± {r['default_samples_gain_sd']:.1%} | "
            f"{r['kv_bound_gain']:+.1%} ± {r['kv_bound_gain_sd']:.1%} | "
            f"{r['kv_bound_samples_gain']:+.1%} ± {r['kv_bound_samples_gain_sd']:.1%} | "
            f"{r['default_offpolicy']:.0%} |")
    table = "\n".join(lines) + "\n"
    (out / "scheduler_families.md").write_text(table)
    print(f"{args.seeds} paired seeds, warm-up left out; mean ± sd of paired differences\n\n"
          f"{table}")


if __name__ == "__main__":
    main()
