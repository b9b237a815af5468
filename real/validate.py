"""The live side of ``aprilsim validate``: run the schedulers on engines, read their iteration
logs, calibrate, simulate the same runs, and hand both to :mod:`aprilsim.validate.report`.

Order: every scheduler first runs live (replay mode, the scenario's seeded groups at ``scale``),
while the engines log every step; then the cost is fitted on the logged iterations of all runs
(warm-up steps left out) unless ``--calibration`` gives one; then each scheduler is simulated
with that cost, the engines' own limits (from their server info), the same scale and seed.
Imported by the CLI only when the command runs (torch and aiohttp stay out of ``aprilsim``).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from aprilsim.cli_errors import OneLineCommand
from aprilsim.config import Scenario
from aprilsim.metrics.records import RunResult
from aprilsim.metrics.trace import Trace
from aprilsim.validate.compare import compare_runs
from aprilsim.validate.costfit import BUSY_GAP_S, CostFit, fit_iterations, load_calibration
from aprilsim.validate.scaled import make_policy, matched_engine, simulate_matched


@dataclass
class LiveOutcome:
    """One scheduler's live run, the engines' iteration rows in its time (runtime clock), traces."""

    label: str
    result: RunResult
    rows: list[list[dict[str, Any]]]  # per engine; ``t_run``: end of step on the run's clock
    trace: Trace
    wall_s: float
    overhead_per_request_s: float


@dataclass
class Validation:
    """Everything the report needs."""

    scenario: Scenario
    specs: list[str]
    scale: float
    seed: int | None
    steps: int
    engines: str
    limits: dict[str, Any]  # the engines' limits and rules the simulation takes
    fit: CostFit
    live: list[LiveOutcome] = field(default_factory=list)
    sim: dict[str, RunResult] = field(default_factory=dict)
    sim_traces: dict[str, Trace] = field(default_factory=dict)
    calibration_from: str = "iteration logs of the live runs"
    timings: dict[str, float] = field(default_factory=dict)


async def _iteration_rows(engine, since: int) -> list[dict[str, Any]]:
    """The engine's iteration records with seq > since (in-process: the engine's deque; HTTP:
    ``GET /iteration_log?since=N`` of a bundled server; SGLang: none)."""
    inner = getattr(engine, "engine", None)
    if inner is not None and hasattr(inner, "iterations"):
        return [r.to_dict() for r in list(inner.iterations) if r.seq > since]
    import aiohttp

    url = getattr(engine, "base_url", None) or getattr(engine, "url", None)
    if not url:
        return []
    with contextlib.suppress(Exception):
        async with aiohttp.ClientSession() as s, s.get(f"{str(url).rstrip('/')}/iteration_log",
                                                      params={"since": since},
                                                      timeout=aiohttp.ClientTimeout(total=10)) as r:
            body = await r.json()
            return list(body.get("records", []))
    return []


def abort_steps_of(engine: Any, version: str | None) -> int:
    """Decode steps an abort lets run after the step in flight, by engine family: the bundled
    engine applies aborts between steps (0); SGLang runs one more decode pass for a running
    request it aborts (1, ``scheduler.abort_request`` "Abort method 3"); vLLM frees an aborted
    request when its engine core next reads its input queue, between steps (0, assumed)."""
    if (version or "").startswith("aprilsim-torch") or _is_vllm(engine):
        return 0
    return 1


def retract_to_of(engine: Any) -> str:
    """Where a retracted (preempted) request re-enters the queue: the tail for SGLang
    (``_add_request_to_queue`` appends) and the bundled engine, the head for vLLM (its V1
    scheduler's ``_preempt_request`` prepends it to the waiting queue)."""
    return "head" if _is_vllm(engine) else "tail"


def _is_vllm(engine: Any) -> bool:
    return type(engine).__name__ == "VLLMEngine"


def _last_seq(rows: list[dict[str, Any]], prev: int) -> int:
    return max([prev, *(int(r["seq"]) for r in rows)])


async def run_live(sc: Scenario, specs: list[str], opts: dict[str, Any], progress) -> tuple[
        list[LiveOutcome], dict[str, int], str]:
    """Run every scheduler on one cluster; return outcomes, engine limits, what ran."""
    from real.runner.api import build_runtime
    from real.runner.cli import build_cluster

    scale = opts["scale"]
    max_prompt = int(sc.prompts.get("max_len", 2048))
    max_context = int(round(max_prompt * scale)) + int(round(sc.max_response_len * scale)) + 8
    cluster, vocab, what = await build_cluster(opts, max(64, max_context))
    outcomes: list[LiveOutcome] = []
    try:
        info = await cluster.slots[0].engine.server_info()
        limits = {"max_running": int(info.max_running_requests or 64),
                  "kv_capacity": int(info.kv_capacity_tokens or 1 << 30),
                  "abort_steps": abort_steps_of(cluster.slots[0].engine, info.version),
                  "retract_to": retract_to_of(cluster.slots[0].engine)}
        engines = [sl.engine for sl in cluster.slots]
        seqs = [0] * len(engines)
        for i, e in enumerate(engines):
            seqs[i] = _last_seq(await _iteration_rows(e, 0), 0)
        for spec in specs:
            trace = Trace(scheduler=spec, n_engines=len(cluster), source="live")
            rt = build_runtime(sc, make_policy(sc, spec), cluster, vocab_size=vocab,
                               seed=opts["seed"], steps=opts["steps"], scale=scale,
                               progress=lambda d, t, spec=spec: progress(spec, d, t), trace=trace)
            t0 = time.monotonic()
            result = await rt.run()
            wall = time.monotonic() - t0
            result.warmup_steps = min(sc.warmup_steps, max(0, len(result.steps) - 1))
            # iteration stamps are time.time(); the run's clock is monotonic from rt._t0
            shift = (time.time() - time.monotonic()) + rt._t0
            rows = []
            for i, e in enumerate(engines):
                got = await _iteration_rows(e, seqs[i])
                seqs[i] = _last_seq(got, seqs[i])
                for r in got:
                    r["t_run"] = float(r["t"]) - shift
                rows.append(got)
            per_req = rt.overhead_s / rt.requests if rt.requests else 0.0
            outcomes.append(LiveOutcome(spec, result, rows, trace, wall, per_req))
    finally:
        if opts["local"]:
            await cluster.close()
        else:
            with contextlib.suppress(Exception):
                await cluster.abort()
            await cluster.close()
    return outcomes, limits, f"{len(engines)} {what}"


def _steady_rows(o: LiveOutcome) -> list[list[dict[str, Any]]]:
    """Iteration rows after the run's warm-up steps (engine warm-up left out of the fit)."""
    warm = o.result.warmup_steps
    t_min = o.result.steps[warm].rollout_start_s if warm < len(o.result.steps) else 0.0
    return [[r for r in eng if r["t_run"] >= t_min] for eng in o.rows]


def validate(sc: Scenario, specs: list[str], opts: dict[str, Any], progress=lambda *a: None) -> Validation:
    """Run live, calibrate, simulate: the whole of ``aprilsim validate`` but the report."""
    t0 = time.monotonic()
    live, limits, what = asyncio.run(run_live(sc, specs, opts, progress))
    t_live = time.monotonic() - t0
    logs = [eng for o in live for eng in _steady_rows(o)]
    if not any(logs):
        raise RuntimeError("the engines logged no iterations (SGLang does not): give --calibration FILE")
    fit = fit_iterations(logs)
    source = "iteration logs of the live runs (warm-up steps left out)"
    if opts.get("calibration"):
        cost = load_calibration(str(opts["calibration"]))
        fit = CostFit(cost=cost, wall=cost, overhead_s=fit.overhead_s, decode_median_err=fit.decode_median_err,
                      prefill_median_err=fit.prefill_median_err, n_decode=fit.n_decode,
                      n_prefill=fit.n_prefill, decode_share=fit.decode_share,
                      source=f"file {opts['calibration']}")
        source = f"{opts['calibration']} (+ runner overhead measured from the logs)"
    engine = matched_engine(fit.effective, **limits)
    v = Validation(scenario=sc, specs=specs, scale=opts["scale"], seed=opts["seed"],
                   steps=opts["steps"] or sc.steps, engines=what, limits=limits, fit=fit,
                   live=live, calibration_from=source)
    t1 = time.monotonic()
    for o in live:
        tr = Trace(scheduler=o.label, n_engines=len(o.rows), source="sim")
        v.sim[o.label] = simulate_matched(sc, o.label, engine, n_engines=len(o.rows),
                                          scale=opts["scale"], seed=opts["seed"],
                                          steps=len(o.result.steps), trace=tr)
        v.sim_traces[o.label] = tr
    v.timings = {"live_s": t_live, "sim_s": time.monotonic() - t1}
    return v


def comparisons(v: Validation):
    """The per-scheduler comparisons of a validation."""
    from aprilsim.validate.pricing import per_step

    return [compare_runs(o.label, v.sim[o.label], o.result, per_step(o.result, o.rows),
                         per_step(o.result, o.rows, v.fit.effective)) for o in v.live]




# ------------------------------------------------------------------------------ report
def write_all(v: Validation, out: Path, figures: bool = True) -> dict[str, Any]:
    """Compare, draw and write ``out/report.md``, ``out/report.json`` and the figures."""
    from aprilsim.validate.report import report_dict, write_figures, write_report

    rows = comparisons(v)
    meta = {"scenario": v.scenario.name, "schedulers": v.specs, "scale": v.scale, "seed": v.seed,
            "steps": v.steps, "engines": v.engines, "limits": v.limits,
            "calibration_from": v.calibration_from, "timings": v.timings,
            "runner_overhead_per_request_s": {o.label: o.overhead_per_request_s for o in v.live},
            "live_wall_s": {o.label: o.wall_s for o in v.live}}
    rep = report_dict(rows, meta, v.fit.to_dict())
    out.mkdir(parents=True, exist_ok=True)
    figs: list[Path] = []
    if figures:
        figs = write_figures(rows, out)
        from aprilsim.report.timeline import write_timeline

        for o in v.live:
            safe = "".join(ch if ch.isalnum() else "_" for ch in o.label)
            figs.append(write_timeline(v.sim_traces[o.label], out / f"timeline_{safe}_sim.png"))
            figs.append(write_timeline(o.trace, out / f"timeline_{safe}_live.png"))
    write_report(rep, out, figs)
    return rep


LOCAL_STEPS = 4  # default steps with --local: 1 warm-up + 3 compared, a few minutes on CPU


@click.command("validate", cls=OneLineCommand, short_help="Simulation vs live engines: calibrate, run both, report the errors.")
@click.argument("scenario", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--scheduler", "-s", "schedulers", multiple=True, help="Scheduler to compare (repeatable; NAME or NAME@knob=value,...: e.g. april@ratio=1.5); default: the scenario's `compare` list.")
@click.option("--local", type=click.IntRange(min=1), help="Start N bundled engines in this process (CPU).")
@click.option("--engines", help="Comma-separated engine URLs (bundled `python -m real.serve` servers log iterations).")
@click.option("--router", help="URL of an sglang-router in front of the engines.")
@click.option("--calibration", type=click.Path(exists=True, dir_okay=False, path_type=Path), help="A cost calibration (TOML with a [cost] table: a, b, c, p0, p1); default: fitted on the live runs' iteration logs.")
@click.option("--steps", type=click.IntRange(min=2), help=f"Training steps (default: the scenario's; with --local at most {LOCAL_STEPS}, so a CPU run takes minutes).")
@click.option("--warmup", type=click.IntRange(min=0), help="Steps left out of every figure (default: the scenario's).")
@click.option("--seed", type=int, help="Workload seed (overrides the scenario).")
@click.option("--scale", type=click.FloatRange(min=0, max=1, min_open=True), help="Multiply every length and the trainer's fixed times (default: 1; with --local, max_response_len -> 64).")
@click.option("--vocab-size", type=click.IntRange(min=17), help="Vocabulary of remote engines (default: asked of a bundled server, else 32000).")
@click.option("--no-figures", is_flag=True, help="Write report.md and report.json only.")
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path), help="Directory for report.md, report.json and the figures.")
def validate_command(scenario, schedulers, local, engines, router, calibration, steps, warmup, seed, scale,
                     vocab_size, no_figures, out) -> None:
    """Run SCENARIO's schedulers live (replay) and in simulation with a calibrated cost; report
    predicted vs measured rollout time, throughput, step time, off-policy share, wasted tokens and
    the gain over sync, with the targets (5 % per-step error, 3 pp gain, ranking)."""
    from aprilsim.cli import fail, with_overrides
    from aprilsim.config import ScenarioError, load_scenario
    from aprilsim.policies.base import SchedulerError
    from real.runner.cli import local_scale

    if sum(x is not None for x in (local, engines, router)) != 1:
        fail("give exactly one of --local N, --engines URL,... or --router URL")
    try:
        sc = load_scenario(scenario)
        if steps is None and local:
            steps = min(sc.steps, LOCAL_STEPS)
        sc = with_overrides(sc, steps=steps, warmup=warmup)
        specs = list(schedulers) or list(sc.compare)
        for s in specs:
            make_policy(sc, s)
    except (ScenarioError, SchedulerError, ValueError, TypeError) as e:
        fail(str(e))
        return
    opts = dict(local=local, engines=engines, router=router, vocab_size=vocab_size, seed=seed,
                steps=steps, calibration=calibration,
                scale=scale if scale is not None else (local_scale(sc.max_response_len) if local else 1.0))

    def progress(name: str, done: int, total: int) -> None:
        click.echo(f"live {name}: step {done}/{total}", err=True)

    t0 = time.monotonic()
    try:
        v = validate(sc, specs, opts, progress)
    except (ScenarioError, SchedulerError, ValueError, RuntimeError) as e:
        fail(str(e))
        return
    rep = write_all(v, out, figures=not no_figures)
    t = rep["targets"]
    click.echo(f"wrote {out / 'report.md'} ({time.monotonic() - t0:.0f}s)", err=True)
    for s in rep["schedulers"]:
        e = s["errors"]
        med = e.get("step_rollout_median_abs")
        click.echo(f"{s['label']:>18}: rollout {s['predicted']['mean_rollout_time_s']:.3f}s predicted, "
                   f"{s['measured']['mean_rollout_time_s']:.3f}s measured; per-step error "
                   f"{'n/a' if med is None else f'{100 * med:.1f}%'} median")
    for label, g in t["gain_vs_sync_pp"]["by_scheduler"].items():
        click.echo(f"{label:>18}: gain over sync {100 * g['predicted']:+.1f}% predicted, "
                   f"{100 * g['measured']:+.1f}% measured ({g['diff_pp']:+.1f} pp)")
    met = all(t[k]["met"] for k in t)
    click.echo(f"targets {'met' if met else 'missed'}: step error {100 * t['step_rollout_error']['worst']:.1f}% "
               f"(<= 5%), gain {t['gain_vs_sync_pp']['worst']:.1f} pp (<= 3), ranking "
               f"{'preserved' if t['ranking']['met'] else 'NOT preserved'}")
    sys.stdout.flush()


__all__ = ["BUSY_GAP_S", "LiveOutcome", "abort_steps_of", "retract_to_of", "Validation", "comparisons", "run_live",
           "validate", "validate_command", "write_all"]
