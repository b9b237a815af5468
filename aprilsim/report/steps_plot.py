"""`aprilsim plot steps`: per-step curves of a `simulate --steps-out` file, one line per scheduler.

Four panels share the step axis: rollout time, rollout throughput, the partial-sample buffer and
the off-policy share of trained tokens. Together they show where a scheduler's speed comes from
(shorter rollouts, higher throughput) and what it costs (a buffer of unfinished samples, tokens
generated under older policies). Runs of `simulate --seeds N` (records carrying several seeds)
are drawn as the mean over seeds with a min-max band, or one line per seed (`each_seed`), so the
seeds are never joined into one zigzag line. Needs matplotlib (`pip install 'aprilsim[plot]'`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# (key, title, y label): the panels, in reading order
PANELS: tuple[tuple[str, str, str], ...] = (
    ("rollout_time_s", "Rollout time per step", "rollout time (s)"),
    ("throughput_tok_s", "Rollout throughput", "throughput (generated tok/s)"),
    ("buffer_samples", "Partial-sample buffer", "unfinished samples (count)"),
    ("offpolicy_pct", "Off-policy share of trained tokens", "off-policy tokens (%)"),
)


def read_steps(path: str | Path) -> dict[str, list[dict[str, Any]]]:
    """Step records of a `--steps-out` JSON Lines file, grouped by scheduler in file order."""
    out: dict[str, list[dict[str, Any]]] = {}
    with Path(path).open() as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not JSON ({e.msg})") from None
            if not isinstance(row, dict) or "scheduler" not in row or "step" not in row:
                raise ValueError(f"{path}:{n}: not a step record (needs 'scheduler' and 'step')")
            out.setdefault(str(row["scheduler"]), []).append(row)
    if not out:
        raise ValueError(f"{path}: no step records")
    return out


def step_series(records: Iterable[dict[str, Any]]) -> dict[str, list[float]]:
    """The plotted series of one scheduler: step index and one list per panel key."""
    s: dict[str, list[float]] = {"step": [], **{k: [] for k, _, _ in PANELS}}
    for r in sorted(records, key=lambda r: r["step"]):
        roll = float(r.get("rollout_time_s", 0.0))
        trained = float(r.get("trained_tokens", 0))
        s["step"].append(int(r["step"]))
        s["rollout_time_s"].append(roll)
        s["throughput_tok_s"].append(float(r.get("generated_tokens", 0)) / roll if roll else 0.0)
        s["buffer_samples"].append(float(r.get("partial_samples", 0)))
        off = float(r.get("offpolicy_tokens", 0))
        s["offpolicy_pct"].append(100.0 * off / trained if trained else 0.0)
    return s


def by_seed(records: Iterable[dict[str, Any]]) -> dict[int | None, list[dict[str, Any]]]:
    """One scheduler's records split by `seed`, in file order (None: records without a seed)."""
    out: dict[int | None, list[dict[str, Any]]] = {}
    for r in records:
        out.setdefault(r.get("seed"), []).append(r)
    return out


def seed_band(per_seed: list[dict[str, list[float]]], key: str) -> tuple[list[int], list[float],
                                                                          list[float], list[float]]:
    """(steps, mean, min, max) of series `key` over the seeds that have each step."""
    at: dict[int, list[float]] = {}
    for s in per_seed:
        for step, v in zip(s["step"], s[key]):
            at.setdefault(step, []).append(v)
    steps = sorted(at)
    return (steps, [sum(at[k]) / len(at[k]) for k in steps], [min(at[k]) for k in steps],
            [max(at[k]) for k in steps])


def plot_steps(by_scheduler: dict[str, list[dict[str, Any]]], out: str | Path | None = None,
               each_seed: bool = False):
    """Draw the four panels; save to `out` (format from the suffix) when given. Returns the Figure.

    A scheduler with several seeds: its mean over seeds with a min-max band, labelled
    `NAME (mean of N seeds)`, or with `each_seed` one line per seed labelled `NAME seed S`."""
    import matplotlib

    if out is not None:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    fig, axes = plt.subplots(2, 2, figsize=(10, 6.8), sharex=True, layout="constrained")
    markers = "os^Dv<>P*X"
    styles = ("-", "--", ":", "-.")
    for i, (name, rows) in enumerate(by_scheduler.items()):
        seeds = by_seed(rows)
        per_seed = {seed: step_series(r) for seed, r in seeds.items()}
        style = dict(marker=markers[i % len(markers)], markersize=4, color=f"C{i}")
        for ax, (key, _, _) in zip(axes.flat, PANELS):
            if len(per_seed) == 1:
                (s,) = per_seed.values()
                ax.plot(s["step"], s[key], linewidth=1.5, label=name, **style)
            elif each_seed:
                for j, (seed, s) in enumerate(per_seed.items()):
                    ax.plot(s["step"], s[key], linewidth=1.2, linestyle=styles[j % len(styles)],
                            label=f"{name} seed {seed}", **style)
            else:
                steps, mean, lo, hi = seed_band(list(per_seed.values()), key)
                ax.fill_between(steps, lo, hi, color=f"C{i}", alpha=0.2, linewidth=0)
                ax.plot(steps, mean, linewidth=1.5,
                        label=f"{name} (mean of {len(per_seed)} seeds)", **style)
    for ax, (key, title, ylabel) in zip(axes.flat, PANELS):
        ax.set_title(title, fontsize=11)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if key == "throughput_tok_s":
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    for ax in axes[-1]:
        ax.set_xlabel("training step")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    banded = not each_seed and any(len(by_seed(r)) > 1 for r in by_scheduler.values())
    fig.legend(handles, labels, loc="outside upper center", ncol=min(len(labels), 6),
               title="scheduler" + (" (band: min-max over seeds)" if banded else ""), frameon=False)
    if out is not None:
        fig.savefig(out, dpi=150)
    return fig
