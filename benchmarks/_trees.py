"""Helpers of the start-up and fit benchmarks: this tree against an older commit, in child processes.

`baseline_tree(ref)` extracts commit `ref` (default HEAD~1, "the previous commit") into a
temporary folder with `git archive`; `child_cpu` runs a Python command with one tree first on the
path and returns the child's user + system CPU seconds, which other load on a shared core barely
moves (wall time does). Benchmarks alternate the two trees run by run so that a change in load
hits both alike, and report each figure as new / old.
"""

from __future__ import annotations

import io
import os
import resource
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

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


def short_commit(ref: str) -> str:
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
