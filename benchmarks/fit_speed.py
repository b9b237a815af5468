"""Benchmark `aprilsim fit`: all families on 1,000,000 lengths, one core.

    python benchmarks/fit_speed.py [--json] [--n 1000000] [--bootstrap 200]

Prints `seconds_1m` (LengthFitter.fit with every family and the default 200 bootstrap
resamples; target < 30 s), the same without bootstrap, the time to stream the lengths from a
gzipped JSONL file, and peak memory (traced allocations of a fit from the raw array of 10^6
lengths, and the process's max RSS, which includes the benchmark's own copies of the data).
The lengths are a censored two-lognormal mixture capped at 16,384, like reasoning RL rollouts.
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")  # one core, before numpy loads

import argparse  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from aprilsim.workload.fitting import LengthFitter, read_lengths  # noqa: E402
from aprilsim.workload.lengths import LognormalMixture, cap_lengths  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--bootstrap", type=int, default=200)
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})

    truth = LognormalMixture((0.6, 0.4), (6.0, 8.0), (0.7, 0.6))
    x = cap_lengths(truth.rvs(args.n, np.random.default_rng(0)), 16384)

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "lengths.jsonl.gz"
        with gzip.open(path, "wt", compresslevel=1) as f:
            f.writelines(f'{{"response_length": {v}}}\n' for v in x.tolist())
        t = time.perf_counter()
        data = read_lengths(path)
        read_s = time.perf_counter() - t

    t = time.perf_counter()
    LengthFitter(n_bootstrap=0).fit(data)
    no_boot_s = time.perf_counter() - t

    t = time.perf_counter()
    fitter = LengthFitter(n_bootstrap=args.bootstrap).fit(data)
    seconds = time.perf_counter() - t

    # memory does not grow with the bootstrap; trace a fit from the raw array (histogram included)
    tracemalloc.start()
    LengthFitter(n_bootstrap=5).fit(x)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()

    out = {
        "n": args.n,
        "distinct_lengths": int(len(data.histogram.values)),
        "bins": int(len(fitter.data_.values)),
        "families": len(fitter.results_),
        "bootstrap": args.bootstrap,
        "seconds_1m": round(seconds, 2),
        "seconds_1m_no_bootstrap": round(no_boot_s, 2),
        "seconds_read_jsonl_gz": round(read_s, 2),
        "peak_fit_alloc_mb": round(peak / 2**20, 1),
        "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "best": fitter.best_.family,
        "target_seconds": 30,
    }
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:>26}: {v}")


if __name__ == "__main__":
    main()
