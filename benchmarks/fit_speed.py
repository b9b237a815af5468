"""Benchmark `aprilsim fit`: the default command end to end on 1.4M lengths, against a baseline.

    python benchmarks/fit_speed.py [--json] [--n 1400000] [--bootstrap 200] [--repeat 1]
                                   [--baseline HEAD~1|REF|none] [--cases real,mixture3]

Two 1.4M-row files, written at run time (nothing large is committed):
- `real`: the output lengths of the shared Mooncake chat trace (12,031 requests, capped at 2,000;
  ../shared/data/lengths or $APRILSIM_SHARED_DATA/lengths), resampled to n rows with a 5 %
  log-normal jitter (a smoothed bootstrap: real shape, no artificial lumps; capped responses stay
  at the cap). At this size the empirical law wins by BIC, so its bootstrap is the cheap one.
- `mixture3`: a censored 3-lognormal mixture shaped like a chat serving trace, where the
  3-mixture wins by BIC: the slow path (200 BFGS refits of an 8-parameter model).

Figures, each the CPU seconds (user + system, robust to other load on a shared core) of a child
process, this tree alternating with the baseline commit's: `cli` is `aprilsim fit FILE --json`
with every default (target < 5 s); `split` is the same work in-process, timed per stage (Python
and package import, reading, fitting every family, bootstrap). `ratio` is new / old.
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")  # one core, before numpy loads

import argparse  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from _trees import (  # noqa: E402
    ROOT,
    alternate,
    baseline_tree,
    child_cpu,
    one_core,
    resolve,
    short_commit,
    tree_pair,
)

from aprilsim.workload.lengths import LognormalMixture, cap_lengths  # noqa: E402

TRUTH = LognormalMixture((0.28, 0.29, 0.43), (4.7, 6.76, 7.08), (1.7, 0.55, 0.26))
CAP = 8192
TARGET_S = 5
DEFAULT_BOOTSTRAP = 200
MOONCAKE = "mooncake_conversation_trace.jsonl"
MOONCAKE_CAP = 2000

CLI = "import sys; from aprilsim.cli import main; main(sys.argv[1:])"
SPLIT = """
import json, os, sys
def cpu():
    t = os.times()
    return t[0] + t[1]
c0 = cpu()
from aprilsim.workload.fitting import LengthFitter, read_lengths
import aprilsim.workload.fitting.fitter  # the fitting modules and scipy, as the command loads
c1 = cpu()
data = read_lengths(sys.argv[1])
c2 = cpu()
f = LengthFitter(n_bootstrap=0).fit(data)
c3 = cpu()
f.n_bootstrap = int(sys.argv[2])
bs = f._bootstrap(f.data_) if f.n_bootstrap else {}
c4 = cpu()
print(json.dumps({"start": c0, "import": c1 - c0, "read": c2 - c1, "fit": c3 - c2,
                  "bootstrap": c4 - c3, "best": f.best_.family}))
"""


def shared_data() -> Path:
    env = os.environ.get("APRILSIM_SHARED_DATA")
    return (Path(env) if env else ROOT.parent / "shared" / "data") / "lengths"


def real_sample(n: int) -> np.ndarray:
    """n lengths resampled from the Mooncake trace's outputs with a 5 % log-normal jitter."""
    path = shared_data() / MOONCAKE
    if not path.exists():
        raise SystemExit(f"{path} not found (set APRILSIM_SHARED_DATA, or --cases mixture3)")
    with open(path) as f:
        x = np.array([json.loads(line)["output_length"] for line in f if line.strip()], float)
    rng = np.random.default_rng(0)
    pick = x[rng.integers(0, len(x), n)]
    jit = np.ceil(pick * np.exp(rng.normal(0.0, 0.05, n)) - rng.random(n))
    out = np.where(pick >= MOONCAKE_CAP, MOONCAKE_CAP, np.clip(jit, 1, MOONCAKE_CAP - 1))
    return out.astype(np.int64)


def mixture3_sample(n: int) -> np.ndarray:
    return cap_lengths(TRUTH.rvs(n, np.random.default_rng(0)), CAP)


SAMPLES = {"real": real_sample, "mixture3": mixture3_sample}


def run_tree(tree: Path, path: Path, n_boot: int) -> dict:
    extra = [] if n_boot == DEFAULT_BOOTSTRAP else ["--bootstrap", str(n_boot)]
    cli_cpu, out = child_cpu(["-c", CLI, "fit", str(path), "--json", *extra], tree)
    _, split = child_cpu(["-c", SPLIT, str(path), str(n_boot)], tree)
    return {"cli": cli_cpu, "result": json.loads(out), "split": json.loads(split)}


def summary(runs: list[dict]) -> dict:
    """The least CPU of the repeats for each figure (the run least disturbed by other load)."""
    split = {
        k: min(r["split"][k] for r in runs) for k in ("start", "import", "read", "fit", "bootstrap")
    }
    return {
        "cli": round(min(r["cli"] for r in runs), 2),
        **{k: round(v, 2) for k, v in split.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--n", type=int, default=1_400_000)
    ap.add_argument("--bootstrap", type=int, default=DEFAULT_BOOTSTRAP)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--baseline", default="HEAD~1", help="commit to compare with ('none': off)")
    ap.add_argument("--cases", default="real,mixture3", help="comma-separated: real, mixture3")
    args = ap.parse_args()
    commit = resolve(args.baseline)
    one_core()
    names = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in names if c not in SAMPLES]
    if unknown:
        raise SystemExit(f"unknown cases {unknown}; choose from {', '.join(SAMPLES)}")
    out: dict = {"n": args.n, "bootstrap": args.bootstrap, "target_cpu_s": TARGET_S, "cases": {}}
    with tempfile.TemporaryDirectory() as tmp, baseline_tree(commit) as old:
        trees = tree_pair(old)
        if old is not None:
            out["baseline"] = short_commit(commit)
        for name in names:
            x = SAMPLES[name](args.n)
            path = Path(tmp) / f"{name}.csv"
            path.write_text("response_length\n" + "\n".join(map(str, x.tolist())) + "\n")
            runs = alternate(trees, args.repeat, lambda t, p=path: run_tree(t, p, args.bootstrap))
            result = runs["new"][0]["result"]
            ranking = result["ranking"]
            case = {
                "rows": args.n,
                "best": result["best"],
                "runner_up": ranking[1]["family"],
                "delta_bic_runner_up": round(ranking[1]["delta_bic"], 1),
                "distinct_lengths": result["distinct_lengths"],
                "cap": result["cap"]["max_len"],
                "bootstrap_resamples_ok": result["bootstrap"]["p99"]["n"] if args.bootstrap else 0,
                "p99_ci": [result["bootstrap"]["p99"]["lo"], result["bootstrap"]["p99"]["hi"]]
                if args.bootstrap
                else None,
                "cpu_s": summary(runs["new"]),
            }
            if old is not None:
                case["baseline_cpu_s"] = summary(runs["old"])
                base = runs["old"][0]["result"]
                case["baseline_p99_ci"] = (
                    [base["bootstrap"]["p99"]["lo"], base["bootstrap"]["p99"]["hi"]]
                    if args.bootstrap
                    else None
                )
                case["ratio"] = {
                    k: round(v / case["baseline_cpu_s"][k], 3)
                    for k, v in case["cpu_s"].items()
                    if case["baseline_cpu_s"][k] > 0
                }
            case["under_target"] = case["cpu_s"]["cli"] < TARGET_S
            out["cases"][name] = case
    if args.json:
        print(json.dumps(out))
    else:
        for name, case in out["cases"].items():
            print(f"{name}:")
            for k, v in case.items():
                print(f"  {k:>24}: {v}")


if __name__ == "__main__":
    main()
