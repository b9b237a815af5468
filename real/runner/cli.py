"""``aprilsim run``: the schedulers of a scenario on live engines, with the records of ``simulate``.

The command is registered by ``aprilsim.cli`` and imported only when it runs (torch and aiohttp
stay out of ``aprilsim``'s import). Exit codes: 0 done, 1 every engine gone (after writing the
steps that finished), 2 bad input (an ``--engines`` / ``--router`` URL that does not answer
``/health`` within 1.5 s, asked of every engine before the first step), 130 interrupted (Ctrl-C
/ SIGTERM, also before the run loop starts: in-flight work aborted on every engine, finished
steps written, engines the command started stopped).

``--progress-deadline S`` (default 60): an engine that holds requests and streams no token for
S seconds is health-checked, and declared dead when it does not answer (its requests are
resubmitted to the others and the fault is reported); 0 turns it off. ``--stalled-after N``
(default 3): an engine that answers healthy but streams no token for N such deadlines in a row
is treated as dead the same way (0: a healthy engine never is).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from aprilsim.cli_errors import OneLineCommand
from aprilsim.metrics.end_state import end_state_lines, with_end_state
from aprilsim.metrics.warmup import clamp_warmup

EXIT_ENGINES_GONE, EXIT_INTERRUPTED = 1, 130
LOCAL_MAX_LEN = 64  # --local scales the scenario so that max_response_len is about this


@dataclass
class Outcome:
    """What the command did: summary rows, step records to write, faults, figures."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    code: int = 0


def local_scale(max_response_len: int) -> float:
    """The default length scale of ``--local``: max_response_len becomes about LOCAL_MAX_LEN."""
    return min(1.0, LOCAL_MAX_LEN / max_response_len)


async def _vocab_of(url: str) -> int | None:
    """The vocabulary size a bundled server reports in /server_info (SGLang does not)."""
    import aiohttp

    with contextlib.suppress(Exception):
        async with aiohttp.ClientSession() as s, s.get(f"{url.rstrip('/')}/server_info",
                                                      timeout=aiohttp.ClientTimeout(total=5)) as r:
            body = await r.json()
            v = (body.get("model_config") or {}).get("vocab_size")
            return int(v) if v else None
    return None


async def build_cluster(opts: dict[str, Any], max_context: int):
    """The cluster of the run and the vocabulary size its prompts must use; raises
    EnginesUnreachable (exit 2) when a URL does not answer before the first step."""
    from real.runner.cluster import (
        DEFAULT_PROGRESS_DEADLINE_S,
        DEFAULT_STALLED_AFTER,
        Cluster,
        check_reachable,
    )

    deadline = opts.get("progress_deadline", DEFAULT_PROGRESS_DEADLINE_S)
    stalled = opts.get("stalled_after", DEFAULT_STALLED_AFTER)

    if opts["local"]:
        import torch

        from real.runner.local import LocalSpec, start_local

        torch.set_num_threads(1)  # one intra-op thread per engine: tiny models, shared CPUs
        spec = LocalSpec(max_context=max_context, min_step_seconds=opts.get("local_step_s") or 0.0)
        cluster = Cluster(await start_local(opts["local"], spec), progress_deadline_s=deadline,
                          stalled_after=stalled)
        return cluster, spec.vocab_size, "bundled engines in-process"
    from real.engines import connect, split_engine_url

    urls = [u.strip() for u in (opts["engines"] or "").split(",") if u.strip()] or [opts["router"]]
    engines = [connect(u) for u in urls]  # vllm+http://... -> VLLMEngine, else SGLangClient
    cluster = Cluster(engines, names=urls, progress_deadline_s=deadline, stalled_after=stalled)
    try:
        await check_reachable(cluster)
    except BaseException:
        await cluster.close()
        raise
    from real.engines import engine_vocab  # --vocab-size, else the server's, else probed

    try:
        vocab = opts["vocab_size"] or await _vocab_of(split_engine_url(urls[0])[1]) \
            or (await engine_vocab(engines[0]))[0]
    except BaseException:
        await cluster.close()
        raise
    what = "router" if opts["router"] else f"{len(urls)} engines"
    return cluster, vocab, what


def _free_source(opts: dict[str, Any], sc, vocab: int, name: str, log):
    from real.runner.source import FreeSource, load_callable, read_prompts, toy_verifier

    reward = toy_verifier if opts["reward"] in (None, "toy") else load_callable(opts["reward"])
    prompts = read_prompts(opts["prompts"], vocab)
    max_len = max(1, int(round(sc.max_response_len * opts["scale"])))
    return FreeSource(prompts, group_size=sc.group_size, max_len=max_len, reward=reward,
                      eos_ids=tuple(opts["eos_id"]), temperature=opts["temperature"],
                      seed=opts["seed"] or sc.seed, lengths_log=log, label=name)


async def run_all(sc, names: list[str], opts: dict[str, Any], out: Outcome,
                  progress_for) -> None:
    """Run every scheduler in turn on one cluster; fill ``out`` as steps finish."""
    from aprilsim.metrics.trace import Trace
    from real.runner.api import build_runtime
    from real.runner.cluster import AllEnginesDown
    from real.runner.source import load_callable

    scale = opts["scale"]
    max_prompt = int(sc.prompts.get("max_len", 2048))
    max_context = int(round(max_prompt * scale)) + int(round(sc.max_response_len * scale)) + 8
    cluster, vocab, what = await build_cluster(opts, max(64, max_context))
    train_fn = load_callable(opts["trainer"]) if opts["trainer"] else None
    log = open(opts["lengths_out"], "w") if opts["lengths_out"] else None  # noqa: SIM115
    rt = None
    try:
        for name in names:
            paths = opts["outputs"].get(name, {})
            trace = Trace(scheduler=name, n_engines=len(cluster), source="live") if paths else None
            source = _free_source(opts, sc, vocab, name, log) if opts["prompts"] else None
            done_steps: list[int] = []

            def progress(done: int, total: int, name=name, done_steps=done_steps) -> None:
                done_steps.append(done)
                progress_for(name, done, total)

            rt = build_runtime(sc, name, cluster, vocab_size=vocab, seed=opts["seed"],
                               scale=scale, source=source, train_fn=train_fn,
                               checkpoint=opts["checkpoint"], temperature=opts["temperature"],
                               progress=progress, trace=trace)
            t0 = time.monotonic()
            try:
                result = await rt.run()
                wall = time.monotonic() - t0
            finally:
                n = len(done_steps)
                warm = clamp_warmup(sc.warmup_steps, n)
                out.records += [{"scheduler": name, "warmup": r.step < warm, **r.to_dict()}
                                for r in rt.records[:n]]
                _write_outputs(trace, paths)
                for f in rt.faults:
                    out.notes.append(f"{name}: fault at {f.t:.1f}s on {f.engine}: {f.kind} ({f.message})")
            result.warmup_steps = clamp_warmup(sc.warmup_steps, len(result.steps))
            out.rows.append(with_end_state(result.summary(), result.end_state))
            gen = sum(r.generated_tokens for r in result.steps)
            per_req = rt.overhead_s / rt.requests * 1e3 if rt.requests else 0.0
            out.notes.append(
                f"{name}: {wall:.1f}s wall, {wall / len(result.steps):.2f}s per step, "
                f"{gen / wall:.0f} tokens/s, {rt.requests} requests, runner overhead "
                f"{per_req:.3f} ms/request, {len(rt.faults)} faults ({what})")
    except AllEnginesDown as e:
        out.error, out.code = f"all engines are gone: {e}; finished steps were written", EXIT_ENGINES_GONE
    finally:
        if rt is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(rt.final_drain())
        if opts["local"]:
            await cluster.close()
        else:
            with contextlib.suppress(Exception):
                await cluster.abort()
            await cluster.close()
        if log is not None:
            log.close()


def _write_outputs(trace, paths: dict[str, Path]) -> None:
    """The trace and the timeline of one scheduler, where asked (as `simulate` writes them)."""
    for kind, path in paths.items():
        if kind == "trace":
            trace.write(path)
        else:
            from aprilsim.report.timeline import write_timeline

            write_timeline(trace, path)
        click.echo(f"wrote {path}", err=True)


def main_async(sc, names: list[str], opts: dict[str, Any], progress_for) -> Outcome:
    """Run under asyncio with Ctrl-C and SIGTERM turned into an orderly interruption."""
    out = Outcome()

    async def guarded() -> None:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, task.cancel)  # type: ignore[union-attr]
        try:
            await run_all(sc, names, opts, out, progress_for)
        except asyncio.CancelledError:
            out.error, out.code = "interrupted: in-flight work aborted, finished steps written", EXIT_INTERRUPTED

    asyncio.run(guarded())
    return out


@click.command("run", cls=OneLineCommand, short_help="Run schedulers on live engines and record what simulate records.")
@click.argument("scenario", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--scheduler", "-s", "schedulers", multiple=True, help="Scheduler to run (repeatable); default: the scenario's `compare` list.")
@click.option("--steps", type=click.IntRange(min=1), help="Training steps (overrides the scenario).")
@click.option("--seed", type=int, help="Workload seed (overrides the scenario).")
@click.option("--warmup", type=click.IntRange(min=0), help="Steps left out of the summary.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array, one object per scheduler (the keys of `simulate --json`).")
@click.option("--steps-out", type=click.Path(dir_okay=False, path_type=Path), help="Write per-step records as JSON lines.")
@click.option("--trace", type=click.Path(dir_okay=False, path_type=Path), help="Write each scheduler's per-request trace (JSON lines; NAME inserted before the suffix when several run).")
@click.option("--timeline", type=click.Path(dir_okay=False, path_type=Path), help="Draw each scheduler's timeline (.png/.pdf/.svg, or .html).")
@click.option("--local", type=click.IntRange(min=1), help="Start N bundled engines in this process (CPU) and stop them at the end.")
@click.option("--engines", help="Comma-separated engine URLs (SGLang or `python -m real.serve`; vllm+http://... for vLLM).")
@click.option("--router", help="URL of an sglang-router in front of the engines.")
@click.option("--scale", type=click.FloatRange(min=0, max=1, min_open=True), help="Multiply every length and the trainer's fixed times by this (default: 1; with --local, max_response_len -> 64).")
@click.option("--vocab-size", type=click.IntRange(min=17), help="Vocabulary of the engines (default: what the server states, else probed: the smallest token id it refuses).")
@click.option("--temperature", type=float, default=1.0, show_default=True)
@click.option("--prompts", type=click.Path(exists=True, dir_okay=False, path_type=Path), help="Free mode: prompts JSONL (`input_ids` or `prompt`, optional `answer`); lengths from EOS.")
@click.option("--reward", help="Free mode: reward function module:function(prompt, output_ids, sample), or `toy` (default).")
@click.option("--eos-id", type=int, multiple=True, default=(2,), show_default=True, help="Free mode: stop token ids.")
@click.option("--lengths-out", type=click.Path(dir_okay=False, path_type=Path), help="Free mode: log observed lengths as JSONL for `aprilsim fit`.")
@click.option("--trainer", help="Training callable module:function(groups, step) instead of the modelled sleep.")
@click.option("--checkpoint", help="Weights to load on every update (/update_weights_from_disk).")
@click.option("--progress-deadline", type=click.FloatRange(min=0), default=60.0, show_default=True, help="Seconds an engine holding requests may stream no token before it is health-checked and, if it does not answer, treated as dead (0: never).")
@click.option("--stalled-after", type=click.IntRange(min=0), default=3, show_default=True, help="Progress deadlines in a row an engine may answer /health healthy yet stream no token before it is treated as dead anyway (0: never).")
@click.option("--local-step-s", type=float, default=0.0, hidden=True, help="Pad each step of the --local engines (tests).")
def run_command(scenario, schedulers, steps, seed, warmup, as_json, steps_out, trace, timeline, local, engines,
                router, scale, vocab_size, temperature, prompts, reward, eos_id, lengths_out, trainer,
                checkpoint, progress_deadline, stalled_after, local_step_s) -> None:
    """Run SCENARIO's schedulers, unchanged, on live engines (one of --local, --engines, --router)."""
    with _early_signals_interrupt():
        _run_command(scenario, schedulers, steps, seed, warmup, as_json, steps_out, trace,
                     timeline, local, engines, router, scale, vocab_size, temperature, prompts,
                     reward, eos_id, lengths_out, trainer, checkpoint, progress_deadline,
                     local_step_s, stalled_after)


class _Interrupted(BaseException):
    """SIGTERM before the asyncio loop took the signals over (like KeyboardInterrupt)."""


@contextlib.contextmanager
def _early_signals_interrupt():
    """Until the run loop installs its own handlers, SIGINT/SIGTERM end the command with one
    line and exit 130 (not a silent 143 or a traceback while torch imports)."""
    def on_term(signum, frame):
        raise _Interrupted

    import threading

    if threading.current_thread() is not threading.main_thread():  # signals are the main's
        yield
        return
    old = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    except (KeyboardInterrupt, _Interrupted):
        click.echo("aprilsim: error: interrupted before the run started; nothing was sent to "
                   "the engines", err=True)
        sys.exit(EXIT_INTERRUPTED)
    finally:
        signal.signal(signal.SIGTERM, old)


def _run_command(scenario, schedulers, steps, seed, warmup, as_json, steps_out, trace, timeline,
                 local, engines, router, scale, vocab_size, temperature, prompts, reward, eos_id,
                 lengths_out, trainer, checkpoint, progress_deadline, local_step_s,
                 stalled_after) -> None:
    from aprilsim.cli import _per_scheduler_paths, fail, with_overrides
    from aprilsim.config import ScenarioError, load_scenario
    from aprilsim.policies.base import SchedulerError
    from aprilsim.report.table import format_table

    if sum(x is not None for x in (local, engines, router)) != 1:
        fail("give exactly one of --local N, --engines URL,... or --router URL")
    if (reward or lengths_out) and not prompts:
        fail("--reward and --lengths-out need --prompts (free mode)")
    try:
        sc = with_overrides(load_scenario(scenario), steps=steps, warmup=warmup)
        names = list(schedulers) or list(sc.compare)
        from aprilsim.policies.registry import make_scheduler

        for n in names:
            make_scheduler(n, sc.settings_for(n))
        outputs = _per_scheduler_paths(names, trace_out=trace, timeline=timeline)
    except (ScenarioError, SchedulerError, ValueError, TypeError) as e:
        fail(str(e))
        return
    opts = dict(local=local, engines=engines, router=router, vocab_size=vocab_size, seed=seed,
                scale=scale if scale is not None else (local_scale(sc.max_response_len) if local else 1.0),
                temperature=temperature, prompts=prompts, reward=reward, eos_id=eos_id,
                lengths_out=lengths_out, trainer=trainer, checkpoint=checkpoint, outputs=outputs,
                local_step_s=local_step_s, progress_deadline=progress_deadline,
                stalled_after=stalled_after)
    live = sys.stderr.isatty()

    def progress_for(name: str, done: int, total: int) -> None:
        if live:
            click.echo(f"\r\033[Krunning {name}: step {done}/{total}", err=True, nl=False)
        elif not as_json:
            click.echo(f"{name}: step {done}/{total}", err=True)

    try:
        out = main_async(sc, names, opts, progress_for)
    except (ScenarioError, SchedulerError, ValueError) as e:
        fail(str(e))
        return
    if live:
        click.echo("\r\033[K", err=True, nl=False)
    if steps_out is not None:
        steps_out.write_text("".join(json.dumps(r) + "\n" for r in out.records))
    for note in out.notes:
        click.echo(note, err=True)
    if out.rows:
        if as_json:  # the keys of `simulate --json`, its `run` metadata included
            from aprilsim.cli import _command_line
            from aprilsim.report.run_output import run_meta

            meta = run_meta(sc, sc.seed if opts["seed"] is None else opts["seed"], _command_line())
            click.echo(json.dumps([{**r, "run": meta} for r in out.rows], indent=2))
        else:
            click.echo(f"scenario: {sc.name} live, lengths x{opts['scale']:.4g}  ({len(out.rows)} "
                       f"scheduler(s), {sc.batch_size} groups x {sc.group_size} samples, {sc.steps} steps)")
            click.echo(format_table(out.rows))
            click.echo(end_state_lines(out.rows))
    if out.error:
        click.echo(f"aprilsim: error: {out.error}", err=True)
        sys.exit(out.code)
