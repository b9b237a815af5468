"""`aprilsim.sweep(...)`: run a sweep and get the tidy table as a pandas DataFrame.

pandas rather than polars: the tables are small (one row per run), and pandas is what notebooks,
matplotlib and seaborn take without conversion; Parquet goes through pyarrow either way.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aprilsim.sweep.worker as worker
from aprilsim.config import (
    Scenario,
    ScenarioError,
    as_scenario,
    with_overrides,
)
from aprilsim.policies.base import SchedulerError
from aprilsim.sweep.execute import default_jobs, local_pool, on_ray
from aprilsim.sweep.journal import (
    Journal,
    claim_outputs,
    journal_path,
    merged_keys_check,
    table_paths,
)
from aprilsim.sweep.keys import Axis
from aprilsim.sweep.plan import Plan

Grid = Mapping[str | tuple[str, ...], Sequence[Any]] | Sequence[Axis]


def as_axes(grid: Grid | None) -> list[Axis]:
    """{key or (linked keys): values} or [(keys, values)] -> axes."""
    if not grid:
        return []
    items = grid.items() if isinstance(grid, Mapping) else grid
    axes = []
    for key, values in items:
        keys = (key,) if isinstance(key, str) else tuple(key)
        vals = list(values)
        if not vals:
            raise ValueError(f"{'+'.join(keys)}: no values")
        axes.append((keys, vals))
    return axes


def with_steps(sc: Scenario, steps: int | None, warmup: int | None) -> Scenario:
    """Steps and warm-up overrides as `aprilsim simulate` applies them."""
    return with_overrides(sc, steps=steps, warmup=warmup)


def _cell(v: Any) -> Any:
    """Point values go into table cells: lists and tables as JSON text."""
    return json.dumps(v) if isinstance(v, list | dict) else v


def run_plan(
    plan: Plan,
    *,
    jobs: int | None = None,
    ray: str | bool | None = None,
    journal: Journal | None = None,
    progress: Callable[[int, int], None] | None = None,
    dedupe: bool = True,
    untrained_ok: bool = False,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run what is not yet in the journal; return (rows of the whole journal or plan, stats).

    Identical runs (e.g. sync at every APRIL ratio) are simulated once and copied to each row;
    each finished run is appended to the journal at once. A run that trains nothing stops the
    whole plan with SchedulerError naming its point, unless `untrained_ok` (`tune`): then its row
    carries the reason in column `untrained` and no metrics.
    """
    done = journal.done() if journal else set()
    runs = [r for r in plan.runs() if (r.point_id, r.scheduler, r.seed) not in done]
    by_key: dict[str, list] = {}
    for r in runs:
        by_key.setdefault(plan.run_key(r) if dedupe else repr(r), []).append(r)
    unique = [group[0] for group in by_key.values()]
    points = {p.id: p for p in plan.points}
    rows: list[dict[str, Any]] = [] if journal is None else journal.rows
    total = len(runs)
    finished = 0
    sim_s = 0.0
    t0 = time.perf_counter()
    if ray:
        results = on_ray(plan, unique, None if ray is True else str(ray))
    else:
        results = local_pool(plan, unique, jobs or default_jobs())
    try:
        for index, metrics in results:
            sim_s += metrics.get("sim_s", 0.0)
            new = []
            first = unique[index]
            if worker.UNTRAINED in metrics and not untrained_ok:
                raise SchedulerError(
                    f"{metrics[worker.UNTRAINED]} "
                    f"{worker.where(points[first.point_id].overrides, first.seed)}")
            for r in by_key[plan.run_key(first) if dedupe else repr(first)]:
                row = {"point_id": r.point_id,
                       **{k: _cell(v) for k, v in points[r.point_id].overrides},
                       **metrics, "scheduler": r.scheduler, "seed": r.seed}
                new.append(row)
            if journal:
                journal.append(new)
            else:
                rows.extend(new)
            finished += len(new)
            if progress:
                progress(finished, total)
    finally:
        results.close()
    stats = {
        "runs": total, "simulated": len(unique), "skipped": len(plan.runs()) - total,
        "wall_s": time.perf_counter() - t0, "sim_s": sim_s,
    }
    return rows, stats


def to_frame(rows: list[dict[str, Any]], keys: list[str], plan: Plan | None = None):
    """Rows -> DataFrame: columns point_id, keys, scheduler, seed, metrics; rows in plan order."""
    import pandas as pd

    df = pd.DataFrame(rows)
    if df.empty:
        return df
    first = [c for c in ["point_id", *keys, "scheduler", "seed"] if c in df.columns]
    df = df[first + [c for c in df.columns if c not in first]]
    if plan is not None:
        pidx = {p.id: i for i, p in enumerate(plan.points)}
        sidx = {s: i for i, s in enumerate(plan.schedulers)}
        order = sorted(
            range(len(df)),
            key=lambda i: (pidx.get(df["point_id"].iat[i], len(pidx)), df["point_id"].iat[i],
                           sidx.get(df["scheduler"].iat[i], len(sidx)), df["scheduler"].iat[i],
                           int(df["seed"].iat[i])),
        )
        df = df.iloc[order].reset_index(drop=True)
    return df


def write_tables(df, keys: list[str], out: Path, baseline: str | None = None) -> dict[str, Path]:
    """Write the tidy table and its aggregate as Parquet and CSV beside each other."""
    from aprilsim.sweep.stats import aggregate

    out.parent.mkdir(parents=True, exist_ok=True)
    agg = aggregate(df, keys, baseline)
    paths = {k: p for k, p in table_paths(out).items() if k != "journal"}
    for name, path in paths.items():
        frame = agg if name.startswith("aggregate") else df
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        if path.suffix == ".parquet":
            frame.to_parquet(tmp, index=False)
        else:
            frame.to_csv(tmp, index=False)
        tmp.replace(path)
    return paths


def swept_keys(df) -> list[str]:
    """The swept keys of a results table: recovered from its point ids."""
    keys: list[str] = []
    for pid in df["point_id"].unique():
        for k, _ in json.loads(pid):
            if k not in keys:
                keys.append(k)
    return keys


def sweep(
    scenario: Scenario | str | Path | Mapping | None = None,
    grid: Grid | None = None,
    *,
    schedulers: Sequence[str] | None = None,
    seeds: int | Sequence[int] = 3,
    steps: int | None = None,
    warmup: int | None = None,
    jobs: int | None = None,
    ray: str | bool | None = None,
    out: str | Path | None = None,
    baseline: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    force: bool = False,
):
    """Simulate every point of `grid` x scheduler x seed; return the tidy table (pandas).

    `grid` maps a dotted scenario key (or a tuple of keys that take the same value) to its
    values, e.g. ``{"schedulers.april.ratio": [1, 1.5, 2]}``. Seeds are the scenario's seed and the
    ones after it (an int) or the given list; every point sees the same groups for the same seed.
    `ray=True` (or an address) runs on Ray, else a local process pool of `jobs` workers. With
    `out` (a .parquet path) the table, its aggregate and a journal are written there, and a
    second call with the same `out` skips the runs already done (tables at `out` that no sweep
    wrote are refused unless `force`, which starts over). One row per
    (point, scheduler, seed): the swept keys, `scheduler`, `seed`, every summary metric
    (docs/metrics.md; list and dict metrics flattened, see docs/sweeps.md) and `sim_s`.
    """
    df, _, _ = run_sweep(scenario, grid, schedulers=schedulers, seeds=seeds, steps=steps,
                         warmup=warmup, jobs=jobs, ray=ray, out=out, baseline=baseline,
                         progress=progress, force=force)
    return df


def run_sweep(
    scenario: Scenario | str | Path | Mapping | None,
    grid: Grid | None,
    *,
    schedulers: Sequence[str] | None = None,
    seeds: int | Sequence[int] = 3,
    steps: int | None = None,
    warmup: int | None = None,
    jobs: int | None = None,
    ray: str | bool | None = None,
    out: str | Path | None = None,
    baseline: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    force: bool = False,
):
    """`sweep` returning (this plan's rows, run statistics, the plan) for the command line.

    With `out`, the tables are rewritten from the journal even when the sweep is interrupted
    (Ctrl-C) or fails, so every finished run is in them. Tables at `out` that no journal vouches
    for are refused (OutputTaken), and so is a journal of a sweep over other keys; `force`
    starts over. Rows of earlier sweeps of the same keys stay in the tables: `stats["kept"]`
    counts them (and `stats["kept_points"]` their points).
    """
    sc = with_steps(as_scenario(scenario), steps, warmup)
    plan = Plan.build(sc, as_axes(grid), list(schedulers) if schedulers else None,
                      seeds if isinstance(seeds, int) else list(seeds))
    if baseline is not None:
        from aprilsim.sweep.stats import pick_baseline

        pick_baseline(plan.schedulers, baseline)
    path = Path(out) if out is not None else None
    if path is not None and path.suffix != ".parquet":
        raise ScenarioError(f"--out {path}: expected a .parquet path (the CSV goes beside it)")
    journal = None
    if path is not None:
        claim_outputs(path, force)
        journal = Journal(journal_path(path), plan.fingerprint(), plan.base)
        try:
            merged_keys_check(journal.rows, plan.keys, path)
        except ValueError:
            journal.close()
            raise
    try:
        rows, stats = run_plan(plan, jobs=jobs, ray=ray, journal=journal, progress=progress)
    finally:
        if journal is not None:
            journal.close()
            everything = to_frame(journal.rows, plan.keys, plan)
            if not everything.empty:
                write_tables(everything, swept_keys(everything), path, baseline)
    df = to_frame(rows, plan.keys, plan)
    if not df.empty:
        wanted = {(r.point_id, r.scheduler, r.seed) for r in plan.runs()}
        keep = [(p, s, int(e)) in wanted
                for p, s, e in zip(df["point_id"], df["scheduler"], df["seed"])]
        others = df[[not k for k in keep]]
        stats["kept"], stats["kept_points"] = len(others), others["point_id"].nunique()
        df = df[keep].reset_index(drop=True)
    return df, stats, plan


__all__ = ["sweep", "ScenarioError"]
