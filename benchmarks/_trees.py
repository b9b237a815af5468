"""Helpers of the benchmarks: this tree against an older commit, in child processes.

`baseline_tree(ref)` extracts commit `ref` (default HEAD~1, "the previous commit") into a
temporary folder with `git archive`; `child_cpu` runs a Python command with one tree first on the
path and returns the child's user + system CPU seconds, which other load on a shared core barely
moves (wall time does); `child_json` runs one that leaves a dict of figures, and adds which build
of the simulator ran it. Benchmarks alternate the two trees run by run (`alternate`) so that a
change in load hits both alike, and report each figure as new / old (`versus`: the ratio of the
best runs, and each pair's ratio with their spread).

`SIMULATE` is child code for the simulator benchmarks: `measure(scenario, scheduler, clock)`
times one `simulate` call after a warm-up run (one group, one engine, one step). The first call
imports scipy and more lazily, about 1 s of CPU: a fixed cost, not the simulator's per sample,
which sim_speed's in-process repeats paid only once and which sim_scaling's small points used to
count. An extracted commit is pure Python (git archive holds no compiled modules) while this
tree may be the opt-in mypyc build: each child reports its build
(`aprilsim.native.compiled_modules()`) so that a ratio is read for what it compares.
"""

from __future__ import annotations

import io
import json
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def baseline_tree(ref: str | None) -> Iterator[Path | None]:
    """Commit `ref` of this repository as a folder (None when `ref` is None or "none")."""
    if ref is None or ref.lower() == "none":
        yield None
        return
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", ref, "aprilsim", "real"],
        capture_output=True,
        check=True,
    ).stdout
    with tempfile.TemporaryDirectory(prefix="aprilsim-baseline-") as tmp:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(tmp, filter="data")
        yield Path(tmp)


def tree_pair(old: Path | None) -> dict[str, Path]:
    """The trees a benchmark runs: this one ("new"), and the baseline ("old") when there is one."""
    return {"new": ROOT} if old is None else {"new": ROOT, "old": old}


def resolve(ref: str | None) -> str | None:
    """The commit `ref` names now (None for None or "none"): resolved once, at the start, so that
    a commit made while a benchmark runs changes neither what it extracts nor what it reports."""
    if ref is None or ref.lower() == "none":
        return None
    out = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise SystemExit(f"--baseline {ref}: no such commit")
    return out.stdout.strip()


def short_commit(ref: str) -> str:
    """`git rev-parse --short ref` (the ref itself where git cannot resolve it)."""
    out = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", ref], capture_output=True, text=True
    )
    return out.stdout.strip() or ref


def child_cpu(args: list[str], tree: Path, timeout: float = 600) -> tuple[float, str]:
    """(user + system CPU seconds, stdout) of `python *args` with `tree` first on the path."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(v, "1")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = subprocess.run(  # cwd: `python -c` puts the working folder first on the path
        [sys.executable, *args], env=env, cwd=tree, capture_output=True, text=True, timeout=timeout
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode != 0:
        raise RuntimeError(f"{args[:3]} failed in {tree}: {res.stderr.strip()[-500:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, res.stdout


def one_core() -> None:
    """Pin this process (and so its children) to one core, where the OS allows it."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})


def alternate(trees: dict[str, Path], repeats: int, run: Callable[[Path], T]) -> dict[str, list[T]]:
    """`repeats` results of `run(tree)` per tree, the trees taking turns to go first run by run."""
    runs: dict[str, list[T]] = {t: [] for t in trees}
    for rep in range(repeats):
        for t in list(trees) if rep % 2 == 0 else list(reversed(trees)):
            runs[t].append(run(trees[t]))
    return runs


# appended to child_json's code: the figures it left in `result`, with the build that ran
RESULT_TAIL = """
import json as _json
try:
    from aprilsim.native import compiled_modules as _compiled_modules
except ImportError:  # a commit from before the opt-in compiled build: pure Python
    _compiled_modules = tuple
_mods = _compiled_modules()
result["build"] = {"compiled": bool(_mods), "compiled_modules": len(_mods)}
print(_json.dumps(result))
"""


def child_json(code: str, args: list[str], tree: Path, timeout: float = 600) -> dict:
    """The dict that `code` leaves in `result`, run as `python -c code *args` (`child_cpu`), with
    `"build"`: whether the simulator's per-sample path ran compiled, and how many modules."""
    _, out = child_cpu(["-c", code + RESULT_TAIL, *args], tree, timeout)
    return json.loads(out.strip().splitlines()[-1])


SIMULATE = """
import resource, time
from aprilsim.sim.run import simulate
def measure(sc, name, clock):
    tiny = {"batch_size": 1, "steps": 1, "cluster": sc.cluster.model_copy(update={"engines": 1})}
    simulate(sc.model_copy(update=tiny), name)  # the lazy imports (scipy: ~1 s) are not timed
    tick = time.process_time if clock == "cpu" else time.perf_counter
    t = tick()
    run = simulate(sc, name)
    secs = tick() - t
    s = run.summary()
    return {"secs": secs, "samples": run.end_state["samples_created"],
            "trained": s["trained_samples"], "retractions": s["retractions"],
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
"""


def versus(new: Sequence[float], old: Sequence[float], best: Callable = min) -> dict:
    """new / old: `ratio` of the best run of each (`best`: min for seconds, max for rates), and
    `pairs`, the ratio of run i of each tree (they ran side by side), with their min/median/max."""
    pairs = [a / b for a, b in zip(new, old, strict=True)]
    return {
        "ratio": round(best(new) / best(old), 3),
        "pairs": [round(r, 3) for r in pairs],
        "min": round(min(pairs), 3),
        "median": round(statistics.median(pairs), 3),
        "max": round(max(pairs), 3),
    }


def same_results(runs: dict[str, list[dict]], keys: Sequence[str]) -> bool:
    """True when every run of every tree gave the same `keys` (e.g. samples, trained)."""
    seen = {tuple(r[k] for k in keys) for rs in runs.values() for r in rs}
    return len(seen) == 1


def builds(runs: dict[str, list[dict]]) -> dict[str, dict]:
    """`build` (this tree's) and `baseline_build`: what `child_json` runs of each tree reported."""
    keys = {"new": "build", "old": "baseline_build"}
    return {keys[t]: rs[0]["build"] for t, rs in runs.items() if rs}
