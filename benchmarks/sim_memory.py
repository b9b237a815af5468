"""Simulator cost and memory over a long run: CPU seconds, peak RSS, and per-step cost early vs
late.

    taskset -c 0 python benchmarks/sim_memory.py --json [--groups 1024] [--steps 100]
                                                 [-s sync -s april] [--baseline REF|none]

Each point is the default scenario (4 engines, 8 samples per group) with `--groups` groups per
training step, run for `--steps` steps by one scheduler in a fresh interpreter, so that its peak
RSS is its own. Prints per point the run's CPU seconds, its peak RSS, the resident memory after
step 10 and after the last step, and the mean CPU per step over steps 6-15 ("at step 10") and
over the last 10 steps ("at the end"): a late/early ratio near 1 says the cost per step is flat,
equal RSS figures that memory is bounded in steps. With `--baseline REF` each point also runs on
commit REF (alternating, in the same session) and reports new/old ratios.
Target (issue 23): 1,024 groups x 100 steps in under 2 minutes of CPU, peak RSS under 500 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _trees import ROOT, baseline_tree, short_commit  # noqa: E402

POINT = r"""
import json, resource, sys, time
from aprilsim.config import default_scenario
from aprilsim.sim.run import simulate
groups, steps, name = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
sc = default_scenario().model_copy(update={"batch_size": groups, "steps": steps})
page = resource.getpagesize()
marks = []  # (CPU seconds, resident MiB) after each training step
def progress(done, total):
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * page / 2**20
    marks.append((time.process_time(), rss))
t0 = time.process_time()
run = simulate(sc, name, progress=progress)
cpu = time.process_time() - t0
def per_step(lo, hi):  # mean CPU of steps lo..hi (1-based)
    lo, hi = max(lo, 2), min(hi, len(marks))
    return (marks[hi - 1][0] - marks[lo - 2][0]) / (hi - lo + 1)
n = len(marks)
print(json.dumps({
    "cpu_s": cpu, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "rss_step10_mib": marks[min(10, n) - 1][1], "rss_end_mib": marks[-1][1],
    "step_cpu_s_at_10": per_step(6, 15), "step_cpu_s_at_end": per_step(n - 9, n),
    "trained": run.summary()["trained_samples"], "samples": run.end_state["samples_created"]}))
"""


def point(tree: Path, groups: int, steps: int, name: str, timeout: float) -> dict:
    """One run in a fresh interpreter with `tree` first on the path; its figures."""
    out = subprocess.run(
        [sys.executable, "-c", POINT, str(groups), str(steps), name],
        capture_output=True, text=True, check=True, cwd=tree, timeout=timeout,
        env=dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1"),
    )
    p = json.loads(out.stdout.strip().splitlines()[-1])
    p["step_cost_late_over_early"] = p["step_cpu_s_at_end"] / p["step_cpu_s_at_10"]
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in p.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=1024, help="groups per training step")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("-s", "--scheduler", action="append", default=None, help="default: sync, april")
    ap.add_argument("--baseline", default="none", help="commit to compare with (default: none)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    out: dict = {"groups": args.groups, "steps": args.steps, "engines": 4, "points": []}
    with baseline_tree(args.baseline) as old:
        if old is not None:
            out["baseline"] = short_commit(args.baseline)
        for name in args.scheduler or ["sync", "april"]:
            p = {"scheduler": name, **point(ROOT, args.groups, args.steps, name, args.timeout)}
            if old is not None:
                b = point(old, args.groups, args.steps, name, args.timeout)
                p["baseline"] = b
                p["ratio"] = {k: round(p[k] / b[k], 3) for k in ("cpu_s", "peak_rss_mib")}
            out["points"].append(p)
            if not args.json:
                print(f"{name:>8}: {p['cpu_s']:7.1f} s CPU, peak RSS {p['peak_rss_mib']:6.0f} MiB "
                      f"(after step 10: {p['rss_step10_mib']:.0f}, at the end: "
                      f"{p['rss_end_mib']:.0f}); CPU per step {p['step_cpu_s_at_10']:.3f} s at "
                      f"step 10, {p['step_cpu_s_at_end']:.3f} s at the end "
                      f"(x{p['step_cost_late_over_early']:.2f})"
                      + (f"; vs {out['baseline']}: CPU x{p['ratio']['cpu_s']}, "
                         f"RSS x{p['ratio']['peak_rss_mib']}" if old is not None else ""))
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
