"""Benchmark `aprilsim fit`: the default command end to end on 1.4M lengths whose best model is
a 3-lognormal mixture (the slow path: 200 bootstrap refits of the 3-mixture), on one core.

    taskset -c 0 python benchmarks/fit_speed.py [--json] [--n 1400000] [--bootstrap 200] [--compare]

The sample is drawn from a censored 3-lognormal mixture shaped like a chat serving trace (a broad
short-answer component and two overlapping long ones, capped at 8,192), so that the 3-mixture wins
by BIC over the 2-mixture and the empirical law (the benchmark checks it and reports the margin).

Figures: `seconds_default_cli` (wall) and `cpu_seconds_default_cli` (user + system of the child
process: robust to other load on a shared core) of `aprilsim fit sample.csv --json` with every
default (all families, cap detection, 200 resamples), target < 30 s; the in-process fit without
bootstrap; reading the CSV; peak memory. `--compare` also times the bootstrap alone under the
speed-up ideas (finite-difference vs analytic gradient, bins for the likelihood) in the same run,
with the width of the p99 interval each gives, so a speed-up that weakens the intervals shows.
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")  # one core, before numpy loads

import argparse  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from aprilsim.workload.fitting import LengthFitter, read_lengths  # noqa: E402
from aprilsim.workload.fitting import fitter as fitter_module  # noqa: E402
from aprilsim.workload.lengths import LognormalMixture, cap_lengths  # noqa: E402

TRUTH = LognormalMixture((0.28, 0.29, 0.43), (4.7, 6.76, 7.08), (1.7, 0.55, 0.26))
CAP = 8192
TARGET_S = 30
DEFAULT_BOOTSTRAP = 200


def sample(n: int) -> np.ndarray:
    return cap_lengths(TRUTH.rvs(n, np.random.default_rng(0)), CAP)


def time_cli(path: Path, n_boot: int) -> tuple[float, float, dict]:
    """Wall and CPU seconds of the default `aprilsim fit --json` in a child process (other
    bootstrap sizes only for quick checks)."""
    extra = [] if n_boot == DEFAULT_BOOTSTRAP else ["--bootstrap", str(n_boot)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    res = subprocess.run(
        [
            sys.executable,
            "-c",
            "from aprilsim.cli import main; main()",
            "fit",
            str(path),
            "--json",
            *extra,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, json.loads(res.stdout)


def time_bootstrap(data, n_boot: int, use_gradient: bool, max_bins: int) -> dict:
    """CPU seconds of the bootstrap alone (the full-data fit done first, not timed)."""
    original = fitter_module.maximise

    def patched(*args, **kwargs):
        kwargs["use_gradient"] = use_gradient
        return original(*args, **kwargs)

    fitter_module.maximise = patched
    try:
        f = LengthFitter(families=["lognormal_mixture3"], n_bootstrap=0, max_bins=max_bins)
        f.fit(data)
        f.n_bootstrap = n_boot
        t = time.process_time()
        bs = f._bootstrap(f.data_)
        seconds = time.process_time() - t
    finally:
        fitter_module.maximise = original
    return {
        "cpu_seconds": round(seconds, 2),
        "bins": int(len(f.data_.values)),
        "p99_ci_width": round(bs["p99"]["hi"] - bs["p99"]["lo"], 1),
        "p90_ci_width": round(bs["p90"]["hi"] - bs["p90"]["lo"], 1),
        "ok_resamples": bs["p99"]["n"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--n", type=int, default=1_400_000)
    ap.add_argument("--bootstrap", type=int, default=DEFAULT_BOOTSTRAP)
    ap.add_argument("--compare", action="store_true", help="also time the speed-up ideas")
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):  # the child process inherits the single core
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})

    x = sample(args.n)
    out: dict = {"n": args.n, "cap": CAP}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "lengths.csv"
        path.write_text("response_length\n" + "\n".join(map(str, x.tolist())) + "\n")
        t = time.perf_counter()
        data = read_lengths(path)
        out["seconds_read_csv"] = round(time.perf_counter() - t, 2)
        wall, cpu, result = time_cli(path, args.bootstrap)
    ranking = result["ranking"]
    out.update(
        {
            "seconds_default_cli": round(wall, 2),
            "cpu_seconds_default_cli": round(cpu, 2),
            "target_seconds": TARGET_S,
            "best": result["best"],
            "runner_up": ranking[1]["family"],
            "delta_bic_runner_up": round(ranking[1]["delta_bic"], 1),
            "distinct_lengths": result["distinct_lengths"],
            "bootstrap": args.bootstrap,
            "bootstrap_resamples_ok": result["bootstrap"]["p99"]["n"],
            "p99_ci": [result["bootstrap"]["p99"]["lo"], result["bootstrap"]["p99"]["hi"]],
        }
    )

    t = time.process_time()
    LengthFitter(n_bootstrap=0).fit(data)
    out["cpu_seconds_fit_no_bootstrap"] = round(time.process_time() - t, 2)

    tracemalloc.start()  # memory does not grow with the bootstrap: trace a short one
    LengthFitter(n_bootstrap=5).fit(x)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    out["peak_fit_alloc_mb"] = round(peak / 2**20, 1)
    out["max_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)

    if args.compare:
        n = args.bootstrap
        out["bootstrap_compare"] = {
            "finite_difference_2048_bins": time_bootstrap(data, n, False, 2048),
            "analytic_gradient_2048_bins": time_bootstrap(data, n, True, 2048),
            "analytic_gradient_512_bins": time_bootstrap(data, n, True, 512),
            "analytic_gradient_8192_bins": time_bootstrap(data, n, True, 8192),
        }
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:>30}: {v}")


if __name__ == "__main__":
    main()
