"""The APRIL paper's setups, imported from the APRIL repository's own scripts and simulated.

    python experiments/paper_table.py                   # 5 paired seeds, 50 steps, 10 warm-up
    python experiments/paper_table.py --seeds 2 --steps 12 --warmup 2 --only 'qwen/.*/deepmath'

Every setup the scripts cover (Qwen3-4B and DeepSeek-R1-Distill-Qwen-1.5B x GRPO, DAPO, GSPO x
DAPO-Math-17k, DeepScaleR, DeepMath-103K; tests/data/april/, vendored with the repository's
licence) is imported with `aprilsim.interop.from_slime`: the `-partial` script gives APRIL's
scheduler (`april`, or `april_ds` for DAPO), the script without `-partial` gives the baseline slime
ran (`sync`, or `slime_dapo`: over-sample, abort, discard). Both run on the same seeds (common
random numbers: the same groups), at a steady state (the summary's `settled` is counted), and the
gain is paired per seed: APRIL's rollout tok/s / the baseline's - 1. Published figures sit beside
them: the APRIL README (Qwen3-4B, rollout throughput: +17 % DAPO-Math-17k, +21 % DeepScaleR, +35 %
DeepMath-103K; it does not name the algorithm) and the paper's abstract (+22.5 % on average over
GRPO/DAPO/GSPO, at most +44 %).

Writes experiments/results/paper_table.json and .md; docs/paper_table.md and the README carry the
table. Loaded-machine run time: about two minutes with the defaults.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "tests" / "data" / "april" / "scripts" / "partial_rollout"
OUT = ROOT / "experiments" / "results" / "paper_table"

MODELS = {"qwen": "Qwen3-4B", "deepseek": "R1-Distill-Qwen-1.5B"}
DATASETS = {"dapo": "DAPO-Math-17k", "deepscaler": "DeepScaleR", "deepmath": "DeepMath-103K"}
README = {("qwen", "dapo"): 0.17, ("qwen", "deepscaler"): 0.21, ("qwen", "deepmath"): 0.35}
ABSTRACT_MEAN, ABSTRACT_MAX = 0.225, 0.44


@dataclass
class Setup:
    """One cell of the paper's grid: the APRIL script and the baseline script beside it."""

    family: str  # qwen, deepseek
    algo: str  # grpo, dapo, gspo
    dataset: str  # dapo, deepscaler, deepmath
    partial: Path
    baseline: Path

    @property
    def label(self) -> str:
        return f"{self.family}/{self.algo}/{self.dataset}"


@dataclass
class Row:
    """The simulated figures of one setup, paired by seed."""

    label: str
    model: str
    algorithm: str
    dataset: str
    april: str
    baseline: str
    preset: str
    seeds: list[int]
    gain: list[float] = field(default_factory=list)  # rollout tok/s, per seed
    samples_gain: list[float] = field(default_factory=list)  # trained samples/s, per seed
    sync_gain: list[float] = field(default_factory=list)  # rollout tok/s against sync, per seed
    settled: int = 0  # runs (APRIL and baseline, all seeds) whose summary says settled
    runs: int = 0
    slime_off_policy_ratio: float = 0.0
    offpolicy_token_fraction: float = 0.0
    baseline_waste: float = 0.0  # share of the baseline's generated tokens wasted
    published: float | None = None

    def mean(self, key: str = "gain") -> float:
        return statistics.fmean(getattr(self, key))

    def sd(self, key: str = "gain") -> float:
        xs = getattr(self, key)
        return statistics.stdev(xs) if len(xs) > 1 else 0.0


def find_setups(root: Path = SCRIPTS) -> list[Setup]:
    """The 18 (model, algorithm, dataset) cells, each with its two scripts."""
    out = []
    for partial in sorted(root.rglob("*-partial.sh")):
        family, algo = partial.parts[-3], partial.parts[-2]
        dataset = next(d for d in ("deepmath", "deepscaler", "dapo") if f"-{d}-" in partial.name)
        baseline = partial.with_name(partial.name.replace("-partial", ""))
        out.append(Setup(family, algo, dataset, partial, baseline))
    order = {k: i for i, k in enumerate(["qwen", "deepseek", "grpo", "dapo", "gspo", "deepscaler",
                                         "deepmath"])}
    return sorted(out, key=lambda s: (order[s.family], order[s.algo],
                                      order.get(s.dataset, -1)))


def _scenario(script: Path, steps: int, warmup: int):
    from aprilsim.config import scenario_from_dict
    from aprilsim.interop import from_slime

    data = from_slime(script.read_text()).data
    data["steps"], data["warmup_steps"] = steps, warmup
    return scenario_from_dict(data)


def run_setup(setup: Setup, seeds: list[int], steps: int, warmup: int) -> Row:
    """Simulate APRIL (the -partial script) and the baseline slime ran, paired by seed."""
    from aprilsim.sim.run import simulate

    sc = _scenario(setup.partial, steps, warmup)
    base_sc = _scenario(setup.baseline, steps, warmup)
    april, baseline = sc.compare[-1], base_sc.compare[-1]
    if baseline not in sc.compare:  # the partial script's import names its baseline too
        raise RuntimeError(f"{setup.label}: baseline {baseline} is not in {sc.compare}")
    row = Row(setup.label, MODELS[setup.family], setup.algo.upper(), DATASETS[setup.dataset],
              april, baseline, sc.cluster.preset, seeds,
              published=README.get((setup.family, setup.dataset)))
    opr, off, waste = [], [], []
    for seed in seeds:
        a = simulate(sc, april, seed=seed, settings=sc.settings_for(april)).summary()
        b = simulate(base_sc, baseline, seed=seed,
                     settings=base_sc.settings_for(baseline)).summary()
        row.gain.append(a["rollout_throughput_tok_s"] / b["rollout_throughput_tok_s"] - 1)
        s = b if baseline == "sync" else simulate(base_sc, "sync", seed=seed).summary()
        row.sync_gain.append(a["rollout_throughput_tok_s"] / s["rollout_throughput_tok_s"] - 1)
        row.samples_gain.append(a["samples_per_s"] / b["samples_per_s"] - 1)
        row.settled += int(a["settled"]) + int(b["settled"])
        row.runs += 2
        opr.append(a["slime_off_policy_ratio"])
        off.append(a["offpolicy_token_fraction"])
        waste.append(b["wasted_tokens"] / b["generated_tokens"] if b["generated_tokens"] else 0.0)
    row.slime_off_policy_ratio = statistics.fmean(opr)
    row.offpolicy_token_fraction = statistics.fmean(off)
    row.baseline_waste = statistics.fmean(waste)
    return row


def _pct(x: float | None, sd: float | None = None) -> str:
    if x is None:
        return "-"
    return f"{x:+.1%}" + (f" ± {sd:.1%}" if sd is not None else "")


def markdown(rows: list[Row], meta: dict[str, Any]) -> str:
    """The table of docs/paper_table.md, with the averages against the abstract's figures."""
    head = ("| model | algorithm | dataset | APRIL | baseline slime ran | rollout tok/s gain "
            "| trained samples/s gain | vs sync (tok/s) | published | slime off_policy_ratio "
            "| settled |")
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        lines.append(
            f"| {r.model} | {r.algorithm} | {r.dataset} | `{r.april}` | `{r.baseline}` "
            f"| {_pct(r.mean(), r.sd())} | {_pct(r.mean('samples_gain'), r.sd('samples_gain'))} "
            f"| {_pct(r.mean('sync_gain'))} | {_pct(r.published)} "
            f"| {r.slime_off_policy_ratio:.0%} | {r.settled}/{r.runs} |")
    gains = [r.mean() for r in rows]
    plain = [r.mean() for r in rows if r.algorithm != "DAPO"]
    lines += [
        "",
        f"{meta['seeds']} paired seeds, {meta['steps']} steps of which {meta['warmup']} are left "
        f"out as warm-up; mean over the {len(rows)} setups {statistics.fmean(gains):+.1%} "
        f"(abstract: {ABSTRACT_MEAN:+.1%}), largest {max(gains):+.1%} (abstract: at most "
        f"{ABSTRACT_MAX:+.0%})"
        + (f"; GRPO/GSPO setups only: {statistics.fmean(plain):+.1%}." if plain else "."),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[Row]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5, help="paired seeds (common random numbers)")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--only", default=None,
                    help="a regular expression: run the setups whose label (MODEL/ALGO/DATASET, "
                         "e.g. qwen/grpo/deepmath) it matches")
    ap.add_argument("--out", type=Path, default=OUT, help="writes OUT.json and OUT.md")
    args = ap.parse_args(argv)
    setups = [s for s in find_setups() if args.only is None or re.search(args.only, s.label)]
    seeds = list(range(args.seeds))
    t0, rows = time.time(), []
    for s in setups:
        rows.append(run_setup(s, seeds, args.steps, args.warmup))
        print(f"{s.label}: {rows[-1].mean():+.1%} ({time.time() - t0:.0f} s)", file=sys.stderr)
    meta = {"seeds": args.seeds, "steps": args.steps, "warmup": args.warmup,
            "wall_s": round(time.time() - t0, 1)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(
        {"meta": meta, "rows": [asdict(r) | {"label": r.label} for r in rows]}, indent=1,
        default=str))
    args.out.with_suffix(".md").write_text(markdown(rows, meta))
    print(markdown(rows, meta))
    return rows


if __name__ == "__main__":
    main()
