"""Compare every registered scheduler on a scenario: the table and figure of docs/schedulers.md.

    python experiments/compare_schedulers.py                       # the default scenario
    python experiments/compare_schedulers.py experiments/scenarios/dynamic_sampling.toml --tag ds

Writes experiments/results/schedulers_<tag>.json and .md (a Markdown table), and, when matplotlib
is installed, docs/img/schedulers_<tag>.png. Disaggregated schedulers (async_one_step,
fully_async) get the trainer on GPUs of its own in addition to the scenario's engines; they are
also run on half the engines ("same GPUs": the other half trains), which is the fair comparison
with colocated schedulers when the cluster is fixed.

Every scheduler runs on the same seeds (common random numbers: the same groups), warm-up steps are
left out, and the gains over sync are paired: per seed, this scheduler's figure / sync's - 1, then
the mean and the standard deviation across seeds.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))  # the example user scheduler

from aprilsim.config import Scenario, load_scenario  # noqa: E402
from aprilsim.policies.base import CloseBatch  # noqa: E402
from aprilsim.policies.registry import REGISTRY  # noqa: E402
from aprilsim.scheduler_spec import build_scheduler  # noqa: E402
from aprilsim.sim.build import build_simulation  # noqa: E402

ORDER = ["sync", "april", "april_ds", "slime_dapo", "dynamic_sampling", "tail_batching",
         "async_one_step", "fully_async"]
USER = "my_scheduler:EarlyStopScheduler"
COLUMNS = [
    ("rollout tok/s", "rollout_throughput_tok_s", "{:,.0f}"),
    ("step s", "mean_step_time_s", "{:.1f}"),
    ("samples/s", "samples_per_s", "{:.2f}"),
    ("informative samples/s", "informative_samples_per_s", "{:.2f}"),
    ("busy", "engine_busy_fraction", "{:.0%}"),
    ("off-policy", "offpolicy_token_fraction", "{:.0%}"),
    ("max stale", "max_staleness", "{}"),
    ("len bias", "length_bias", "{:+.1%}"),
    ("wasted tok", "wasted_tokens", "{:,}"),
]


class _Capture:
    """Forwards to a scheduler; counts trained samples of groups with reward variance."""

    def __init__(self, inner) -> None:
        self.inner, self.name, self.mode = inner, inner.name, inner.mode
        self.sample_events = getattr(inner, "sample_events", True)  # keep the production path
        self.informative: list[int] = []  # per closed batch

    def handle(self, event, ctx):
        actions = self.inner.handle(event, ctx)
        for a in actions:
            if isinstance(a, CloseBatch):
                self.informative.append(sum(g.size for g in a.groups if g.reward_std() > 0))
        return actions

    def step_stats(self):
        return self.inner.step_stats()


def simulate(sc: Scenario, name: str, steps: int | None, seed: int) -> dict:
    cap = _Capture(build_scheduler(sc, name))
    run = build_simulation(sc, cap, steps=steps, seed=seed).run()
    run.warmup_steps = w = sc.warmup_steps
    row = run.summary()
    row["informative_samples_per_s"] = sum(cap.informative[w:]) / row["total_time_s"]
    return row


def paired(rows_by_seed: list[dict], base_by_seed: list[dict], key: str) -> tuple[float, float]:
    """Mean and standard deviation across seeds of this / base - 1 (paired by seed)."""
    d = np.array([r[key] / b[key] - 1 for r, b in zip(rows_by_seed, base_by_seed, strict=True)])
    return float(d.mean()), float(d.std(ddof=1)) if len(d) > 1 else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenario", nargs="?", default=None)
    ap.add_argument("--tag", default="default")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--seeds", type=int, default=5, help="paired seeds (common random numbers)")
    args = ap.parse_args()
    sc = load_scenario(args.scenario)
    # the embedded default at 10 steps, 1 left out: the figures in docs/ were made so
    if args.scenario is None:
        sc = sc.model_copy(update={"steps": 10, "warmup_steps": 1})
    names = [n for n in ORDER if n in REGISTRY] + sorted(set(REGISTRY) - set(ORDER)) + [USER]
    per_seed: dict[str, list[dict]] = {}
    for name in names:
        variants = [("", sc)]
        if getattr(REGISTRY.get(name), "mode", "colocated") == "disaggregated":
            half = sc.model_copy(
                update={"cluster": sc.cluster.model_copy(
                    update={"engines": max(1, sc.cluster.engines // 2)})}
            )
            variants = [(" (+trainer GPUs)", sc), (" (same GPUs)", half)]
        for suffix, s in variants:
            label = ("early_stop (user)" if name == USER else name) + suffix
            print(f"simulating {label} x {args.seeds} seeds ...", file=sys.stderr)
            per_seed[label] = [simulate(s, name, args.steps, sc.seed + k)
                               for k in range(args.seeds)]
    base = per_seed["sync"]
    rows = []
    for label, runs in per_seed.items():
        row = {"label": label, "seeds": len(runs)}
        for key, value in runs[0].items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                row[key] = float(np.mean([r[key] for r in runs]))
        row["gain_mean"], row["gain_sd"] = paired(runs, base, "rollout_throughput_tok_s")
        row["informative_gain_mean"], row["informative_gain_sd"] = paired(
            runs, base, "informative_samples_per_s")
        rows.append(row)
    out = ROOT / "experiments" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"schedulers_{args.tag}.json").write_text(json.dumps(rows, indent=2) + "\n")
    head = ("| scheduler | " + " | ".join(c[0] for c in COLUMNS)
            + " | rollout tok/s vs sync | informative vs sync |")
    lines = [head, "|" + "---|" * (len(COLUMNS) + 3)]
    for r in rows:
        cells = [c[2].format(int(round(r[c[1]])) if c[2] in ("{:,}", "{}") else r[c[1]])
                 for c in COLUMNS]
        lines.append(
            f"| {r['label']} | " + " | ".join(cells)
            + f" | {r['gain_mean']:+.1%} ± {r['gain_sd']:.1%} | "
            f"{r['informative_gain_mean']:+.1%} ± {r['informative_gain_sd']:.1%} |")
    table = "\n".join(lines) + "\n"
    (out / f"schedulers_{args.tag}.md").write_text(table)
    print(f"scenario: {sc.name}, {args.steps or sc.steps} steps ({sc.warmup_steps} warm-up left "
          f"out), {args.seeds} paired seeds; mean over seeds, gains: mean ± sd of paired "
          f"differences\n\n{table}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no figure", file=sys.stderr)
        return
    fig, axes = plt.subplots(1, 3, figsize=(15, 0.45 * len(rows) + 1.5), sharey=True)
    labels = [r["label"] for r in rows]
    y = range(len(rows))
    for ax, (title, key, scale) in zip(axes, [
        ("informative trained samples / s", "informative_samples_per_s", 1.0),
        ("rollout throughput (k tok/s)", "rollout_throughput_tok_s", 1e-3),
        ("off-policy token share (%)", "offpolicy_token_fraction", 100.0),
    ]):
        ax.barh(list(y), [r[key] * scale for r in rows], color="#4c72b0")
        ax.set_title(title)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(list(y), labels)
    axes[0].invert_yaxis()
    fig.suptitle(f"aprilsim: schedulers on '{sc.name}' ({args.steps or sc.steps} steps)")
    fig.tight_layout()
    img = ROOT / "docs" / "img"
    img.mkdir(parents=True, exist_ok=True)
    fig.savefig(img / f"schedulers_{args.tag}.png", dpi=110)
    print(f"wrote docs/img/schedulers_{args.tag}.png", file=sys.stderr)


if __name__ == "__main__":
    main()
