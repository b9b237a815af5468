"""Where runs execute: in this process, in a local process pool, or as Ray tasks.

Each executor yields (run index, metrics) as runs finish, in completion order, so the caller can
journal every finished run at once. Closing the generator (Ctrl-C, an error) cancels what has not
started.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any

import aprilsim.sweep.worker as worker
from aprilsim.sweep.plan import Plan, Run

Result = tuple[int, dict[str, Any]]


def default_jobs() -> int:
    """The CPUs this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _tasks(runs: list[Run]) -> list[tuple]:
    return [(i, r.point_id, r.overrides, r.scheduler, r.seed) for i, r in enumerate(runs)]


def in_process(plan: Plan, runs: list[Run]) -> Iterator[Result]:
    """One after another in this process (jobs=1): no start-up cost at all."""
    worker.init(plan.base, plan.base_dir, plan.fingerprint(), ignore_sigint=False)
    for task in _tasks(runs):
        yield worker.run_task(task)


def local_pool(plan: Plan, runs: list[Run], jobs: int) -> Iterator[Result]:
    """A pool of `jobs` processes; forked where the platform allows (no re-import per worker).

    At most 2 x jobs tasks are queued at a time, so Ctrl-C has little to cancel and the order of
    completion follows the order of the runs (points outermost).
    """
    if jobs <= 1 or len(runs) <= 1:
        yield from in_process(plan, runs)
        return
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    ex = ProcessPoolExecutor(
        max_workers=min(jobs, len(runs)),
        mp_context=mp.get_context(method),
        initializer=worker.init,
        initargs=(plan.base, plan.base_dir, plan.fingerprint()),
    )
    todo = iter(_tasks(runs))
    pending: set = set()
    try:
        for task in todo:
            pending.add(ex.submit(worker.run_task, task))
            if len(pending) >= 2 * jobs:
                break
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                yield fut.result()
                nxt = next(todo, None)
                if nxt is not None:
                    pending.add(ex.submit(worker.run_task, nxt))
    finally:
        for fut in pending:
            fut.cancel()
        ex.shutdown(wait=True, cancel_futures=True)


def on_ray(plan: Plan, runs: list[Run], address: str | None) -> Iterator[Result]:
    """Ray tasks (one CPU each) on the cluster at `address` ("auto": the running one).

    When Ray is already initialised in this process (a notebook, a test) that session is used.
    The base scenario is put in the object store once; each task carries only its overrides.
    """
    try:
        import ray
    except ImportError:
        raise ValueError("--ray needs ray: pip install 'aprilsim[sweep]'") from None
    if not ray.is_initialized():
        try:
            ray.init(address=address or "auto", include_dashboard=False, log_to_driver=False)
        except Exception as e:  # Ray raises ConnectionError, RuntimeError, ... by version
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ValueError(f"--ray: cannot connect to a Ray cluster at {address or 'auto'}: "
                             f"{first}") from None
    remote = ray.remote(num_cpus=1)(worker.ray_task)
    base = ray.put(plan.base)
    fp = plan.fingerprint()
    pending = {remote.remote(base, plan.base_dir, fp, t): t[0] for t in _tasks(runs)}
    try:
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                pending.pop(ref)
                yield ray.get(ref)
    finally:
        for ref in pending:
            ray.cancel(ref)
