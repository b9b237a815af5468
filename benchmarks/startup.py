"""Benchmark start-up: CPU seconds until each command reaches its first line of work.

    python benchmarks/startup.py [--json] [--repeat 5] [--baseline HEAD~1|REF|none]

Cases: `aprilsim --help`, `simulate --help`, `fit --help`, `run --help`, `validate --help`,
`sweep --help`, and two commands up to their first line of work: `simulate` (default scenario)
stopped where the simulator is called, and `fit FILE` stopped where the file starts to be read.
The stop is a patch applied in the child after importing the module that the command itself
imports, so the child loads exactly what the
command loads. Each figure is the least CPU (user + system) of `--repeat` child processes, this
tree alternating with the baseline commit's; `ratio` is new / old. Target: < 0.5 s each.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from _trees import baseline_tree, child_cpu, one_core, resolve, short_commit, tree_pair

TARGET_S = 0.5
CLI = "import sys; from aprilsim.cli import main; main(sys.argv[1:])"
# patch the function a command calls first, then run the command: it stops there
STOP = (
    "import os, sys, importlib\n"
    "mod = importlib.import_module(sys.argv[1])\n"
    "def stop(*a, **k):\n"
    "    print('reached', flush=True)\n"
    "    os._exit(0)\n"
    "setattr(mod, sys.argv[2], stop)\n"
    "from aprilsim.cli import main\n"
    "main(sys.argv[3:])\n"
)


def cases(lengths_file: Path) -> dict[str, list[str]]:
    return {
        "help": ["-c", CLI, "--help"],
        "simulate_help": ["-c", CLI, "simulate", "--help"],
        "fit_help": ["-c", CLI, "fit", "--help"],
        "run_help": ["-c", CLI, "run", "--help"],
        "validate_help": ["-c", CLI, "validate", "--help"],
        "sweep_help": ["-c", CLI, "sweep", "--help"],
        "simulate_to_work": ["-c", STOP, "aprilsim.sim.run", "simulate", "simulate"],
        "fit_to_work": [
            "-c",
            STOP,
            "aprilsim.workload.fitting.api",
            "read_lengths",
            "fit",
            str(lengths_file),
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--baseline", default="HEAD~1", help="commit to compare with ('none': off)")
    args = ap.parse_args()
    commit = resolve(args.baseline)
    one_core()
    with tempfile.TemporaryDirectory() as tmp, baseline_tree(commit) as old:
        lengths_file = Path(tmp) / "lengths.csv"
        lengths_file.write_text("response_length\n" + "\n".join(map(str, range(1, 200))) + "\n")
        trees = tree_pair(old)
        runs: dict[str, dict[str, list[float]]] = {t: {} for t in trees}
        for rep in range(args.repeat):
            order = list(trees) if rep % 2 == 0 else list(reversed(trees))
            for name, argv in cases(lengths_file).items():
                for t in order:
                    cpu, out = child_cpu(argv, trees[t])
                    if name.endswith("_to_work") and "reached" not in out:
                        raise RuntimeError(f"{name}: the command never reached its work ({t})")
                    runs[t].setdefault(name, []).append(cpu)
    out: dict = {"target_cpu_s": TARGET_S, "repeat": args.repeat, "cpu_s": {}, "median_cpu_s": {}}
    for name, v in runs["new"].items():
        out["cpu_s"][name] = round(min(v), 3)
        out["median_cpu_s"][name] = round(statistics.median(v), 3)
    if "old" in runs:
        out["baseline"] = short_commit(commit)
        out["baseline_cpu_s"] = {n: round(min(v), 3) for n, v in runs["old"].items()}
        out["ratio"] = {
            n: round(min(runs["new"][n]) / min(v), 3) for n, v in runs["old"].items() if min(v) > 0
        }
    out["under_target"] = all(v < TARGET_S for v in out["cpu_s"].values())
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:>16}: {v}")


if __name__ == "__main__":
    main()
