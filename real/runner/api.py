"""The live runner as a library: from a scenario, schedulers and engines to finished runs.

:func:`run_live` runs one scheduler on a :class:`Cluster` (:func:`build_runtime` builds its
runtime); :func:`run_schedulers` is the whole of ``aprilsim run`` but the printing: it connects
to the engines of a :class:`RunOptions` (:func:`connect_cluster`), runs every scheduler in turn
and returns an :class:`Outcome`. ``aprilsim validate`` (:mod:`real.validate`) uses the same
connection and clean-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from aprilsim.config import Scenario
from aprilsim.engine.router import make_router
from aprilsim.interrupts import handlers_kept
from aprilsim.metrics.end_state import with_end_state
from aprilsim.metrics.records import RunResult
from aprilsim.metrics.trace import Trace
from aprilsim.metrics.warmup import clamp_warmup
from aprilsim.policies.base import Scheduler
from aprilsim.scheduler_spec import build_scheduler, run_name
from aprilsim.workload.truth import scaled_length
from real.protocol import SamplingParams

from .cluster import AllEnginesDown, Cluster, Fault, check_reachable
from .faults import fault_line
from .options import EXIT_ENGINES_GONE, EXIT_INTERRUPTED, EngineTarget, FreeMode, RunOptions
from .runtime import LiveRuntime
from .source import FreeSource, LiveSource, ReplaySource
from .trainer import TrainerStandIn, TrainFn


@dataclass
class LiveRun:
    """A finished (or interrupted) live run: the records, the faults met, and runner figures."""

    result: RunResult | None
    runtime: LiveRuntime
    faults: list[Fault] = field(default_factory=list)

    @property
    def overhead_per_request_s(self) -> float:
        rt = self.runtime
        return rt.overhead_s / rt.requests if rt.requests else 0.0


def make_policy(scenario: Scenario, scheduler: str | Scheduler) -> Scheduler:
    """A registered name, module:Class or NAME@knob=v with the scenario's knobs, or an instance
    as is (`aprilsim.scheduler_spec.build_scheduler`)."""
    return build_scheduler(scenario, scheduler)


def build_runtime(
    scenario: Scenario,
    scheduler: str | Scheduler,
    cluster: Cluster,
    *,
    vocab_size: int,
    seed: int | None = None,
    steps: int | None = None,
    scale: float = 1.0,
    source: LiveSource | None = None,
    train_fn: TrainFn | None = None,
    checkpoint: str | None = None,
    temperature: float = 1.0,
    progress: Callable[[int, int], None] | None = None,
    trace: Trace | None = None,
    stall_s: float = 30.0,
) -> LiveRuntime:
    """The live counterpart of ``aprilsim.sim.build.build_simulation``.

    Replay mode unless ``source`` (e.g. a :class:`FreeSource`) is given. ``scale`` multiplies
    every length of the workload and the trainer's fixed times (``base_s``, ``sync_s``); the
    per-token training time applies to the scaled tokens, so training keeps its share of a step.
    """
    policy = make_policy(scenario, scheduler)
    cluster.router = make_router(scenario.cluster.router)  # a fresh router per run, as simulated
    if source is None:
        source = ReplaySource(scenario.workload_for(seed), vocab_size, scale,
                              SamplingParams(temperature=temperature))
    tm = scenario.trainer_model()
    tm = replace(tm, base_s=tm.base_s * scale, sync_s=tm.sync_s * scale)
    return LiveRuntime(
        source=source, cluster=cluster, scheduler=policy, batch_size=scenario.batch_size,
        steps=steps if steps is not None else scenario.steps,
        trainer=TrainerStandIn(tm, train_fn, checkpoint), progress=progress, trace=trace,
        stall_s=stall_s,
    )


async def run_live(scenario: Scenario, scheduler: str | Scheduler, cluster: Cluster,
                   **kw: Any) -> LiveRun:
    """Run ``scheduler`` on ``cluster``; the summary leaves out the scenario's warm-up steps."""
    rt = build_runtime(scenario, scheduler, cluster, **kw)
    result = await rt.run()
    result.warmup_steps = clamp_warmup(scenario.warmup_steps, len(result.steps))
    result.scheduler = run_name(scheduler, result.scheduler)
    return LiveRun(result, rt, list(rt.faults))


ProgressFor = Callable[[str, int, int], None]  # (scheduler, steps done, steps in all)
Notify = Callable[[str], None]  # a line to show now (an engine dropped, re-admitted, silent)


@dataclass
class Outcome:
    """What a run of several schedulers gave: summary rows, step records (warm-up marked),
    notes (faults, figures), the files written, and an error with its exit code (0: none)."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    written: list[Path] = field(default_factory=list)
    error: str | None = None
    code: int = 0
    notify: Notify | None = None  # hears engine events as they happen, not only in the notes


@dataclass
class Connected:
    """A cluster ready to run on, the vocabulary its prompts must use, and what it is (for
    notes)."""

    cluster: Cluster
    vocab_size: int
    what: str
    local: bool

    async def close(self) -> None:
        """Stop what the run started: local engines stop; remote ones get their work aborted."""
        if not self.local:
            with contextlib.suppress(Exception):
                await self.cluster.abort()
        await self.cluster.close()


def max_context_of(scenario: Scenario, scale: float) -> int:
    """The longest prompt + response of ``scenario`` at ``scale`` (and a margin), at least 64:
    the context the local engines are sized for."""
    return max(64, scaled_length(scenario.max_prompt_len, scale)
               + scaled_length(scenario.max_response_len, scale) + 8)


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


async def connect_cluster(target: EngineTarget, max_context: int) -> Connected:
    """The cluster of ``target``: local engines started (sized for ``max_context``), or every URL
    connected and asked for ``/health`` before the first step (EnginesUnreachable, exit 2,
    when one does not answer) and the vocabulary found (given, stated, or probed)."""
    deadline = target.progress_deadline_s
    if target.local is not None:
        import torch

        from .local import LocalSpec, start_local

        torch.set_num_threads(1)  # one intra-op thread per engine: tiny models, shared CPUs
        spec = LocalSpec(max_context=max_context, min_step_seconds=target.local_step_s or 0.0)
        cluster = Cluster(await start_local(target.local, spec), progress_deadline_s=deadline,
                          stalled_after=target.stalled_after)
        return Connected(cluster, spec.vocab_size, "bundled engines in-process", local=True)
    from real.clients.connect import connect, engine_vocab, split_engine_url

    urls = list(target.urls)
    engines = [connect(u) for u in urls]  # vllm+http://... -> VLLMEngine, else SGLangClient
    cluster = Cluster(engines, names=urls, progress_deadline_s=deadline,
                      stalled_after=target.stalled_after)
    try:
        await check_reachable(cluster)
        vocab = target.vocab_size or await _vocab_of(split_engine_url(urls[0])[1]) \
            or (await engine_vocab(engines[0]))[0]
    except BaseException:
        await cluster.close()
        raise
    what = "router" if target.router else f"{len(urls)} engines"
    return Connected(cluster, vocab, what, local=False)


def free_source(free: FreeMode, scenario: Scenario, *, vocab_size: int, scale: float,
                temperature: float, seed: int | None, label: str, lengths_log=None) -> FreeSource:
    """The free-mode source of one scheduler's run: the prompt file's prompts in the scenario's
    groups, responses up to its max_response_len x ``scale``, ended by EOS, rewarded."""
    from .source import load_callable, read_prompts, toy_verifier

    reward = toy_verifier if free.reward in (None, "toy") else load_callable(free.reward)
    prompts = read_prompts(free.prompts, vocab_size)
    max_len = scaled_length(scenario.max_response_len, scale)
    return FreeSource(prompts, group_size=scenario.group_size, max_len=max_len, reward=reward,
                      eos_ids=tuple(free.eos_ids), temperature=temperature,
                      seed=seed or scenario.seed, lengths_log=lengths_log, label=label)


def _write_outputs(trace: Trace | None, paths: dict[str, Path], out: Outcome) -> None:
    """The trace and the timeline of one scheduler, where asked (as `simulate` writes them)."""
    for kind, path in paths.items():
        if trace is None:
            continue
        if kind == "trace":
            trace.write(path)
        else:
            from aprilsim.report.timeline import write_timeline

            write_timeline(trace, path)
        out.written.append(path)


async def run_all(scenario: Scenario, names: list[str], opts: RunOptions, out: Outcome,
                  progress_for: ProgressFor = lambda *a: None) -> None:
    """Run every scheduler of ``names`` in turn on one cluster; fill ``out`` as steps finish
    (what finished is kept when a run fails or is cancelled); ``out.notify`` hears of engine
    events as they happen, each line led by the scheduler's name."""
    from .source import load_callable

    scale = opts.scale
    conn = await connect_cluster(opts.target, max_context_of(scenario, scale))
    cluster = conn.cluster
    train_fn = load_callable(opts.trainer) if opts.trainer else None
    lengths_out = opts.free.lengths_out if opts.free else None
    log = open(lengths_out, "w") if lengths_out else None  # noqa: SIM115
    rt = None
    try:
        for name in names:
            paths = opts.outputs.get(name, {})
            trace = Trace(scheduler=name, n_engines=len(cluster), source="live") if paths else None
            source = None if opts.free is None else free_source(
                opts.free, scenario, vocab_size=conn.vocab_size, scale=scale,
                temperature=opts.temperature, seed=opts.seed, label=name, lengths_log=log)
            done_steps: list[int] = []

            def progress(done: int, total: int, name=name, done_steps=done_steps) -> None:
                done_steps.append(done)
                progress_for(name, done, total)

            rt = build_runtime(scenario, name, cluster, vocab_size=conn.vocab_size, seed=opts.seed,
                               scale=scale, source=source, train_fn=train_fn,
                               checkpoint=opts.checkpoint, temperature=opts.temperature,
                               progress=progress, trace=trace)
            rt.notify = cluster.on_note = _said(out.notify, name)
            t0 = time.monotonic()
            try:
                result = await rt.run()
                wall = time.monotonic() - t0
            finally:
                n = len(done_steps)
                warm = clamp_warmup(scenario.warmup_steps, n)
                out.records += [{"scheduler": name, "warmup": r.step < warm, **r.to_dict()}
                                for r in rt.records[:n]]
                _write_outputs(trace, paths, out)
                out.notes += [f"{name}: {fault_line(f, rt.steps)}" for f in rt.faults]
            result.warmup_steps = clamp_warmup(scenario.warmup_steps, len(result.steps))
            result.scheduler = run_name(name, result.scheduler)
            out.rows.append(with_end_state(result.summary(), result.end_state))
            gen = sum(r.generated_tokens for r in result.steps)
            per_req = rt.overhead_s / rt.requests * 1e3 if rt.requests else 0.0
            out.notes.append(
                f"{name}: {wall:.1f}s wall, {wall / len(result.steps):.2f}s per step, "
                f"{gen / wall:.0f} tokens/s, {rt.requests} requests, runner overhead "
                f"{per_req:.3f} ms/request, {_faults(rt.faults)} ({conn.what})")
    except AllEnginesDown as e:
        out.error, out.code = (f"all engines are gone: {e}; finished steps were written",
                               EXIT_ENGINES_GONE)
    finally:
        if rt is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(rt.final_drain())
        await conn.close()
        if log is not None:
            log.close()


def _said(notify: Notify | None, name: str) -> Notify | None:
    """``notify`` with every line led by the scheduler's name."""
    return None if notify is None else (lambda line: notify(f"{name}: {line}"))


def _faults(faults: list[Fault]) -> str:
    """"0 faults", "1 fault", "2 faults, 1 engine death": engine events, not requests."""
    deaths = sum(f.kind == "engine_died" for f in faults)
    n = f"{len(faults)} fault{'s' if len(faults) != 1 else ''}"
    return n + (f", {deaths} engine death{'s' if deaths != 1 else ''}" if deaths else "")


def run_schedulers(scenario: Scenario, names: list[str], opts: RunOptions,
                   progress_for: ProgressFor = lambda *a: None,
                   notify: Notify | None = None) -> Outcome:
    """``aprilsim run`` without its printing: :func:`run_all` under asyncio, with Ctrl-C and
    SIGTERM turned into an orderly interruption (in-flight work aborted, finished steps kept,
    exit code 130 in the outcome); ``notify`` hears of engine events as they happen."""
    out = Outcome(notify=notify)

    async def guarded() -> None:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, task.cancel)  # type: ignore[union-attr]
        try:
            await run_all(scenario, names, opts, out, progress_for)
        except asyncio.CancelledError:
            out.error, out.code = ("interrupted: in-flight work aborted, finished steps written",
                                   EXIT_INTERRUPTED)

    with handlers_kept():  # asyncio leaves the default handlers behind
        asyncio.run(guarded())
    return out


__all__ = ["EXIT_ENGINES_GONE", "EXIT_INTERRUPTED", "Connected", "EngineTarget", "FreeMode",
           "FreeSource", "LiveRun", "Outcome", "ReplaySource", "RunOptions", "build_runtime",
           "connect_cluster", "free_source", "make_policy", "max_context_of", "run_all", "run_live",
           "run_schedulers"]
