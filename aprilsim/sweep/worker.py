"""The worker side of a sweep: one run in, one flat row of metrics out.

The base scenario travels once per worker (`init`, or a Ray object reference), and each task
carries only its overrides, scheduler and seed. A worker validates each point once (pydantic
field validation; the cross-field `check()` ran in the parent when the sweep was planned) and keeps
it for the other seeds and schedulers of that point.
"""

from __future__ import annotations

import signal
import time
from typing import Any

from aprilsim.config import Scenario
from aprilsim.sweep.keys import apply

_state: dict[str, Any] = {"fingerprint": None, "base": None, "base_dir": ".", "points": {}}
_CACHE_POINTS = 64


def init(base: dict[str, Any], base_dir: str, fingerprint: str, *,
         ignore_sigint: bool = True) -> None:
    """Receive the base scenario (once per worker). Workers leave Ctrl-C to the parent."""
    if ignore_sigint:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the parent's "act like Ctrl-C"
    _state.update(fingerprint=fingerprint, base=base, base_dir=base_dir, points={})


def _scenario(point_id: str, overrides) -> Scenario:
    cache = _state["points"]
    sc = cache.get(point_id)
    if sc is None:
        data = apply(_state["base"], overrides)
        data["base_dir"] = _state["base_dir"]
        sc = Scenario.model_validate(data)
        if len(cache) >= _CACHE_POINTS:
            cache.pop(next(iter(cache)))
        cache[point_id] = sc
    return sc


def flatten(summary: dict[str, Any]) -> dict[str, Any]:
    """A summary row with only scalar columns.

    `staleness_histogram` (staleness -> trained tokens) becomes `mean_staleness`, the
    token-weighted mean; `engine_busy_fraction_by_engine` becomes its min and max over engines;
    `engine_time_s` one `engine_time_<part>_s` column per part.
    """
    row = dict(summary)
    hist = row.pop("staleness_histogram", {}) or {}
    tokens = sum(hist.values())
    row["mean_staleness"] = sum(int(k) * v for k, v in hist.items()) / tokens if tokens else 0.0
    by_engine = row.pop("engine_busy_fraction_by_engine", []) or [0.0]
    row["engine_busy_fraction_min"] = min(by_engine)
    row["engine_busy_fraction_max"] = max(by_engine)
    for part, secs in (row.pop("engine_time_s", None) or {}).items():
        row[f"engine_time_{part}_s"] = secs  # the gain decomposition's parts (metrics.gain)
    for k in ("latency_p50_s", "latency_p99_s", "queue_wait_p50_s", "queue_wait_p99_s"):
        if k in row and row[k] is None:
            row[k] = float("nan")  # not known (a numeric column all the same)
    return row


UNTRAINED = "untrained"  # the column of a run that trained nothing: why (no metrics beside it)


def where(overrides, seed: int) -> str:
    """`(at KEY=V, ..., seed S)`: which point and seed of a sweep an error is about."""
    at = ", ".join(f"{k}={v}" for k, v in overrides) or "the base scenario"
    return f"(at {at}, seed {seed})"


def run_one(point_id: str, overrides, scheduler: str, seed: int) -> dict[str, Any]:
    """Simulate one run and return its flat metrics plus `sim_s`, the wall time of the simulation.

    A run that trains nothing returns `{UNTRAINED: reason}` instead: the parent decides whether
    that stops the sweep (`sweep`) or marks the setting infeasible (`tune`)."""
    from aprilsim.policies.base import SchedulerError
    from aprilsim.sim.run import NothingTrained, simulate

    sc = _scenario(point_id, overrides)
    t0 = time.perf_counter()
    try:
        summary = simulate(sc, scheduler, seed=seed).summary()
    except NothingTrained as e:
        return {UNTRAINED: str(e), "sim_s": time.perf_counter() - t0}
    except SchedulerError as e:  # say which point and seed of the sweep
        raise SchedulerError(f"{e} {where(overrides, seed)}") from None
    row = flatten(summary)
    row["sim_s"] = time.perf_counter() - t0
    return row


def run_task(task: tuple) -> tuple[int, dict[str, Any]]:
    """Pool entry point: (index, point_id, overrides, scheduler, seed) -> (index, row)."""
    index, point_id, overrides, scheduler, seed = task
    return index, run_one(point_id, overrides, scheduler, seed)


def ray_task(base: dict[str, Any], base_dir: str, fingerprint: str,
             task: tuple) -> tuple[int, dict]:
    """Ray entry point: the base scenario arrives as an object reference, resolved by Ray."""
    if _state["fingerprint"] != fingerprint:
        init(base, base_dir, fingerprint, ignore_sigint=False)
    return run_task(task)
