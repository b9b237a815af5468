"""Simulator cost against cluster size: CPU seconds and peak memory per run, and the exponent.

    python benchmarks/sim_scaling.py --json [--engines 64,256,1024,4096] [-s sync -s april]

Each point is E engines x 8E groups of 16 samples per step (the default scenario's 16k cap and
lengths, the presets' engine rules), 5 steps, one scheduler, run in its own process so that its
peak RSS is its own. Prints CPU seconds, created samples per CPU second and peak RSS per point,
and per scheduler the exponent k of cpu ~ E^k fitted over the points (1.0 = linear) and over the
last two. Target (issue 23): 4,096 engines x 32,768 groups x 5 steps in under a minute of CPU:

    python benchmarks/sim_scaling.py --json --engines 256,1024,4096 -s sync -s april

(`target_met` on that point). A run lets go of each group once it is trained or discarded, so a
point's peak memory is about one step's samples (~120 MiB per 1,024 engines for sync).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys

POINT = r"""
import json, resource, sys, time
from aprilsim.config import default_scenario
from aprilsim.sim.run import simulate
engines, name, steps, groups_per_engine = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
sc = default_scenario()
sc = sc.model_copy(update={"batch_size": groups_per_engine * engines, "group_size": 16,
                           "steps": steps,
                           "cluster": sc.cluster.model_copy(update={"engines": engines})})
t = time.process_time()
run = simulate(sc, name)
cpu = time.process_time() - t
print(json.dumps({"cpu_s": cpu, "samples": run.end_state["samples_created"],
                  "trained": run.summary()["trained_samples"],
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


TARGET = (4096, 8, 5, 60.0)  # engines, groups per engine, steps: in under this many CPU seconds


def point(engines: int, name: str, steps: int, per_engine: int, timeout: float) -> dict:
    """One run in a fresh interpreter; its figures."""
    out = subprocess.run([sys.executable, "-c", POINT, str(engines), name, str(steps),
                          str(per_engine)], capture_output=True, text=True, check=True,
                         timeout=timeout)
    return json.loads(out.stdout.strip().splitlines()[-1])


def exponent(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log y against log x."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", default="64,256,1024", help="comma-separated engine counts")
    ap.add_argument("-s", "--scheduler", action="append", default=None, help="default: sync, april")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--groups-per-engine", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per point")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    sizes = [int(x) for x in args.engines.split(",")]
    out: dict = {"steps": args.steps, "groups_per_engine": args.groups_per_engine, "points": []}
    for name in args.scheduler or ["sync", "april"]:
        cpus = []
        for e in sizes:
            p = point(e, name, args.steps, args.groups_per_engine, args.timeout)
            p |= {"scheduler": name, "engines": e, "groups": e * args.groups_per_engine,
                  "samples_per_cpu_s": p["samples"] / p["cpu_s"]}
            if (e, args.groups_per_engine, args.steps) == TARGET[:3]:
                p["target_met"] = p["cpu_s"] < TARGET[3]
            out["points"].append(p)
            cpus.append(p["cpu_s"])
            if not args.json:
                print(f"{name:>8} {e:>5} engines: {p['cpu_s']:8.2f} s CPU, "
                      f"{p['samples_per_cpu_s']:9,.0f} samples/s, {p['peak_rss_mib']:7.0f} MiB")
        if len(sizes) > 1:
            out[f"{name}_exponent"] = round(exponent(sizes, cpus), 3)
            out[f"{name}_exponent_last_two"] = round(exponent(sizes[-2:], cpus[-2:]), 3)
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            if k.endswith(("exponent", "exponent_last_two")):
                print(f"{k}: {v}")


if __name__ == "__main__":
    main()
