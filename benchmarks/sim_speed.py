"""Simulator speed: simulated samples per second of wall time, and fast vs reference engine.

    taskset -c 0 python benchmarks/sim_speed.py --json [--clock cpu] [--repeats 3]
                                                [--baseline HEAD~1|REF|none] [--cluster-steps 20]
                                                [--family sglang|vllm] [--families-only]

Prints one JSON object. Throughputs are samples per second of wall time, both created (every
sample the scheduler asked for) and trained (the samples that reached a training batch):

* `default_*`: the default scenario, every scheduler in its `compare` list;
* `cluster_*`: 64 engines, 512 groups x 16 samples, max 32,768 tokens, 20 steps, APRIL;
* `tight_cluster_*`: the same with a 120,000-token KV cache per engine, so engines retract;
* `speedup_vs_reference`: fast engine over the per-iteration reference engine on a workload that
  retracts, each timed as the best of the same number of repeats, results asserted identical;
* `kv_bound_*`: the same check under the presets' SGLang rules where the KV cache binds (the
  default scenario on 150,000 KV tokens per engine, APRIL at ratio 2, 2 steps: 16k caps crossing
  the 4,096 clip while the queue waits, retractions, re-admissions), every step's records
  asserted equal to 1e-9; the reference is timed once.

* `vllm_vs_sglang_cpu_ratio`: the default scenario (every scheduler in its `compare` list) under
  the `vllm` engine family over the same under `sglang`, in process CPU time, best of `--repeats`
  each, measured in the same run (`vllm_cpu_s`, `sglang_cpu_s`); `--families-only` prints these
  alone.

`--family` runs the default, cluster and reference-check scenarios under that engine family
(`[cluster] family`; the default `sglang` is every preset's); the KV-bound check stays SGLang's.
Each figure is the best of `--repeats` runs (the machine is shared: compare within one run). On a
loaded machine `--clock cpu` times with the process's CPU time instead of wall time, which leaves
out the time the process waits for a core (not the slowdown of sharing one).

Each run of the two cluster scenarios is a fresh child process (the `simulate` call timed in it,
after a tiny warm-up run that does the lazy imports), this tree alternating with the baseline
commit's (`--baseline`, default HEAD~1, the previous commit, extracted with git archive; `none`:
this tree only). `cluster_ratio_vs_baseline` and `tight_cluster_ratio_vs_baseline` are new / old
trained samples per second, best run of each; `*_ratio_spread` gives each alternating pair's ratio
and their min/median/max; `baseline_*` the baseline's own figures; `*_same_results_as_baseline`
whether both gave the same sample counts. `build` and `baseline_build` say which build each side
ran: an extracted commit is always pure Python, so on a compiled (mypyc) install of this tree the
ratio includes the compilation's gain (`APRILSIM_PURE=1` runs this tree pure too).
`--cluster-steps` shortens both cluster scenarios (a smoke run; the figures are then not the
targets').
Targets: >= 50,000 samples/s on the cluster scenario, >= 30x over the reference.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import time

from _trees import (
    SIMULATE,
    alternate,
    baseline_tree,
    builds,
    child_json,
    one_core,
    resolve,
    same_results,
    short_commit,
    tree_pair,
    versus,
)

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

TIGHT_CLUSTER = copy.deepcopy(CLUSTER)
TIGHT_CLUSTER["name"] = "cluster-64-tight-kv"
TIGHT_CLUSTER["cluster"]["kv_capacity"] = 120_000

# 4 engines with 30,000 KV tokens each for 256 samples of ~2,500 tokens: the engines retract
REFERENCE = {
    "name": "reference-check",
    "seed": 3,
    "steps": 4,
    "batch_size": 32,
    "group_size": 8,
    "max_response_len": 8192,
    "cluster": {"engines": 4, "preset": "qwen3-4b-h100-tp2", "kv_capacity": 30000},
    "lengths": {"family": "lognormal", "mu": 7.5, "sigma": 0.9},
    "schedulers": {"april": {"ratio": 1.5}},
}


CLOCK = time.perf_counter


def timed(fn, repeats: int):
    """(result, best time) over `repeats` calls."""
    best, out = math.inf, None
    for _ in range(repeats):
        t = CLOCK()
        out = fn()
        best = min(best, CLOCK() - t)
    return out, best


def rates(runs, secs: float) -> dict[str, float]:
    created = sum(r.end_state["samples_created"] for r in runs)
    trained = sum(r.summary()["trained_samples"] for r in runs)
    return {"created_per_s": created / secs, "trained_per_s": trained / secs}


def bench_default(repeats: int, family: str = "sglang") -> dict[str, float]:
    sc = load_scenario(None)
    sc = sc.model_copy(update={"cluster": sc.cluster.model_copy(update={"family": family})})
    runs, secs = timed(lambda: [simulate(sc, name) for name in sc.compare], repeats)
    return rates(runs, secs) | {"wall_s": secs}


# one cluster run in a child process: argv = the scenario as JSON, the clock ("wall" or "cpu")
CLUSTER_CHILD = SIMULATE + """
import json, sys
from aprilsim.config import scenario_from_dict
result = measure(scenario_from_dict(json.loads(sys.argv[1])), "april", sys.argv[2])
"""


def bench_cluster(spec: dict, trees: dict, repeats: int, clock: str) -> dict[str, list[dict]]:
    """`repeats` runs of APRIL on `spec` per tree, alternating, each in its own process."""
    args = [json.dumps(spec), clock]
    return alternate(trees, repeats, lambda tree: child_json(CLUSTER_CHILD, args, tree))


def cluster_figures(prefix: str, runs: list[dict]) -> dict:
    """The figures of the best (fastest) run, under `prefix` (`cluster`, `baseline_cluster`)."""
    best = min(runs, key=lambda r: r["secs"])
    return {
        f"{prefix}_samples_per_s": round(best["samples"] / best["secs"]),
        f"{prefix}_trained_samples_per_s": round(best["trained"] / best["secs"]),
        f"{prefix}_wall_s": round(best["secs"], 3),
    }


SAME = ("samples", "trained", "retractions")  # what two trees with the same results give alike


def cluster_vs_baseline(name: str, runs: dict[str, list[dict]]) -> dict:
    """new / old trained samples per second (best runs; each pair), the baseline's figures."""
    rate = {t: [r["trained"] / r["secs"] for r in rs] for t, rs in runs.items()}
    ratio = versus(rate["new"], rate["old"], best=max)
    return {
        f"{name}_ratio_vs_baseline": ratio.pop("ratio"),
        f"{name}_ratio_spread": ratio,
        **cluster_figures(f"baseline_{name}", runs["old"]),
        f"{name}_same_results_as_baseline": same_results(runs, SAME),
    }


def with_family(spec: dict, family: str) -> dict:
    """A scenario dict with its engines under `family`'s rules."""
    return spec | {"cluster": spec["cluster"] | {"family": family}}


def bench_families(repeats: int) -> dict[str, float]:
    """The default scenario under vLLM's rules vs SGLang's: process CPU time, best of `repeats`."""
    base = load_scenario(None)
    cpu: dict[str, float] = {}
    for family in ("sglang", "vllm"):
        sc = base.model_copy(update={"cluster": base.cluster.model_copy(
            update={"family": family})})
        best = math.inf
        for _ in range(repeats):
            t = time.process_time()
            for name in sc.compare:
                simulate(sc, name)
            best = min(best, time.process_time() - t)
        cpu[family] = best
    return {"vllm_vs_sglang_cpu_ratio": round(cpu["vllm"] / cpu["sglang"], 2),
            "vllm_cpu_s": round(cpu["vllm"], 3), "sglang_cpu_s": round(cpu["sglang"], 3)}


def bench_reference(repeats: int, family: str = "sglang") -> dict[str, float]:
    """Fast vs reference engine on a retracting workload: identical results, time ratio."""
    sc = scenario_from_dict(with_family(REFERENCE, family))
    fast, t_fast = timed(lambda: simulate(sc, "april"), repeats)
    ref, t_ref = timed(lambda: simulate(sc, "april", engine_factory=ReferenceEngine), repeats)
    a, b = fast.summary(), ref.summary()
    assert a["retractions"] > 0, "the reference check must exercise retraction"
    for key in ("generated_tokens", "trained_tokens", "retractions", "trained_samples",
                "wasted_tokens"):
        assert a[key] == b[key], (key, a[key], b[key])
    for key in ("mean_rollout_time_s", "total_time_s", "engine_busy_fraction"):
        assert math.isclose(a[key], b[key], rel_tol=1e-9), (key, a[key], b[key])
    return {"speedup": t_ref / t_fast, "fast_s": t_fast, "reference_s": t_ref,
            "retractions": a["retractions"]}


def bench_kv_bound() -> dict[str, float]:
    """Fast vs reference under SGLang's rules on a KV-bound cache: every step record equal."""
    sc = load_scenario(None)
    sc = sc.model_copy(update={"cluster": sc.cluster.model_copy(update={"kv_capacity": 150_000})})
    assert sc.engine_spec().sglang_ratio and sc.engine_spec().clip_max_new_tokens > 0
    kw = {"seed": 0, "steps": 2, "settings": {"ratio": 2.0}}
    fast, t_fast = timed(lambda: simulate(sc, "april", **kw), 3)
    ref, t_ref = timed(lambda: simulate(sc, "april", engine_factory=ReferenceEngine, **kw), 1)
    for a, b in zip(fast.steps, ref.steps, strict=True):
        da, db = a.to_dict(), b.to_dict()
        for key, v in da.items():
            w = db[key]
            if isinstance(v, float):
                assert math.isclose(v, w, rel_tol=1e-9, abs_tol=1e-9), (a.step, key, v, w)
            elif isinstance(v, list) and v and isinstance(v[0], float):
                assert all(math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9) for x, y in zip(v, w))
            else:
                assert v == w, (a.step, key, v, w)
    retr = sum(r.retractions for r in fast.steps)
    assert retr > 0, "the KV-bound check must retract"
    return {"speedup": t_ref / t_fast, "fast_s": t_fast, "reference_s": t_ref, "retractions": retr}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--repeats", type=int, default=3, help="best of this many runs per figure")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall", help="what to time with")
    ap.add_argument("--baseline", default="HEAD~1", help="commit to compare with ('none': off)")
    ap.add_argument("--cluster-steps", type=int, default=CLUSTER["steps"],
                    help="steps of the two cluster scenarios (fewer: a smoke run)")
    ap.add_argument("--family", default="sglang", choices=["sglang", "vllm"],
                    help="the engine family the default, cluster and reference runs use")
    ap.add_argument("--families-only", action="store_true",
                    help="only the vllm vs sglang CPU-time figures")
    args = ap.parse_args()
    one_core()
    n = args.repeats
    families = bench_families(n)
    if args.families_only:
        print(json.dumps(families) if args.json else "\n".join(
            f"{k:>36}: {v}" for k, v in families.items()))
        return
    commit = resolve(args.baseline)
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    default = bench_default(n, args.family)
    specs = {name: with_family(spec, args.family)
             for name, spec in (("cluster", CLUSTER), ("tight_cluster", TIGHT_CLUSTER))}
    with baseline_tree(commit) as old:
        trees = tree_pair(old)
        clusters = {
            name: bench_cluster(spec | {"steps": args.cluster_steps}, trees, n, args.clock)
            for name, spec in specs.items()
        }
    ref = bench_reference(n, args.family)
    kvb = bench_kv_bound()
    out = {
        "default_samples_per_s": round(default["created_per_s"]),
        "default_trained_samples_per_s": round(default["trained_per_s"]),
        **cluster_figures("cluster", clusters["cluster"]["new"]),
        **cluster_figures("tight_cluster", clusters["tight_cluster"]["new"]),
        "tight_cluster_retractions": clusters["tight_cluster"]["new"][0]["retractions"],
        "speedup_vs_reference": round(ref["speedup"], 1),
        "reference_check_fast_s": round(ref["fast_s"], 4),
        "reference_check_reference_s": round(ref["reference_s"], 3),
        "reference_check_retractions": ref["retractions"],
        "kv_bound_speedup_vs_reference": round(kvb["speedup"], 1),
        "kv_bound_fast_s": round(kvb["fast_s"], 4),
        "kv_bound_reference_s": round(kvb["reference_s"], 3),
        "kv_bound_retractions": kvb["retractions"],
        "repeats": n,
        "clock": args.clock,
        "cluster_steps": args.cluster_steps,
        "family": args.family,
        **families,
        **builds(clusters["cluster"]),
    }
    if "old" in trees:
        out["baseline"] = short_commit(commit)
        for name, runs in clusters.items():
            out |= cluster_vs_baseline(name, runs)
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:>36}: {v}")


if __name__ == "__main__":
    main()
