"""Simulator speed: simulated samples per second of wall time, and fast vs reference engine.

    python benchmarks/sim_speed.py --json

Prints one JSON object: `default_samples_per_s` (the default scenario, every scheduler in its
`compare` list), `cluster_samples_per_s` (64 engines, 512 groups x 16 samples, max 32,768 tokens,
20 steps, APRIL), and `speedup_vs_reference` (fast engine over the per-iteration reference engine
on the same workload, results asserted identical). Run it on one core (taskset -c 0) to compare
with the targets: >= 50,000 samples/s on the cluster scenario, >= 30x over the reference.
"""

from __future__ import annotations

import argparse
import json
import math
import time

from aprilsim.config import load_scenario, scenario_from_dict
from aprilsim.engine.reference import ReferenceEngine
from aprilsim.sim.run import simulate

CLUSTER = {
    "name": "cluster-64",
    "seed": 1,
    "steps": 20,
    "batch_size": 512,
    "group_size": 16,
    "max_response_len": 32768,
    "cluster": {"engines": 64, "preset": "qwen3-4b-h100-tp2"},
    "lengths": {
        "family": "lognormal_mixture",
        "weights": [0.7, 0.3],
        "mus": [7.313, 8.854],
        "sigmas": [0.6, 0.7],
    },
    "schedulers": {"april": {"ratio": 2.0}},
}

REFERENCE = {
    "name": "reference-check",
    "seed": 3,
    "steps": 3,
    "batch_size": 16,
    "group_size": 8,
    "max_response_len": 8192,
    "cluster": {"engines": 2, "preset": "qwen3-4b-h100-tp2", "kv_capacity": 120000},
    "lengths": {"family": "lognormal", "mu": 7.5, "sigma": 0.9},
    "schedulers": {"april": {"ratio": 1.5}},
}


def _samples(run) -> int:
    return run.end_state["samples_created"]


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def bench_default() -> float:
    sc = load_scenario(None)
    total, secs = 0, 0.0
    for name in sc.compare:
        run, dt = timed(lambda name=name: simulate(sc, name))
        total += _samples(run)
        secs += dt
    return total / secs


def bench_cluster() -> tuple[float, float]:
    sc = scenario_from_dict(CLUSTER)
    run, dt = timed(lambda: simulate(sc, "april"))
    return _samples(run) / dt, dt


def bench_reference() -> tuple[float, float, float]:
    sc = scenario_from_dict(REFERENCE)
    fast, t_fast = min((timed(lambda: simulate(sc, "april")) for _ in range(3)), key=lambda x: x[1])
    ref, t_ref = timed(lambda: simulate(sc, "april", engine_factory=ReferenceEngine))
    a, b = fast.summary(), ref.summary()
    for key in ("generated_tokens", "trained_tokens", "retractions", "trained_samples"):
        assert a[key] == b[key], (key, a[key], b[key])
    for key in ("mean_rollout_time_s", "total_time_s"):
        assert math.isclose(a[key], b[key], rel_tol=1e-9), (key, a[key], b[key])
    return t_ref / t_fast, t_fast, t_ref


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    default = bench_default()
    cluster, cluster_s = bench_cluster()
    speedup, t_fast, t_ref = bench_reference()
    out = {
        "default_samples_per_s": round(default),
        "cluster_samples_per_s": round(cluster),
        "cluster_wall_s": round(cluster_s, 3),
        "speedup_vs_reference": round(speedup, 1),
        "reference_check_fast_s": round(t_fast, 3),
        "reference_check_reference_s": round(t_ref, 3),
    }
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:>30}: {v}")


if __name__ == "__main__":
    main()
