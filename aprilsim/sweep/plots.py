"""`aprilsim plot sweep`: the figure of a sweep, readable in a paper.

Six panels against the swept key, one line per scheduler with its 95 % interval band across
seeds: the chosen metric (rollout throughput by default), its gain over the baseline (paired by
seed), off-policy token share, mean staleness, length bias (minus the baseline's on the same
seeds, when there is a baseline: a batch's length bias is mostly sampling noise that the
baseline shares), and the Pareto front of throughput vs
off-policy share over every (point, scheduler). With several swept keys, x is the one with the
most values (or --x); each combination of the others is a line style and marker (colour: the
scheduler), and a scheduler that does not read a key (sync under `schedulers.april.*`) is drawn
once.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

LABELS = {
    "rollout_throughput_tok_s": ("rollout throughput", "tokens/s", 1.0),
    "samples_per_s": ("trained samples per second", "samples/s", 1.0),
    "offpolicy_token_fraction": ("off-policy token share", "% of trained tokens", 100.0),
    "mean_staleness": ("mean staleness", "policy versions", 1.0),
    "length_bias": ("length bias (trained vs workload mean)", "%", 100.0),
    "mean_step_time_s": ("mean step time", "s", 1.0),
    "mean_rollout_time_s": ("mean rollout time", "s", 1.0),
    "engine_busy_fraction": ("engine busy fraction", "%", 100.0),
    "efficiency_vs_ideal": ("efficiency vs ideal", "%", 100.0),
    "wasted_tokens": ("wasted tokens", "tokens", 1.0),
}


def label(metric: str) -> tuple[str, str, float]:
    return LABELS.get(metric, (metric.replace("_", " "), "", 1.0))


def _axis_label(metric: str) -> str:
    name, unit, _ = label(metric)
    return f"{name} ({unit})" if unit else name


def load_results(path: Path):
    """The tidy table: a .parquet or .csv written by `aprilsim sweep`."""
    import pandas as pd

    path = Path(path)
    df = pd.read_csv(path) if path.suffix == ".csv" else pd.read_parquet(path)
    if "point_id" not in df.columns or "scheduler" not in df.columns:
        raise ValueError(f"{path}: not a table written by `aprilsim sweep`")
    return df


def distinct_keys(df, keys: list[str], also: list[str] = ()) -> list[str]:
    """The keys that vary and are not linked to another one (equal to it on every row)."""
    out: list[str] = []
    for k in keys:
        if df[k].nunique() <= 1:
            continue
        if any((df[k].astype(str) == df[o].astype(str)).all() for o in [*also, *out]):
            continue
        out.append(k)
    return out


LINESTYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P")


def default_x(df, keys: list[str]) -> str:
    """The swept key with the most distinct values (the first such key on a tie)."""
    return max(keys, key=lambda k: (df[k].astype(str).nunique(), -keys.index(k)))


def series_plan(agg, x: str, others: list[str]) -> list[tuple[str, str, dict, int]]:
    """(label, scheduler, {other key: value}, style index) per line to draw.

    Colour is the scheduler; the other swept keys' combination is its line style and marker.
    A scheduler that does not read an other key (sync under `schedulers.april.*`) has the same
    runs at each of its values, so it is drawn once, at that key's first value.
    """
    from aprilsim.sweep.keys import scheduler_reads

    combos = (agg[others].astype(str).drop_duplicates().itertuples(index=False, name=None)
              if others else [()])
    combos = list(combos)
    style_of = {c: i for i, c in enumerate(combos)}
    plan = []
    for sched in agg["scheduler"].drop_duplicates():
        read = [o for o in others if scheduler_reads(sched, o)]
        seen: set[tuple] = set()
        for combo in combos:
            mine = tuple(v for o, v in zip(others, combo) if o in read)
            if mine in seen:
                continue
            seen.add(mine)
            fixed = dict(zip(others, combo))
            extra = ", ".join(f"{o.split('.')[-1]}={fixed[o]}" for o in read)
            plan.append((f"{sched} ({extra})" if extra else sched, sched, fixed,
                         style_of[combo] if read else 0))
    return plan


def _series(agg, x: str, others: list[str]):
    """(label, frame sorted by x, style index) per line of `series_plan`."""
    for name, sched, fixed, style in series_plan(agg, x, others):
        g = agg[agg["scheduler"] == sched]
        for o, v in fixed.items():
            g = g[g[o].astype(str) == v]
        yield name, g.sort_values(x), style


def plot_sweep(results: Path, out: Path, *, x: str | None = None,
               y: str = "rollout_throughput_tok_s", baseline: str | None = None) -> Path:
    """Write the six-panel figure of a sweep to `out` (format from its suffix)."""
    import matplotlib.pyplot as plt

    fig = sweep_figure(results, x=x, y=y, baseline=baseline)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=130)
    plt.close(fig)
    return out


def sweep_figure(results: Path, *, x: str | None = None, y: str = "rollout_throughput_tok_s",
                 baseline: str | None = None):  # noqa: ANN201 - a matplotlib Figure
    """The six panels of a sweep: x ticks at the swept values, thousands separated, the Pareto
    points of a scheduler that does not read x labelled with its name (not a value it ignores)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from aprilsim.sweep.api import swept_keys
    from aprilsim.sweep.stats import aggregate, pick_baseline

    df = load_results(results)
    keys = swept_keys(df)
    if not keys:
        raise ValueError(f"{results}: no swept key (a sweep without --grid or --range)")
    x = x or default_x(df, keys)
    if x not in keys:
        raise ValueError(f"--x {x}: not a swept key; swept: {', '.join(keys)}")
    if y not in df.columns:
        raise ValueError(f"--y {y}: not a metric of {results}")
    for k in keys:  # numeric x where the values are numbers
        df[k] = df[k].map(lambda v: json.loads(v) if isinstance(v, str) and v[:1] in "[{" else v)
    if df[x].map(lambda v: isinstance(v, list | dict)).any():
        raise ValueError(f"--x {x}: values are lists; sweep one element instead (e.g. {x}.0)")
    others = distinct_keys(df, [k for k in keys if k != x], also=[x])
    base = pick_baseline(sorted(df["scheduler"].unique()), baseline)
    agg = aggregate(df, keys, base)

    panels = [y, "gain", "offpolicy_token_fraction", "mean_staleness", "length_bias", "pareto"]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5), constrained_layout=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    series_colors: dict[str, str] = {}
    for letter, ax, panel in zip("abcdef", axes.flat, panels):
        if panel == "pareto":
            _pareto(ax, agg, series_colors, x, others)
        else:
            _panel(ax, letter, panel, agg, x, others, base, series_colors, colors)
            _swept_ticks(ax, df[x])
        _thousands(ax)
    handles, labels_ = axes.flat[0].get_legend_handles_labels()
    linked = [k for k in keys if k != x and k not in others
              and (df[k].astype(str) == df[x].astype(str)).all()]
    linked_note = f"; {x} set together with {', '.join(linked)}" if linked else ""
    n_seeds = int(df.groupby(["point_id", "scheduler"])["seed"].nunique().min())
    fig.legend(handles, labels_, loc="outside lower center", ncol=min(6, max(1, len(labels_))),
               title=f"scheduler (bands: 95 % interval over {n_seeds} seeds)" + linked_note)
    return fig


def _panel(ax, letter: str, panel: str, agg, x: str, others: list[str], base: str | None,
           series_colors: dict[str, str], colors: list[str]) -> None:
    """One of the five panels against x: a line and its 95 % band per scheduler."""
    metric = "rollout_throughput_tok_s" if panel == "gain" else panel
    sub = agg[agg["metric"] == metric]
    for name, g, style in _series(sub, x, others):
        if g.empty or panel == "gain" and (base is None or g["scheduler"].iloc[0] == base):
            continue
        sched = g["scheduler"].iloc[0]
        c = series_colors.setdefault(sched, colors[len(series_colors) % len(colors)])
        xs = g[x].to_numpy(dtype=float)
        if panel == "gain":
            m, lo, hi, scale = (g["ratio_mean"], g["ratio_lo"], g["ratio_hi"], 1.0)
        elif panel == "length_bias" and base is not None:
            scale = 100.0  # paired: the batch's sampling noise, shared with sync, cancels
            m, lo, hi = g["diff_mean"], g["diff_lo"], g["diff_hi"]
        else:
            scale = label(metric)[2]
            m, lo, hi = g["mean"], g["ci_lo"], g["ci_hi"]
        ax.plot(xs, m * scale, marker=MARKERS[style % len(MARKERS)], ms=4, color=c,
                ls=LINESTYLES[style % len(LINESTYLES)], label=name)
        if np.isfinite(lo.to_numpy(dtype=float)).any():
            ax.fill_between(xs, lo * scale, hi * scale, color=c, alpha=0.18, lw=0)
    if panel == "gain":
        ax.axhline(1.0, color="0.4", lw=1, ls="--")
        ax.set_ylabel(f"rollout throughput / {base} (x)" if base else "no baseline")
        ax.set_title(f"({letter}) gain over {base}, paired by seed" if base
                     else f"({letter}) gain: no baseline")
    elif panel == "length_bias" and base is not None:
        ax.set_ylabel(f"length bias minus {base}'s, same seeds (% points)")
        ax.set_title(f"({letter}) length bias, minus {base}'s")
    else:
        ax.set_ylabel(_axis_label(metric))
        ax.set_title(f"({letter}) {label(metric)[0]}")
    if panel == "length_bias":
        ax.axhline(0.0, color="0.4", lw=1, ls="--")
    ax.set_xlabel(x)
    ax.grid(alpha=0.3)


MAX_TICKS = 12  # more swept values than this: the axis keeps its own ticks


def _swept_ticks(ax, values) -> None:
    """Ticks at the swept values themselves (when numeric and at most MAX_TICKS of them)."""
    try:
        xs = sorted({float(v) for v in values})
    except (TypeError, ValueError):
        return
    if 1 < len(xs) <= MAX_TICKS:
        ax.set_xticks(xs)
        ax.set_xticklabels([f"{v:,g}" for v in xs])


def _thousands(ax) -> None:
    """Axis numbers of 1,000 and more with thousands separators (10,000 not 10000)."""
    from matplotlib.ticker import FuncFormatter

    def fmt(v: float, _pos: int) -> str:
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:g}"

    ax.yaxis.set_major_formatter(FuncFormatter(fmt))


def _pareto(ax, agg, series_colors: dict[str, str], x: str, others: list[str]) -> None:
    """Mean throughput vs mean off-policy share of every (point, scheduler); the front marked."""
    t = agg[agg["metric"] == "rollout_throughput_tok_s"].set_index(["point_id", "scheduler"])
    o = agg[agg["metric"] == "offpolicy_token_fraction"].set_index(["point_id", "scheduler"])
    pts = t[["mean", x, *others]].join(o["mean"].rename("off"))
    for name, g, style in _series(pts.reset_index(), x, others):
        c = series_colors.get(g["scheduler"].iloc[0] if len(g) else "", "0.3")
        ax.scatter(g["off"] * 100, g["mean"], color=c, s=22, label=name, zorder=3,
                   marker=MARKERS[style % len(MARKERS)])
    xs = pts["off"].to_numpy() * 100
    ys = pts["mean"].to_numpy()
    order = np.lexsort((-ys, xs))
    front, best = [], -np.inf
    for i in order:  # lowest off-policy share first; keep each new throughput record
        if ys[i] > best:
            front.append(i)
            best = ys[i]
    ax.step(xs[front], ys[front], where="post", color="k", lw=1.2, label="Pareto front")
    from aprilsim.sweep.keys import scheduler_reads

    scheds = pts.index.get_level_values("scheduler")
    for i in front:  # the swept value, or the scheduler's name where it does not read x
        v = pts[x].iloc[i]
        text = (scheds[i] if not scheduler_reads(scheds[i], x)
                else f"{v:g}" if isinstance(v, float | int) else str(v))
        ax.annotate(text, (xs[i], ys[i]), textcoords="offset points", xytext=(4, -10),
                    fontsize=7)
    ax.set_xlabel("off-policy token share (% of trained tokens)")
    ax.set_ylabel(_axis_label("rollout_throughput_tok_s"))
    ax.set_title(f"(f) Pareto front (labels: {x.split('.')[-1]})")
    ax.grid(alpha=0.3)
