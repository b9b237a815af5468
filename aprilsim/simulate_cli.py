"""The body of `aprilsim simulate`: overrides, schedulers at settings, seeds, and what it writes.

Every input is checked before the first simulation (scenario, `--set` keys, `-s NAME@knob=v`
settings, output paths, plotting extras), so a bad one costs nothing and no run is lost to it.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from aprilsim.cli_errors import fail


def __getattr__(name: str) -> Any:
    """`apply_sets` and `parse_set_value` live in `aprilsim.sweep.keys` (imported on use: the
    command starts without numpy); their old home still names them."""
    if name in ("apply_sets", "parse_set_value"):
        from aprilsim.sweep import keys

        return getattr(keys, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass
class _Job:
    """What every run of one `simulate` shares: the scenario, the seeds, where outputs go."""

    sc: Any
    seeds: list[int]
    outputs: dict[str, dict[str, Path]]
    out_dir: Path | None
    out_timelines: bool
    as_json: bool
    command: str


@dataclass
class _Collected:
    """What the runs produced, in order: step rows, summaries per scheduler, --json objects."""

    records: list[dict[str, Any]] = field(default_factory=list)
    runs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    json_rows: list[dict[str, Any]] = field(default_factory=list)


def run_simulate(*, scenario: Path | None, schedulers: tuple[str, ...], sets: tuple[str, ...],
                 steps: int | None, seed: int | None, n_seeds: int, warmup: int | None,
                 as_json: bool, steps_out: Path | None, trace_out: Path | None,
                 timeline: Path | None, out_dir: Path | None, command: str,
                 force: bool = False, out_timelines: bool = False) -> None:
    """Run `aprilsim simulate` (see its --help); bad input: one line, exit 2."""
    from aprilsim.config import ScenarioError
    from aprilsim.sim.runtime import SchedulerError

    got = _Collected()
    try:
        sc, labels, outputs = _prepared(scenario, schedulers, sets, steps=steps, warmup=warmup,
                                        seed=seed, steps_out=steps_out, trace_out=trace_out,
                                        timeline=timeline, out_dir=out_dir, force=force)
        first = sc.seed if seed is None else seed
        job = _Job(sc, [first + i for i in range(n_seeds)], outputs, out_dir, out_timelines,
                   as_json, command)
        for label in labels:
            for s in job.seeds:
                _simulate_one(job, label, s, got)
    except (ScenarioError, SchedulerError, ValueError) as e:
        if steps_out is not None and got.records:
            _write_steps(steps_out, got.records)
        fail(str(e))
        return
    if steps_out is not None:
        _write_steps(steps_out, got.records)
    _print_results(job, got)


def _write_steps(path: Path, records: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def _prepared(scenario: Path | None, schedulers: tuple[str, ...], sets: tuple[str, ...], *,
              steps: int | None, warmup: int | None, seed: int | None, steps_out: Path | None,
              trace_out: Path | None, timeline: Path | None, out_dir: Path | None,
              force: bool) -> tuple[Any, list[str], dict[str, dict[str, Path]]]:
    """The scenario with its overrides, the schedulers to run and their output paths, every
    input checked (and the scenario's notes printed) before the first simulation."""
    from aprilsim.config import load_scenario, with_overrides
    from aprilsim.report import run_output as ro
    from aprilsim.scheduler_spec import check_schedulers
    from aprilsim.sweep.keys import apply_sets

    sc = with_overrides(apply_sets(load_scenario(scenario), sets), steps=steps, warmup=warmup)
    if "replay" in sc.lengths:  # trace replay: what the log holds, and the caveat
        from aprilsim.workload.replay.spec import scenario_notes

        for note in scenario_notes(sc, seed):
            click.echo(f"aprilsim: {note}", err=True)
    for note in speculative_notes(sc):
        click.echo(f"aprilsim: {note}", err=True)
    labels = list(dict.fromkeys(schedulers)) or list(sc.compare)
    check_schedulers(sc, labels)  # every one built once now: a bad knob costs no run
    outputs = ro.per_scheduler_paths(labels, trace_out=trace_out, timeline=timeline)
    ro.check_timeline_deps(timeline)
    if steps_out is not None and not steps_out.parent.is_dir():
        raise ValueError(f"--steps-out {steps_out}: folder {steps_out.parent} does not exist")
    if out_dir is not None:
        ro.prepare_out_dir(out_dir, force)
        ro.write_scenario(out_dir, sc)
    return sc, labels, outputs


def _progress_for(job: _Job, label: str, s: int) -> Any:
    """Progress for one run: a live line on a terminal, else a line every 10 s (none for --json)."""
    from aprilsim.progress import PeriodicLines

    if sys.stderr.isatty():
        def progress(done: int, total: int) -> None:
            click.echo(f"\r\033[Ksimulating {label} (seed {s}): step {done}/{total}",
                       err=True, nl=False)

        return progress
    if job.as_json:
        return None
    what = f"simulating {label}" + (f" (seed {s})" if len(job.seeds) > 1 else "")
    click.echo(what + " ...", err=True)
    return PeriodicLines(what).steps


def _simulate_one(job: _Job, label: str, s: int, got: _Collected) -> None:
    """One scheduler at one seed: run it, write its trace/timeline (first seed) and run folder,
    and collect its rows."""
    from aprilsim.metrics.end_state import with_end_state
    from aprilsim.metrics.trace import Trace
    from aprilsim.report import run_output as ro
    from aprilsim.sim.run import simulate as run_sim

    sc = job.sc
    paths = job.outputs.get(label, {}) if s == job.seeds[0] else {}
    trace = Trace(label, sc.cluster.engines) if paths or job.out_dir is not None else None
    run = run_sim(sc, label, seed=s, progress=_progress_for(job, label, s), trace=trace)
    if sys.stderr.isatty():
        click.echo("\r\033[K", err=True, nl=False)
    for kind, path in paths.items():
        if kind == "trace":
            trace.write(path)
        else:
            from aprilsim.report.timeline import write_timeline

            write_timeline(trace, path)
        click.echo(f"wrote {path}", err=True)
    row = with_end_state(run.summary(), run.end_state)
    meta = ro.run_meta(sc, s, job.command)
    steps_rows = [{"scheduler": label, "seed": s, "warmup": r.step < run.warmup_steps,
                   **r.to_dict()} for r in run.steps]
    got.records += steps_rows
    got.runs.setdefault(label, []).append(row)
    got.json_rows.append({**row, "run": meta})
    if job.out_dir is not None:
        _write_run(ro.run_folder(job.out_dir, label, s, len(job.seeds)), row, meta, steps_rows,
                   trace, job.out_timelines)


def _print_results(job: _Job, got: _Collected) -> None:
    """The table (or --json), the end state, the episodes' figures (agentic runs), settling and
    gain lines; summary files in --out."""
    from aprilsim.metrics.agents import agent_lines
    from aprilsim.metrics.end_state import end_state_lines
    from aprilsim.metrics.gain import gain_lines, gain_vs_sync
    from aprilsim.report import run_output as ro

    sc, seeds, runs = job.sc, job.seeds, got.runs
    gains = gain_vs_sync(runs)
    for jr in got.json_rows:  # the same seed's decomposition in each --json object
        found = gains.get(jr["scheduler"])
        if found is not None:
            jr["gain_vs_sync"] = found[1][seeds.index(jr["run"]["seed"])]
    head = (f"scenario: {sc.name}  ({sc.cluster.engines} engines, {sc.batch_size} groups x "
            f"{sc.group_size} samples, max {sc.max_response_len} tokens, {sc.steps} steps, "
            f"the first {sc.warmup_steps} left out as warm-up"
            + (f"; seeds {seeds[0]}..{seeds[-1]}, paired)" if len(seeds) > 1 else ")"))
    table = _table(runs, len(seeds))
    if job.out_dir is not None:
        ro.write_json(job.out_dir / "summary.json", got.json_rows)
        (job.out_dir / "table.txt").write_text(head + "\n" + table + "\n")
        click.echo(f"wrote {job.out_dir}/ (scenario.toml, summary.json, table.txt, one folder per "
                   "run)", err=True)
    if job.as_json:
        click.echo(json.dumps(got.json_rows, indent=2))
        return
    click.echo(head)
    click.echo(table)
    click.echo(end_state_lines([rows[0] for rows in runs.values()]))
    for line in [*agent_lines([mean_row(rows) for rows in runs.values()]),
                 *settle_notes(runs, seeds),
                 *gain_lines({name: g[0] for name, g in gains.items()})]:
        click.echo(line)


def speculative_notes(sc: Any) -> list[str]:
    """A line when the scenario's speculative acceptance lies outside the published figures
    (`speculative_spec.acceptance_notes`)."""
    from aprilsim.engine.speculative_spec import acceptance_notes

    sp = sc.engine_spec().speculative
    return acceptance_notes(sp) if sp is not None else []


def mean_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One scheduler's rows over the seeds: its numeric figures averaged (the first row's
    others); one row as it is."""
    if len(rows) == 1:
        return rows[0]
    out = dict(rows[0])
    for k, v in rows[0].items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = sum(r[k] for r in rows) / len(rows)
    return out


def settle_notes(runs: dict[str, list[dict[str, Any]]], seeds: list[int]) -> list[str]:
    """The steady-state check (aprilsim.metrics.steady) said plainly: one note per scheduler
    whose run (with --seeds: the first seed's that is not) has not settled."""
    out = []
    for rows in runs.values():
        for row, s in zip(rows, seeds):
            if not row.get("settled", True):
                at = f" (seed {s})" if len(seeds) > 1 else ""
                out.append(f"note: {row['scheduler']}{at} not settled in {row['steps']} steps "
                           f"({row['unsettled_reason']}): run more --steps")
                break
    return out


def _table(runs: dict[str, list[dict[str, Any]]], n_seeds: int) -> str:
    from aprilsim.report.run_output import seeds_table
    from aprilsim.report.table import format_table

    if n_seeds > 1:
        return seeds_table(runs)
    return format_table([rows[0] for rows in runs.values()])


def _write_run(folder: Path, row: dict[str, Any], meta: dict[str, Any],
               steps_rows: list[dict[str, Any]], trace: Any, timeline: bool) -> None:
    """One run's folder: summary.json, steps.jsonl, trace.jsonl, and with `timeline`
    (`--out-timelines`) timeline.png (with matplotlib): drawing it costs far more than the run
    (`aprilsim plot timeline DIR/RUN/trace.jsonl` draws it later)."""
    from aprilsim.report.run_output import write_json

    write_json(folder / "summary.json", {**row, "run": meta})
    (folder / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps_rows))
    if trace is None:
        return
    trace.write(folder / "trace.jsonl")
    if not timeline:
        return
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return  # the figure needs the plot extra; the trace redraws it: aprilsim plot timeline
    from aprilsim.report.timeline import write_timeline

    write_timeline(trace, folder / "timeline.png")
