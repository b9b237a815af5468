"""The Seer paper's setups (arXiv 2511.14617), simulated beside its published figures.

    nice python experiments/seer_table.py            # 3 paired seeds, 3 steps (1 warm-up)
    python experiments/seer_table.py --quick         # an eighth of each setup, 2 seeds (a test)

Seer ran GRPO on H800 GPUs: Moonlight on 32 GPUs (400 prompts x 8 responses, 65,536-token cap),
Qwen2-VL-72B on 128 (600 x 16, 40,960), Kimi-K2 on 256 (800 x 8, 98,304), against veRL, a
synchronous system that dispatches whole groups per instance (`sync@dispatch=group`). It reports
+74 % to +97 % rollout throughput and -75 % to -93 % long-tail latency (v1 abstract; v3: up to
2.04x and -72 % to -94 %), tail latency being the time the last 10 % of a rollout's requests
take to complete. Each setup here: the Seer presets (`aprilsim/engine/seer_presets.py`: roofline
estimates, the instance layouts assumed there), the caps, groups and cluster sizes above, and
response lengths assumed (the paper publishes none): lognormal, median a sixth of the cap, sigma
1.0 (about 3.7 % at the cap), which puts the baseline's last 10 % of requests at 40-50 % of its
rollout, the "up to 50 %" the paper reports for Moonlight and Qwen2-VL-72B.

Rows, each against the baseline on the same seeds (common random numbers; the warm-up step left
out): `seer` (divided rollout of 2,048-token pieces through a Mooncake-style KV pool, context-
aware scheduling) without and with Seer's grouped speculative decoding (`acceptance = "group"`:
accept length 1.70 without the group's context to 2.85 with it, Seer's ablation; k <= 4, more in
the tail), the baseline with the same drafts (what speculative decoding gives without Seer's
scheduling: its siblings' text reaches the draft server only as they finish), and round-robin
sync (slime's routing) for scale. Tail latency is computed both ways:
the paper's (last 10 % of a step's requests, from the 90th to the 100th percentile completion)
and ours (p99 response latency from first submit). Writes experiments/results/seer_table.json
and .md; docs/seer_table.md carries the table.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "experiments" / "results" / "seer_table"

PUBLISHED = {"throughput": (0.74, 0.97), "tail": (-0.93, -0.75)}  # v1 abstract
GROUPED_SD = {"acceptance": "group", "k_max": 4, "draft_budget": 128}


@dataclass(frozen=True)
class Setup:
    """One of the paper's workloads, as it states them, and our instance layout."""

    name: str
    preset: str
    gpus: int
    gpus_per_instance: int
    prompts: int
    group: int
    cap: int

    @property
    def instances(self) -> int:
        return self.gpus // self.gpus_per_instance


SETUPS = [
    Setup("Moonlight", "moonlight-16b-a3b-h800-tp1", 32, 1, 400, 8, 65_536),
    Setup("Qwen2-VL-72B", "qwen2-vl-72b-h800-tp4", 128, 4, 600, 16, 40_960),
    Setup("Kimi-K2", "kimi-k2-h800-ep16", 256, 16, 800, 8, 98_304),
]
VARIANTS: list[tuple[str, str, dict[str, Any], dict[str, Any] | None]] = [
    # label, scheduler, knobs, speculative setting
    ("seer", "seer", {}, None),
    ("seer + grouped speculative decoding", "seer", {}, GROUPED_SD),
    ("sync (veRL's dispatch) + grouped speculative decoding", "sync", {"dispatch": "group"},
     GROUPED_SD),
    ("sync, round robin (slime's routing)", "sync", {}, None),
]
BASELINE = ("sync", {"dispatch": "group"})  # veRL's dispatch


@dataclass
class Row:
    """A variant of a setup against the baseline, per seed."""

    setup: str
    variant: str
    seeds: list[int]
    gain: list[float] = field(default_factory=list)  # rollout tok/s / baseline - 1
    tail: list[float] = field(default_factory=list)  # paper's tail latency / baseline - 1
    p99: list[float] = field(default_factory=list)  # our p99 latency / baseline - 1
    tail_s: list[float] = field(default_factory=list)  # the variant's paper tail, seconds
    base_tail_s: list[float] = field(default_factory=list)
    base_tail_share: list[float] = field(default_factory=list)  # baseline tail / rollout
    busy: list[float] = field(default_factory=list)
    base_busy: list[float] = field(default_factory=list)
    retractions: list[int] = field(default_factory=list)

    @staticmethod
    def stat(xs: list[float]) -> tuple[float, float]:
        return statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0


def scenario(setup: Setup, steps: int, scale: int = 1, speculative: dict | None = None):
    """The setup as a scenario (`scale` > 1 divides the cluster and the batch)."""
    from aprilsim.config import scenario_from_dict

    cluster: dict[str, Any] = {"engines": max(1, setup.instances // scale), "preset": setup.preset}
    if speculative is not None:
        cluster["speculative"] = speculative
    return scenario_from_dict({
        "name": f"seer-{setup.name.lower()}", "steps": steps, "warmup_steps": 1,
        "batch_size": max(1, setup.prompts // scale), "group_size": setup.group,
        "max_response_len": setup.cap, "cluster": cluster,
        "lengths": {"family": "lognormal", "mu": math.log(setup.cap / 6), "sigma": 1.0},
    })


def run_once(sc, name: str, knobs: dict[str, Any], seed: int) -> dict[str, float]:
    """One run's figures over its measured steps: throughput, both tail measures, busy."""
    from aprilsim.sim.build import build_simulation

    sim = build_simulation(sc, name, seed=seed, settings=knobs)
    res = sim.run()
    res.warmup_steps = sc.warmup_steps
    s = res.summary()
    tails, shares = [], []
    for st in res.steps[sc.warmup_steps:]:
        fin = sorted(x.finish_s - st.rollout_start_s for g in sim.groups.values()
                     if g.created_step == st.step for x in g.samples if x.finish_s >= 0)
        t90 = fin[math.ceil(0.9 * len(fin)) - 1]
        tails.append(fin[-1] - t90)
        shares.append((fin[-1] - t90) / st.rollout_time_s)
    return {"tok_s": s["rollout_throughput_tok_s"], "tail_s": statistics.fmean(tails),
            "tail_share": statistics.fmean(shares), "p99_s": s["latency_p99_s"],
            "busy": s["engine_busy_fraction"],
            "retractions": float(sum(r.retractions for r in res.steps))}


def run_setup(setup: Setup, seeds: list[int], steps: int, scale: int) -> list[Row]:
    """Every variant of `setup` and the baseline on the same seeds."""
    base_sc = scenario(setup, steps, scale)
    base = {k: run_once(base_sc, BASELINE[0], BASELINE[1], k) for k in seeds}
    rows = []
    for label, name, knobs, spec in VARIANTS:
        sc = scenario(setup, steps, scale, spec)
        row = Row(setup.name, label, seeds)
        for k in seeds:
            r, b = run_once(sc, name, knobs, k), base[k]
            row.gain.append(r["tok_s"] / b["tok_s"] - 1)
            row.tail.append(r["tail_s"] / b["tail_s"] - 1)
            row.p99.append(r["p99_s"] / b["p99_s"] - 1)
            row.tail_s.append(r["tail_s"])
            row.base_tail_s.append(b["tail_s"])
            row.base_tail_share.append(b["tail_share"])
            row.busy.append(r["busy"])
            row.base_busy.append(b["busy"])
            row.retractions.append(int(r["retractions"]))
        rows.append(row)
        print(f"{setup.name} / {label}: {Row.stat(row.gain)[0]:+.1%}", file=sys.stderr)
    return rows


def _pm(xs: list[float]) -> str:
    m, sd = Row.stat(xs)
    return f"{m:+.1%} ± {sd:.1%}"


def markdown(rows: list[Row], meta: dict[str, Any]) -> str:
    """The table of docs/seer_table.md."""
    lines = ["| setup | variant | rollout tok/s vs veRL-dispatch sync | tail latency (last 10 %) "
             "| p99 latency (ours) | busy (baseline) | baseline tail, s (share of rollout) |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        share = statistics.fmean(r.base_tail_share)
        lines.append(
            f"| {r.setup} | {r.variant} | {_pm(r.gain)} | {_pm(r.tail)} | {_pm(r.p99)} "
            f"| {statistics.fmean(r.busy):.0%} ({statistics.fmean(r.base_busy):.0%}) "
            f"| {statistics.fmean(r.base_tail_s):,.0f} ({share:.0%}) |")
    lo, hi = PUBLISHED["throughput"]
    tlo, thi = PUBLISHED["tail"]
    lines += ["", f"published (Seer v1 abstract, against veRL): rollout throughput {lo:+.0%} to "
              f"{hi:+.0%}, long-tail latency {tlo:+.0%} to {thi:+.0%}. {meta['seeds']} paired "
              "seeds, "
              f"{meta['steps']} steps of which 1 is left out as warm-up"
              + (f"; scaled down {meta['scale']}x" if meta["scale"] > 1 else "") + "."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[Row]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3, help="paired seeds (common random numbers)")
    ap.add_argument("--steps", type=int, default=3, help="steps per run, the first left out")
    ap.add_argument("--quick", action="store_true",
                    help="an eighth of each cluster and batch, 2 seeds, 2 steps (a test)")
    ap.add_argument("--only", default=None, help="run the setups whose name contains this")
    ap.add_argument("--out", type=Path, default=OUT, help="writes OUT.json and OUT.md")
    args = ap.parse_args(argv)
    scale, seeds, steps = (8, 2, 2) if args.quick else (1, args.seeds, args.steps)
    if steps < 2:
        ap.error("--steps must be >= 2 (the first is left out as warm-up)")
    t0, rows = time.time(), []
    for setup in SETUPS:
        if args.only is None or args.only.lower() in setup.name.lower():
            rows += run_setup(setup, list(range(seeds)), steps, scale)
    meta = {"seeds": seeds, "steps": steps, "scale": scale, "wall_s": round(time.time() - t0, 1),
            "setups": [asdict(s) for s in SETUPS], "speculative": GROUPED_SD}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(
        {"meta": meta, "rows": [asdict(r) for r in rows]}, indent=1))
    args.out.with_suffix(".md").write_text(markdown(rows, meta))
    print(markdown(rows, meta))
    return rows


if __name__ == "__main__":
    main()
