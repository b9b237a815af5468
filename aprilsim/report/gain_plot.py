"""`aprilsim plot gain`: the gain decomposition as one stacked bar per scheduler.

Each bar stacks the parts of a scheduler's rollout-throughput gain over sync
(`aprilsim.metrics.gain`): positive parts above zero, negative ones below, and a marker at the
measured gain, which the parts add up to; the waste (what discarded tokens take off) is drawn
beside the bar. Reads the rows of `aprilsim simulate --json` or of `--out DIR/summary.json`.
Needs matplotlib (`pip install 'aprilsim[plot]'`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from aprilsim.metrics.gain import LABELS, components, decompose, mean_parts


def read_gains(path: str | Path) -> dict[str, dict[str, Any]]:
    """scheduler -> its decomposition averaged over the seeds, from summary rows (ValueError)."""
    try:
        rows = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e.msg})") from None
    if isinstance(rows, dict):
        rows = [rows]
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "scheduler" in r
                                             for r in rows):
        raise ValueError(f"{path}: not summary rows (aprilsim simulate --json)")
    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(str(r["scheduler"]), []).append(r)
    base = by.get("sync")
    out = {}
    for name, rs in by.items():
        if name == "sync":
            continue
        decs = [r["gain_vs_sync"] for r in rs if r.get("gain_vs_sync")]
        if not decs and base is not None and all("engine_time_s" in r for r in rs + base):
            decs = [decompose(r, b) for r, b in zip(rs, base)]
        if decs:
            out[name] = mean_parts(decs)
    if not out:
        raise ValueError(f"{path}: no gain over sync to draw (run sync beside the others: "
                         "aprilsim simulate -s sync -s april --json)")
    return out


def plot_gain(gains: dict[str, dict[str, Any]], out: str | Path | None = None):
    """Draw the stacked bars; save to `out` (format from the suffix) when given. Returns the
    Figure."""
    import matplotlib

    if out is not None:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(gains)
    fig, ax = plt.subplots(figsize=(max(6.4, 1.6 + 1.8 * len(names)), 5.6), layout="constrained")
    x = range(len(names))
    up = [0.0] * len(names)
    down = [0.0] * len(names)
    for c, part in enumerate(components(*(gains[n]["parts"] for n in names))):
        vals = [100 * gains[n]["parts"].get(part, 0.0) for n in names]
        bottoms = [u if v >= 0 else d for v, u, d in zip(vals, up, down)]
        ax.bar(x, vals, 0.55, bottom=bottoms, label=LABELS[part], color=f"C{c}")
        up = [u + max(v, 0.0) for v, u in zip(vals, up)]
        down = [d + min(v, 0.0) for v, d in zip(vals, down)]
    ax.bar([i + 0.38 for i in x], [100 * gains[n]["wasted"] for n in names], 0.18,
           color="0.55", hatch="//", label="wasted (kept-token gain)")
    ax.scatter(list(x), [100 * gains[n]["gain"] for n in names], marker="D", color="black",
               zorder=3, label="measured gain")
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(list(x), [f"{n}\noff-policy {gains[n]['offpolicy_token_fraction']:.0%}\n"
                            f"len bias {gains[n]['length_bias']:+.1%}" for n in names])
    base = next(iter(gains.values()))["baseline"]
    ax.set_ylabel(f"rollout tok/s gain over {base} (%)")
    wasted = [100 * gains[n]["wasted"] for n in names]
    lo, hi = min(0.0, *down, *wasted), max(0.0, *up)
    pad = 0.08 * (hi - lo or 1.0)
    ax.set_ylim(lo - pad, hi + pad)
    fig.suptitle("Where the gain comes from (the parts add up to the measured gain)", fontsize=11)
    ax.grid(True, axis="y", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=4, frameon=False, fontsize=9)
    if out is not None:
        fig.savefig(out, dpi=150)
    return fig
