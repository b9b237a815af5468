"""`aprilsim sweep`, `aprilsim tune` and `aprilsim plot sweep`: the command-line side.

Bad input (an unknown key, a bad value, a missing extra) prints one line and exits with code 2,
like every aprilsim command; Ctrl-C during a sweep keeps every finished run (exit code 130).
"""

from __future__ import annotations

import contextlib
import math
import signal
import sys
import time
from pathlib import Path

import click

from aprilsim.cli_errors import fail

EXIT_INTERRUPTED = 130


def progress_bar(label: str):
    """A one-line progress bar on stderr when it is a terminal, else a line now and then for a
    log (`aprilsim.progress.PeriodicLines`)."""
    if not sys.stderr.isatty():
        from aprilsim.progress import PeriodicLines

        lines = PeriodicLines(f"aprilsim: {label}")
        return lambda done, total: lines(f"{done}/{total} runs")
    t0 = time.perf_counter()

    def show(done: int, total: int) -> None:
        width = 30
        filled = int(width * done / total) if total else width
        rate = done / max(1e-9, time.perf_counter() - t0)
        left = (total - done) / rate if rate else math.inf
        click.echo(f"\r\033[K{label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} runs, "
                   f"{rate:.1f}/s, ~{left:.0f} s left", err=True, nl=False)
        if done >= total:
            click.echo("\r\033[K", err=True, nl=False)

    return show


def _need_pandas() -> None:
    try:
        import pandas  # noqa: F401
        import pyarrow  # noqa: F401
    except ImportError:
        fail("sweeps need pandas and pyarrow: pip install 'aprilsim[sweep]'")


def _fmt(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def summary_lines(df, keys: list[str], baseline: str | None) -> list[str]:
    """The aggregate as a short text table: throughput with its interval, gain, costs."""
    from aprilsim.sweep.plots import distinct_keys
    from aprilsim.sweep.stats import aggregate

    agg = aggregate(df, keys, baseline).set_index(["point_id", "scheduler", "metric"])
    shown = distinct_keys(df, keys) or keys[:1]
    lines = []
    head = (f"{'point':<36} {'scheduler':<12} {'rollout tok/s [95% CI]':<26} "
            f"{'tok/s gain [95% CI]':<22} off-policy  len bias  latency p50/p99 s")
    lines.append(head)
    for (pid, sched), _ in df.groupby(["point_id", "scheduler"], sort=False):
        t = agg.loc[(pid, sched, "rollout_throughput_tok_s")]
        off = agg.loc[(pid, sched, "offpolicy_token_fraction")]
        lb = agg.loc[(pid, sched, "length_bias")]
        at = df[df["point_id"] == pid].iloc[0]
        point = " ".join(f"{k.split('.')[-1]}={at[k]}" for k in shown if k in df.columns) or "-"
        tput = f"{_fmt(t['mean'])} [{_fmt(t['ci_lo'])}, {_fmt(t['ci_hi'])}]"
        gain = "-"
        if "ratio_mean" in t and isinstance(t["baseline"], str):
            gain = f"{t['ratio_mean']:.2f}x [{t['ratio_lo']:.2f}, {t['ratio_hi']:.2f}]"
        lat = "/".join(_fmt(agg.loc[(pid, sched, k)]["mean"])
                       if (pid, sched, k) in agg.index else "-"
                       for k in ("latency_p50_s", "latency_p99_s"))
        lines.append(f"{point:<36} {sched:<12} {tput:<26} {gain:<22} {off['mean']:>9.0%}  "
                     f"{lb['mean']:>+7.1%}  {lat:>17}")
    return lines


def ignored_key_warnings(schedulers: list[str], axes) -> list[str]:
    """One line per scheduler that reads none of an axis's keys: its runs are the same at every
    value of that axis (simulated once), so it is no comparison along it."""
    from aprilsim.sweep.keys import scheduler_reads

    out = []
    for keys, values in axes:
        if len(values) < 2:
            continue
        for name in dict.fromkeys(schedulers):
            if not any(scheduler_reads(name, k) for k in keys):
                out.append(f"{name} does not read {'+'.join(keys)}: its runs are the same at "
                           f"every value (simulated once, drawn once by `aprilsim plot sweep`)")
    return out


@click.command("sweep", short_help="Sweep scenario keys x schedulers x seeds; tidy table out.")
@click.argument("scenario", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--grid", "grids", multiple=True, metavar="KEY=V1,V2,...",
              help="Values of a dotted scenario key (repeatable; K1+K2=... "
                   "links keys to one value).")
@click.option("--range", "ranges", multiple=True, metavar="KEY=LO:HI:N",
              help="N evenly spaced values of a key (repeatable).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Set a dotted scenario key for every point, as `simulate "
                   "--set` does (repeatable).")
@click.option("--scheduler", "-s", "schedulers", multiple=True,
              help="Scheduler (repeatable). Default: the scenario's `compare` list.")
@click.option("--seeds", type=click.IntRange(min=1), default=3, show_default=True,
              help="Seeds per point: the scenario's seed and the ones after it.")
@click.option("--steps", type=click.IntRange(min=1),
              help="Training steps per run (overrides the scenario).")
@click.option("--warmup", type=click.IntRange(min=0),
              help="Steps left out of each summary (overrides warmup_steps).")
@click.option("--jobs", "-j", type=click.IntRange(min=1),
              help="Local worker processes. Default: the CPUs available.")
@click.option("--ray", "ray_address", is_flag=False, flag_value="auto", default=None,
              metavar="[ADDRESS]",
              help="Run the points as Ray tasks on a running cluster (default address: auto).")
@click.option("--baseline",
              help="Scheduler the paired differences are taken against "
                   "(default: sync when it runs).")
@click.option("--out", "-o", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Results .parquet (CSV, aggregate and journal beside it). A sweep's own "
                   "is resumed (the same keys at more values are added to it); anything "
                   "else there is refused.")
@click.option("--force", is_flag=True, help="Start over: replace the tables and journal at --out.")
def sweep_command(scenario, grids, ranges, sets, schedulers, seeds, steps, warmup, jobs,
                  ray_address, baseline, out, force) -> None:
    """Simulate every combination of the swept keys for each scheduler and seed.

    KEY is a dotted scenario key, e.g. schedulers.april.ratio, cluster.engines,
    cluster.max_running, lengths.mus.1, trainer.per_token_s. Writes OUT (.parquet) and OUT .csv
    (one row per point x scheduler x seed), OUT .agg.parquet/.csv (mean, 95 % interval, paired
    differences to the baseline) and a journal; rerunning the same command resumes.
    """
    from aprilsim.config import ScenarioError
    from aprilsim.sim.runtime import SchedulerError
    from aprilsim.sweep.keys import parse_grid, parse_range, scenario_dict

    _need_pandas()
    from aprilsim.sweep.api import as_scenario, run_sweep, swept_keys

    try:
        from aprilsim.sweep.keys import apply_sets

        sc = apply_sets(as_scenario(scenario), sets)
        if "replay" in sc.lengths:  # trace replay: what the log holds, and the caveat
            from aprilsim.workload.replay.spec import scenario_notes

            for note in scenario_notes(sc):
                click.echo(f"aprilsim: {note}", err=True)
        base = scenario_dict(sc)
        axes = [parse_grid(g) for g in grids] + [parse_range(r, base) for r in ranges]
        warnings = ignored_key_warnings(list(schedulers) or list(sc.compare), axes)
        with sigterm_as_interrupt():  # kill PID: tables written, pool shut down, as Ctrl-C
            df, stats, plan = run_sweep(
                sc, axes, schedulers=schedulers, seeds=seeds, steps=steps, warmup=warmup,
                jobs=jobs, ray=ray_address, out=out, baseline=baseline,
                progress=progress_bar("sweep"), force=force,
            )
    except KeyboardInterrupt:
        click.echo(f"\naprilsim: interrupted; finished runs are in {out} (rerun the same command "
                   "to resume)", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except (ScenarioError, SchedulerError, ValueError) as e:
        fail(str(e))
        return
    for line in warnings:  # after the run: a bad key or value stays a one-line error
        click.echo(f"aprilsim: warning: {line}", err=True)
    click.echo(f"{len(plan.points)} point(s) x {len(plan.schedulers)} scheduler(s) x "
               f"{len(plan.seeds)} seed(s): {stats['runs']} new rows ({stats['simulated']} "
               f"simulations), {stats['skipped']} already in {out.name}, {stats['wall_s']:.1f} s")
    if stats.get("kept"):
        click.echo(f"{out.name} also keeps {stats['kept']} row(s) at {stats['kept_points']} other "
                   "point(s) from earlier sweeps into it (the tables and their aggregate hold "
                   "both; --force starts over)")
    if not df.empty:
        for line in summary_lines(df, swept_keys(df), baseline):
            click.echo(line)
    stem = out.with_suffix("")
    click.echo(f"wrote {out}, {stem}.csv, {stem}.agg.parquet, {stem}.agg.csv")


@contextlib.contextmanager
def sigterm_as_interrupt():
    """SIGTERM raises KeyboardInterrupt in this process while the block runs (pool workers
    reset it: see worker.init), so it ends like Ctrl-C instead of at once."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@click.command("sweep", short_help="Figures of a sweep: throughput, gain, costs, Pareto front.")
@click.argument("results", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--x", "x_key", help="Swept key on the x axis (default: the first swept key).")
@click.option("--y", "y_metric", default="rollout_throughput_tok_s", show_default=True,
              help="Metric of the first panel.")
@click.option("--baseline",
              help="Scheduler the gain is taken against (default: sync when present).")
@click.option("-o", "--out", "png", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Figure file (PNG, PDF, SVG).")
def plot_sweep_command(results, x_key, y_metric, baseline, png) -> None:
    """Plot RESULTS (written by `aprilsim sweep`): metric and gain vs the swept key with 95 %
    interval bands per scheduler, off-policy share, staleness and length bias vs the key, and the
    Pareto front of throughput vs off-policy share."""
    _need_pandas()
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        fail("plots need matplotlib: pip install 'aprilsim[plot]'")
    from aprilsim.sweep.plots import plot_sweep

    try:
        plot_sweep(results, png, x=x_key, y=y_metric, baseline=baseline)
    except (ValueError, KeyError, OSError) as e:
        fail(str(e).strip("'\""))
        return
    click.echo(f"wrote {png}")


@click.command("tune", short_help="Best knob setting under constraints (seed-noise aware).")
@click.argument("scenario", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--knob", "knobs", multiple=True, required=True, metavar="KEY=LO:HI",
              help="A dotted scenario key and its range (repeatable; integer LO "
                   "and HI: an integer knob).")
@click.option("--maximize", required=True, metavar="METRIC",
              help="Summary metric to maximise, e.g. rollout_throughput_tok_s.")
@click.option("--subject-to", "constraints", multiple=True, metavar="\"METRIC<=X\"",
              help="Constraint on a metric's mean: METRIC<=X, METRIC>=X, |METRIC|<=X (repeatable).")
@click.option("--scheduler", "-s",
              help="Scheduler to tune. Default: the one whose table a knob sets.")
@click.option("--seeds", type=click.IntRange(min=3), default=4, show_default=True,
              help="Paired seeds per setting (and as many fresh ones for the check); at least 3: "
                   "with 2 the t interval (1 degree of freedom) is wider than most differences.")
@click.option("--rounds", type=click.IntRange(min=1), default=3, show_default=True,
              help="Grid refinements.")
@click.option("--steps", type=click.IntRange(min=1),
              help="Training steps per run (overrides the scenario).")
@click.option("--warmup", type=click.IntRange(min=0), help="Steps left out of each summary.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), help="Local worker processes.")
@click.option("--ray", "ray_address", is_flag=False, flag_value="auto", default=None,
              metavar="[ADDRESS]", help="Run on a Ray cluster.")
@click.option("--out", "-o", type=click.Path(dir_okay=False, path_type=Path),
              help="Tuned scenario file (default: <scenario>.tuned.toml here); an "
                   "existing file is refused.")
@click.option("--force", is_flag=True, help="Replace the tuned scenario file if it exists.")
def tune_command(scenario, knobs, maximize, constraints, scheduler, seeds, rounds, steps, warmup,
                 jobs, ray_address, out, force) -> None:
    """Find the knob setting that maximises METRIC subject to the constraints.

    Successive grid refinement on paired seeds (common random numbers), constraints required to
    hold over each setting's whole 95 % interval, and a final check on fresh seeds; see
    docs/sweeps.md. Prints the setting with its interval and constraint margins, writes the tuned
    scenario and the `aprilsim run` command that checks it on live engines.
    """
    from aprilsim.config import ScenarioError
    from aprilsim.sim.runtime import SchedulerError
    from aprilsim.sweep.keys import apply, parse_knob, scenario_dict
    from aprilsim.sweep.tune import Constraint, Knob, relocate_paths, tune, tune_notes

    _need_pandas()
    from aprilsim.outputs import claim_files
    from aprilsim.sweep.api import as_scenario, with_steps

    try:
        original = as_scenario(scenario)
        if out is None:
            out = Path(f"{scenario.stem if scenario else original.name}.tuned.toml")
        claim_files([out], "--out", force)  # before the work: a taken name costs nothing
        ks = [Knob(*parse_knob(k, scenario_dict(original))) for k in knobs]
        cons = [Constraint.parse(c) for c in constraints]
        sc = with_steps(original, steps, warmup)
        res = tune(sc, ks, maximize, cons, scheduler=scheduler, seeds=seeds, rounds=rounds,
                   jobs=jobs, ray=ray_address, log=lambda m: click.echo(m, err=True))
    except KeyboardInterrupt:
        click.echo("\naprilsim: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except (ScenarioError, SchedulerError, ValueError) as e:
        fail(str(e))
        return
    click.echo(f"tuned {res.scheduler} on {sc.name}: {res.evaluated} settings x {len(res.seeds)} "
               f"seeds, {res.runs} simulations; figures below on {len(res.fresh_seeds)} fresh "
               "seeds")
    for k, v in res.setting.items():
        click.echo(f"  {k} = {v:g}" if isinstance(v, float) else f"  {k} = {v}")
    if res.infeasible:
        click.echo(f"  ({len(res.infeasible)} setting(s) infeasible: they trained no samples; "
                   "listed above)")
    click.echo(f"  {res.objective} = {_fmt(res.mean)}  (95% CI {_fmt(res.lo)} .. {_fmt(res.hi)})")
    for c in res.constraints:
        click.echo(f"  {c['constraint']}: mean {c['mean']:.4g} (95% CI {c['lo']:.4g} .. "
                   f"{c['hi']:.4g}), margin {c['margin']:.3g} (at the interval's end "
                   f"{c['margin_at_interval']:.3g})")
    tuned = apply(scenario_dict(original), [(k, v) for k_, v in res.setting.items()
                                            for k in k_.split("+")])
    data = relocate_paths(tuned, sc.base_dir, out.parent)
    data["name"] = f"{sc.name}-tuned"
    setting = ", ".join(f"{k}={v}" for k, v in res.setting.items())
    header = (f"tuned by `aprilsim tune`: {res.scheduler}, maximise {res.objective}, "
              f"subject to {'; '.join(c['constraint'] for c in res.constraints) or 'nothing'}\n"
              f"setting: {setting}; {res.objective} {res.mean:,.6g} "
              f"(95% CI {res.lo:,.6g} .. {res.hi:,.6g}) on fresh seeds {res.fresh_seeds}")
    try:
        from aprilsim.interop.toml_out import dumps

        out.write_text(dumps(data, header))
    except OSError as e:
        fail(f"cannot write {out}: {e.strerror}")
    click.echo(f"wrote {out}")
    notes, worth_live = tune_notes(res, ks)
    for line in notes:
        click.echo(f"note: {line}")
    if not worth_live:
        click.echo("no live run suggested: it would check sync; relax the binding constraint or "
                   "tune another scheduler")
        return
    click.echo("check it on live engines:")
    click.echo(f"  aprilsim run {out} -s {res.scheduler} --local {sc.cluster.engines}")
