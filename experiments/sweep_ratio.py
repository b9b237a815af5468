"""The over-provision ratio from 1.0 to 4.0: how the best ratio depends on lengths and engines.

    python experiments/sweep_ratio.py [--seeds 3] [--jobs 2] [--refit]

Length models: the default scenario's (reasoning RL: lognormal, median 5,000 tokens, 16k cap)
and models fitted by `aprilsim fit --bootstrap 0` to the shared serving traces (mooncake
conversation, Azure conversation, Azure code; ../shared/data/lengths or $APRILSIM_SHARED_DATA),
cached in experiments/results/models/ (--refit to redo). Engine regimes on the default lengths:
the default 4 engines, 16 engines (few requests per engine: decode is weight-bound, extra requests
are nearly free) and 4 engines capped at 32 running requests (saturated: requests queue from
ratio 1 on).

Schedulers: sync, april and april_ds (`ratio`) and fully_async (`inflight_ratio`), the three
ratios linked to one swept value. Writes experiments/results/sweep_ratio/*.parquet (resumable),
docs/figures/sweep_ratio_*.png and experiments/results/sweep_ratio.md (the tables in
docs/sweeps.md).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import tomllib

from aprilsim.config import default_scenario
from aprilsim.sweep.api import run_sweep
from aprilsim.sweep.keys import apply, scenario_dict
from aprilsim.sweep.plots import plot_sweep
from aprilsim.sweep.stats import aggregate

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
FIGURES = ROOT / "docs" / "figures"
RATIOS = [1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0]
AXIS = ("schedulers.april.ratio", "schedulers.april_ds.ratio",
        "schedulers.fully_async.inflight_ratio")
SCHEDULERS = ["sync", "april", "april_ds", "fully_async"]
TRACES = {
    "mooncake_conv": "mooncake_conversation_trace.jsonl",
    "azure_conv": "azure2023_conv.csv",
    "azure_code": "azure2023_code.csv",
}
OFFPOLICY_CAP = 0.5


def data_dir() -> Path:
    env = os.environ.get("APRILSIM_SHARED_DATA")
    return (Path(env) if env else ROOT.parent / "shared" / "data") / "lengths"


def fitted_model(name: str, refit: bool) -> Path | None:
    """The length model of a shared trace, fitted once and cached."""
    out = RESULTS / "models" / f"{name}.toml"
    src = data_dir() / TRACES[name]
    if out.exists() and not refit:
        return out
    if not src.exists():
        print(f"skipping {name}: {src} not found", file=sys.stderr)
        return None
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "aprilsim", "fit", str(src), "--bootstrap", "0",
                    "--out", str(out)], check=True, stdout=subprocess.DEVNULL)
    return out


def cases(refit: bool) -> list[tuple[str, str, str, dict]]:
    """(tag, lengths label, regime label, scenario dict) for every sweep."""
    # the embedded default at 10 steps, 1 left out: the figures in docs/ were made so
    base = {**scenario_dict(default_scenario()), "steps": 10, "warmup_steps": 1}
    out = [("default", "default (reasoning mixture)", "4 engines", base)]
    for name in TRACES:
        model = fitted_model(name, refit)
        if model is None:
            continue
        d = apply(base, [("lengths", {"from": str(model)})])
        max_len = tomllib.loads(model.read_text()).get("max_len")
        if max_len:  # the trace's own cap
            d["max_response_len"] = int(max_len)
        out.append((name, f"fitted: {name}", "4 engines", d))
    out.append(("engines16", "default (reasoning mixture)", "16 engines",
                apply(base, [("cluster.engines", 16)])))
    out.append(("maxrun32", "default (reasoning mixture)", "4 engines, max_running 32",
                apply(base, [("cluster.max_running", 32)])))
    return out


def best_ratios(agg, sched: str) -> dict[str, float]:
    """Ratio of the highest mean throughput; the knee (smallest ratio within 5 % of it); the
    highest mean throughput with off-policy share <= OFFPOLICY_CAP (mean)."""
    key = AXIS[0]
    t = agg[(agg["scheduler"] == sched) & (agg["metric"] == "rollout_throughput_tok_s")]
    o = agg[(agg["scheduler"] == sched) & (agg["metric"] == "offpolicy_token_fraction")]
    t = t.set_index(key).sort_index()
    o = o.set_index(key).sort_index()
    best = float(t["mean"].idxmax())
    knee = float(t.index[np.argmax(t["mean"].to_numpy() >= 0.95 * t["mean"].max())])
    e2e = agg[(agg["scheduler"] == sched) & (agg["metric"] == "samples_per_s")].set_index(key)
    ok = o.index[o["mean"].to_numpy() <= OFFPOLICY_CAP]
    capped = float(t.loc[ok, "mean"].idxmax()) if len(ok) else float("nan")
    return {
        "best": best, "gain_best": float(t.loc[best, "ratio_mean"]),
        "knee": knee, "gain_knee": float(t.loc[knee, "ratio_mean"]),
        "capped": capped,
        "gain_capped": float(t.loc[capped, "ratio_mean"]) if len(ok) else float("nan"),
        "offpolicy_best": float(o.loc[best, "mean"]),
        "e2e_best": float(e2e.loc[best, "ratio_mean"]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--refit", action="store_true")
    args = ap.parse_args()
    from aprilsim.config import scenario_from_dict

    lines = [
        f"Over-provision ratio {RATIOS[0]}..{RATIOS[-1]}, {args.seeds} seeds, 10 steps "
        "(1 warm-up). "
        "best: highest mean rollout throughput; knee: smallest ratio within 5 % of it; "
        f"capped: best with mean off-policy share <= {OFFPOLICY_CAP:.0%}. gain: rollout throughput "
        "x sync, paired by seed; samples/s: end-to-end trained samples per second x sync.",
        "",
        "| lengths | engines | sync tok/s | scheduler | best (gain, off-policy) | knee (gain) "
        "| capped (gain) | samples/s gain at best |",
        "|---|---|---|---|---|---|---|---|",
    ]
    summary = []
    for tag, lengths, regime, data in cases(args.refit):
        sc = scenario_from_dict(data)
        out = RESULTS / "sweep_ratio" / f"{tag}.parquet"
        print(f"{tag}: {lengths}, {regime}", file=sys.stderr)
        df, stats, plan = run_sweep(sc, [(AXIS, RATIOS)], schedulers=SCHEDULERS,
                                    seeds=args.seeds, jobs=args.jobs, out=out)
        print(f"  {stats['simulated']} simulations in {stats['wall_s']:.0f} s", file=sys.stderr)
        agg = aggregate(df, plan.keys)
        plot_sweep(out, FIGURES / f"sweep_ratio_{tag}.png", x=AXIS[0])
        sync = agg[(agg["scheduler"] == "sync") & (agg["metric"] == "rollout_throughput_tok_s")]
        for sched in SCHEDULERS[1:]:
            b = best_ratios(agg, sched)
            summary.append((tag, lengths, regime, sched, b, agg))
            lines.append(
                f"| {lengths} | {regime} | {sync['mean'].iloc[0]:,.0f} | {sched} | "
                f"{b['best']:g} ({b['gain_best']:.2f}x, {b['offpolicy_best']:.0%}) | "
                f"{b['knee']:g} ({b['gain_knee']:.2f}x) | "
                + (f"{b['capped']:g} ({b['gain_capped']:.2f}x) |" if b['capped'] == b['capped']
                   else "none |")
                + f" {b['e2e_best']:.2f}x |"
            )
    summary_figure(summary, FIGURES / "sweep_ratio_summary.png")
    text = "\n".join(lines) + "\n"
    (RESULTS / "sweep_ratio.md").write_text(text)
    print(text)


def summary_figure(summary, path: Path) -> None:
    """Gain over sync vs ratio for april (left: length models; right: engine regimes) and the
    off-policy share it costs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6), constrained_layout=True)
    for _tag, lengths, regime, sched, _, agg in summary:
        if sched != "april":
            continue
        t = agg[(agg["scheduler"] == "april") & (agg["metric"] == "rollout_throughput_tok_s")]
        t = t.sort_values(AXIS[0])
        o = agg[(agg["scheduler"] == "april") & (agg["metric"] == "offpolicy_token_fraction")]
        o = o.sort_values(AXIS[0])
        x = t[AXIS[0]].to_numpy(dtype=float)
        panels = []
        if regime == "4 engines":
            panels.append((axes[0], lengths))
        if lengths.startswith("default"):
            panels.append((axes[1], regime))
        for ax, lab in panels:
            ax.plot(x, t["ratio_mean"], marker="o", ms=4, label=lab)
            ax.fill_between(x, t["ratio_lo"], t["ratio_hi"], alpha=0.15, lw=0)
        axes[2].plot(x, o["mean"] * 100, marker="o", ms=4, label=f"{lengths}, {regime}")
    axes[0].set_title("(a) april: gain over sync by length model (4 engines)")
    axes[1].set_title("(b) april: gain over sync by engine regime (default lengths)")
    axes[2].set_title("(c) april: off-policy token share")
    for ax in axes[:2]:
        ax.set_ylabel("rollout throughput / sync (x)")
        ax.axhline(1.0, color="0.4", lw=1, ls="--")
    axes[2].set_ylabel("off-policy token share (% of trained tokens)")
    for ax in axes:
        ax.set_xlabel("over-provision ratio")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.savefig(path, dpi=130)
    plt.close(fig)


if __name__ == "__main__":
    main()
