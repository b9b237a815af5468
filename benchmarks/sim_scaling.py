"""Simulator cost against cluster size: CPU seconds and peak memory per run, and the exponent.

    python benchmarks/sim_scaling.py --json [--engines 64,256,1024,4096] [-s sync -s april]
                                     [--steps 5] [--repeats 1] [--baseline HEAD~1|REF|none]

Each point is E engines x 8E groups of 16 samples per step (the default scenario's 16k cap and
lengths, the presets' engine rules), 5 steps, one scheduler, run in its own process so that its
peak RSS is its own; the run is timed after a tiny warm-up run that does the lazy imports (about
1 s of CPU that earlier versions of this benchmark counted in each point). Prints CPU seconds,
created samples per CPU second and peak RSS per point, and per scheduler the exponent k of
cpu ~ E^k fitted over the points (1.0 = linear) and over the last two. Target (issue 23):
4,096 engines x 32,768 groups x 5 steps in under a minute of CPU:

    python benchmarks/sim_scaling.py --json --engines 256,1024,4096 -s sync -s april

(`target_met` on that point). A run lets go of each group once it is trained or discarded, so a
point's peak memory is about one step's samples (~120 MiB per 1,024 engines for sync).

Each point also runs on the baseline commit (`--baseline`, default HEAD~1, the previous commit,
extracted with git archive; `none`: off), each run its own process, the two trees alternating
`--repeats` times: per point `cpu_ratio_vs_baseline` is new / old CPU seconds (least of each;
below 1 = faster), `cpu_ratio_spread` each pair's ratio with their min/median/max, and
`baseline_cpu_s`, `baseline_peak_rss_mib` the baseline's own; per scheduler
`<name>_baseline_exponent`. `build` and `baseline_build` say which build each side ran: an
extracted commit is always pure Python, so on a compiled (mypyc) install of this tree the ratio
includes the compilation's gain (`APRILSIM_PURE=1` runs this tree pure too).
"""

from __future__ import annotations

import argparse
import json
import math

from _trees import (
    SIMULATE,
    alternate,
    baseline_tree,
    builds,
    child_json,
    resolve,
    same_results,
    short_commit,
    tree_pair,
    versus,
)

# one point: argv = engines, scheduler, steps, groups per engine
POINT = SIMULATE + r"""
import sys
from aprilsim.config import default_scenario
engines, name, steps, groups_per_engine = (int(sys.argv[1]), sys.argv[2], int(sys.argv[3]),
                                           int(sys.argv[4]))
sc = default_scenario()
sc = sc.model_copy(update={"batch_size": groups_per_engine * engines, "group_size": 16,
                           "steps": steps,
                           "cluster": sc.cluster.model_copy(update={"engines": engines})})
result = measure(sc, name, "cpu")
"""


TARGET = (4096, 8, 5, 60.0)  # engines, groups per engine, steps: in under this many CPU seconds


def point_runs(trees: dict, engines: int, name: str, args: argparse.Namespace) -> dict:
    """`args.repeats` runs of one point per tree, alternating, each in a fresh interpreter."""
    argv = [str(engines), name, str(args.steps), str(args.groups_per_engine)]
    return alternate(trees, args.repeats,
                     lambda tree: child_json(POINT, argv, tree, timeout=args.timeout))


def figures(runs: list[dict]) -> dict:
    """A point's figures over its repeats: the least CPU, the largest peak RSS."""
    cpu = min(r["secs"] for r in runs)
    return {"cpu_s": cpu, "samples": runs[0]["samples"], "trained": runs[0]["trained"],
            "peak_rss_mib": max(r["peak_rss_mib"] for r in runs)}


def vs_baseline(runs: dict[str, list[dict]]) -> dict:
    """new / old CPU seconds of a point (least of each; each pair) and the baseline's figures."""
    ratio = versus([r["secs"] for r in runs["new"]], [r["secs"] for r in runs["old"]])
    old = figures(runs["old"])
    return {"cpu_ratio_vs_baseline": ratio.pop("ratio"), "cpu_ratio_spread": ratio,
            "baseline_cpu_s": old["cpu_s"], "baseline_peak_rss_mib": old["peak_rss_mib"],
            "same_results_as_baseline": same_results(runs, ("samples", "trained"))}


def exponent(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log y against log x."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def exponents(key: str, sizes: list[int], cpus: list[float]) -> dict[str, float]:
    """`key`'s exponent over all points and over the last two."""
    return {key: round(exponent(sizes, cpus), 3),
            f"{key}_last_two": round(exponent(sizes[-2:], cpus[-2:]), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", default="64,256,1024", help="comma-separated engine counts")
    ap.add_argument("-s", "--scheduler", action="append", default=None, help="default: sync, april")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--groups-per-engine", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=1, help="runs per point and tree (least CPU)")
    ap.add_argument("--baseline", default="HEAD~1", help="commit to compare with ('none': off)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per run")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    commit = resolve(args.baseline)
    sizes = [int(x) for x in args.engines.split(",")]
    out: dict = {"steps": args.steps, "groups_per_engine": args.groups_per_engine,
                 "repeats": args.repeats, "points": []}
    with baseline_tree(commit) as old:
        trees = tree_pair(old)
        if old is not None:
            out["baseline"] = short_commit(commit)
        for name in args.scheduler or ["sync", "april"]:
            cpus: dict[str, list[float]] = {t: [] for t in trees}
            for e in sizes:
                runs = point_runs(trees, e, name, args)
                p = figures(runs["new"])
                p |= {"scheduler": name, "engines": e, "groups": e * args.groups_per_engine,
                      "samples_per_cpu_s": p["samples"] / p["cpu_s"]}
                if (e, args.groups_per_engine, args.steps) == TARGET[:3]:
                    p["target_met"] = p["cpu_s"] < TARGET[3]
                if old is not None:
                    p |= vs_baseline(runs)
                out["points"].append(p)
                out |= builds(runs)
                for t, rs in runs.items():
                    cpus[t].append(min(r["secs"] for r in rs))
                if not args.json:
                    print(f"{name:>8} {e:>5} engines: {p['cpu_s']:8.2f} s CPU, "
                          f"{p['samples_per_cpu_s']:9,.0f} samples/s, "
                          f"{p['peak_rss_mib']:7.0f} MiB"
                          + (f", x{p['cpu_ratio_vs_baseline']} CPU vs {out['baseline']}"
                             if old is not None else ""))
            if len(sizes) > 1:
                out |= exponents(f"{name}_exponent", sizes, cpus["new"])
                if old is not None:
                    out |= exponents(f"{name}_baseline_exponent", sizes, cpus["old"])
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            if "exponent" in k:
                print(f"{k}: {v}")


if __name__ == "__main__":
    main()
