"""The live half of ``aprilsim validate``: connect, check, run every scheduler in rounds on the
engines, and keep each finished run (its steps, the engines' iterations, the machine check).

Per run: the engines' iteration rows (their own log, or rebuilt from the token streams and fitted
to the engine's iteration counter where it has one), vLLM's counters and running-request gauge
sampled every ``SAMPLE_S``, and the machine check (``real.machine``: event-loop lag, /proc CPU
shares, the client's wait for a CPU; :mod:`aprilsim.validate.starvation`: delivery bursts and
the starved flag). A run that finishes is handed to the store at once (``real.validate_store``);
a dead engine raises :class:`EnginesGone` with what was kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aprilsim.config import Scenario

    from .validate_store import RunStore
    from .validate_types import LiveOutcome, ValidateOptions


class EnginesGone(RuntimeError):
    """An engine died during a live run (exit 1; the finished runs are kept)."""


class Interrupted(RuntimeError):
    """SIGINT or SIGTERM during the live runs (exit 130; the finished runs are kept)."""


CHECK_TIMEOUT_S = 5.0
SAMPLE_S = 0.1  # engine metrics sampling period during a live run


async def iteration_rows(engine, since: int) -> list[dict[str, Any]]:
    """The engine's iteration records with seq > since (in-process: the engine's deque; HTTP:
    ``GET /iteration_log?since=N`` of a bundled server; vLLM and SGLang: none)."""
    from real.clients.connect import engine_family, unwrap

    base = unwrap(engine)
    inner = getattr(base, "engine", None)
    if inner is not None and hasattr(inner, "iterations"):
        return [r.to_dict() for r in list(inner.iterations) if r.seq > since]
    if engine_family(base) == "vllm":
        return []
    import aiohttp

    url = getattr(base, "base_url", None) or getattr(base, "url", None)
    if not url:
        return []
    with contextlib.suppress(Exception):
        async with aiohttp.ClientSession() as s, s.get(f"{str(url).rstrip('/')}/iteration_log",
                                                      params={"since": since},
                                                      timeout=aiohttp.ClientTimeout(total=10)) as r:
            if r.status != 200:
                return []
            body = await r.json()
            return list(body.get("records", []))
    return []


def _last_seq(rows: list[dict[str, Any]], prev: int) -> int:
    return max([prev, *(int(r["seq"]) for r in rows)])


async def precheck(opts: ValidateOptions) -> tuple[int | None, list[str]]:
    """Everything validate needs, checked before the first live run (one line each on failure):
    the calibration file loads, every engine answers ``/health``, the vocabulary is known
    (``--vocab-size``, the server's, or probed). Returns (vocabulary or None for --local, notes)."""
    from aprilsim.validate.costfit import load_calibration, load_client_overhead
    from real.clients.connect import connect, engine_vocab

    notes = []
    if opts.calibration:
        load_calibration(str(opts.calibration))
        load_client_overhead(str(opts.calibration))
        notes.append(f"calibration file {opts.calibration} loads")
    if opts.target.local is not None:
        return None, notes
    vocabs = []
    for u in opts.target.urls:
        e = connect(u)
        try:
            try:
                ok = await asyncio.wait_for(e.health(), CHECK_TIMEOUT_S)
            except asyncio.TimeoutError:
                ok = False
            if not ok:
                raise ValueError(f"{u}: the engine does not answer /health (within "
                                 f"{CHECK_TIMEOUT_S:.0f} s)")
            v, how = await engine_vocab(e, opts.target.vocab_size)
            vocabs.append(v)
            notes.append(f"{u}: healthy, vocabulary {v} ({how})")
        finally:
            await e.close()
    return min(vocabs), notes


async def _counters(engine) -> dict[str, float] | None:
    from real.clients.connect import unwrap

    base = unwrap(engine)
    return await base.counters() if hasattr(base, "counters") else None


class EngineSampler:
    """Reads an engine's iteration counter and running requests every SAMPLE_S while a run goes
    on (vLLM ``/metrics``, one read for both): (monotonic time, cumulative iterations) samples
    for :func:`aprilsim.validate.reconstruct.fit_counts`, and (time, running, waiting)."""

    def __init__(self, engine) -> None:
        from real.clients.connect import unwrap

        self.base = unwrap(engine)
        self.samples: list[tuple[float, float]] = []
        self.running: list[tuple[float, int, int]] = []
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if hasattr(self.base, "counters"):
            self._task = asyncio.ensure_future(self._loop())

    async def _read(self) -> tuple[dict | None, Any]:
        if hasattr(self.base, "snapshot"):
            return await self.base.snapshot()
        return await self.base.counters(), None

    async def _loop(self) -> None:
        while True:
            t = time.monotonic()
            c, load = await self._read()
            now = (t + time.monotonic()) / 2
            if load is not None:
                self.running.append((now, int(load.running), int(load.waiting)))
            if c and "iterations" in c:
                self.samples.append((now, c["iterations"]))
            elif not self.samples and load is None:
                return  # no counter on this engine (a bundled server, SGLang without metrics)
            await asyncio.sleep(SAMPLE_S)

    async def stop(self) -> list[tuple[float, float]]:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.samples:
            c = await self.base.counters()
            if c and "iterations" in c:
                self.samples.append((time.monotonic(), c["iterations"]))
        return self.samples


CounterSampler = EngineSampler  # the name earlier sessions used


def rows_for_run(logged: list[dict[str, Any]], logs: list, t0: float, shift: float,
                 counters: dict[str, float] | None,
                 samples: list[tuple[float, float]] | None = None,
                 ) -> tuple[list[dict[str, Any]], str, dict | None]:
    """One engine's rows of one run on the run's clock (``t_run``): its own log where it keeps
    one (and how far the reconstruction from its token streams is from it), else the rows
    rebuilt from the streams, made to agree with the engine's iteration counter where it has
    one (vLLM, ``samples``; the error reported is the count of the streams alone against it)."""
    from aprilsim.validate.reconstruct import fit_counts, match_error, reconstruct

    recon = reconstruct(logs)
    n_streams = len(recon)
    if samples and not logged:
        recon = fit_counts(recon, samples)
    for r in recon:
        r["t_run"] = float(r["t"]) - t0
    if logged:
        for r in logged:
            r["t_run"] = float(r["t"]) - shift
        err = match_error(recon, logged, offset=shift - t0) if recon else None
        return logged, "iteration log", err
    err = None
    if counters and counters.get("iterations"):
        n = counters["iterations"]
        err = {"engine_iterations": n, "reconstructed": float(n_streams),
               "count_rel_err": (n_streams - n) / n, "after_fit": float(len(recon))}
    return recon, "token stream" + (" + /metrics counts" if samples else ""), err


class Live:
    """One connected cluster and what every run on it shares (see :func:`run_live`)."""

    def __init__(self, sc: Scenario, opts: ValidateOptions, conn: Any, progress) -> None:
        self.sc, self.opts, self.conn, self.progress = sc, opts, conn, progress
        self.engines = [sl.engine for sl in conn.cluster.slots]
        self.seqs = [0] * len(self.engines)
        self.pids: list[int] = []

    async def start(self, vocab: int) -> None:
        """Warm up: one short request per engine and one draw of the workload (the first run's
        first step would otherwise carry the engines' first forward passes and the imports, a
        stall of seconds that no simulation has), then note where each engine's log stands."""
        from real.calibrate import _run_batch
        from real.machine import engine_pids

        self.sc.workload_for(self.opts.seed).generate(1, 0)  # a fresh one: runs draw their own
        await asyncio.gather(*(_run_batch(e, 1, 8, 4, vocab, seed=0) for e in self.engines))
        for e in self.engines:
            e.take()
        for i, e in enumerate(self.engines):
            self.seqs[i] = _last_seq(await iteration_rows(e, 0), 0)
        self.pids = engine_pids(self.opts.target.urls)

    async def pin(self) -> str:
        """``--pin``: the client on one core, the engines on the others (the client's own
        affinity is given back when the runs end: :meth:`unpin`)."""
        import os

        from real.machine import pin, pin_local

        self.affinity = os.sched_getaffinity(0)

        if self.conn.local:
            cores = sorted(os.sched_getaffinity(0))
            if len(cores) < 2:
                raise ValueError(f"--pin needs at least 2 cores; this process may use {len(cores)}")
            placed = await pin_local([sl.engine.inner for sl in self.conn.cluster.slots], cores[1:])
            os.sched_setaffinity(0, {cores[0]})
            return (f"pinned: client on core {cores[0]}, in-process engines on "
                    f"{sorted(set(placed.values()))}")
        got = pin(self.pids)
        eng = ", ".join(f"pid {p} on core {c}" for p, c in got["engines"].items()) or \
            "no engine process on this machine (only the client pinned)"
        return f"pinned: client on core {got['client_core']}; {eng}"

    async def one_run(self, spec: str, rnd: int, rounds: int, vocab: int) -> LiveOutcome:
        """Run ``spec`` once (round ``rnd``) with the machine check around it."""
        from aprilsim.metrics.trace import Trace
        from aprilsim.metrics.warmup import clamp_warmup
        from aprilsim.validate.scaled import make_policy
        from real.machine import CpuWindow, LoopLag
        from real.runner.api import build_runtime

        from .validate_types import LiveOutcome

        sc, opts, cluster = self.sc, self.opts, self.conn.cluster
        trace = Trace(scheduler=spec, n_engines=len(cluster), source="live")
        name = spec if rounds == 1 else f"{spec} (round {rnd + 1}/{rounds})"
        rt = build_runtime(sc, make_policy(sc, spec), cluster, vocab_size=vocab, seed=opts.seed,
                           steps=opts.steps, scale=opts.scale, trace=trace,
                           progress=lambda d, t: self.progress(name, d, t))
        for e in self.engines:
            e.take()
        before = [await _counters(e) for e in self.engines]
        samplers = [EngineSampler(e) for e in self.engines]
        lag, cpu = LoopLag(), CpuWindow(self.pids)
        for sm in samplers:
            sm.start()
        lag.start()
        cpu.start()
        t0 = time.monotonic()
        try:
            result = await rt.run()
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.shield(rt.final_drain())
            raise
        finally:
            samples = [await sm.stop() for sm in samplers]
            machine = {"loop_lag_ms": await lag.stop(), **cpu.stop()}
        wall = time.monotonic() - t0
        result.warmup_steps = clamp_warmup(sc.warmup_steps, len(result.steps))
        o = LiveOutcome(spec, result, [], trace, wall,
                        rt.overhead_s / rt.requests if rt.requests else 0.0, round=rnd)
        await self._collect(o, rt, before, samples, machine)
        o.running = [sm.running for sm in samplers]
        return o

    async def _collect(self, o: LiveOutcome, rt, before, samples, machine: dict[str, Any]) -> None:
        """The engines' rows, counters and streams of a finished run, and its machine check."""
        from aprilsim.validate.starvation import delivery, starved

        shift = (time.time() - time.monotonic()) + rt.clock_origin  # log stamps: time.time()
        streams = []
        for i, e in enumerate(self.engines):
            got = await iteration_rows(e, self.seqs[i])
            self.seqs[i] = _last_seq(got, self.seqs[i])
            after = await _counters(e)
            delta = ({k: after[k] - before[i][k] for k in after if k in before[i]}
                     if after and before[i] else None)
            logs = e.take()
            streams += logs
            rows, how, err = rows_for_run(got, logs, rt.clock_origin, shift, delta, samples[i])
            o.rows.append(rows)
            o.timing.append(how)
            o.recon_error.append(err)
            o.counters.append(delta)
        machine.update(delivery(streams))
        machine["starved"], machine["why"] = starved(machine)
        o.machine = machine

    def unpin(self) -> None:
        import os

        if getattr(self, "affinity", None):
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, self.affinity)

    def dead(self) -> list[str]:
        return [f"{s.name}: {s.hung or (s.faults[-1].message if s.faults else 'dead')}"
                for s in self.conn.cluster.slots if not s.alive]


async def _limits(live: Live, specs: list[str], store: RunStore | None, what: str,
                  notes: list[str]) -> tuple[dict[str, Any], str, list[str], dict[str, Any]]:
    """The engines' limits, description, checks and facts: the first session's when resuming
    (no probe), else read (or probed) from the engines and kept in the store."""
    from .validate_limits import engine_limits, probe_need

    if store is not None and store.setup:
        limits, what, notes = store.remember({}, what, notes)
        return limits, what, notes, store.setup.get("facts", {})
    limits, more, facts = await engine_limits(live.engines[0], live.opts,
                                              probe_need(live.sc, specs, len(live.engines)),
                                              live.conn.vocab_size)
    notes = [*notes, *more]
    if store is not None:
        limits, what, notes = store.remember(limits, what, notes, facts)
    return limits, what, notes, facts


async def run_live(sc: Scenario, specs: list[str], opts: ValidateOptions, progress,
                   ) -> tuple[list[LiveOutcome], dict[str, Any], str, list[str]]:
    """Check what is needed, then run every scheduler on one cluster, in ``opts.live_rounds``
    rounds (A B A B ...; round numbers from 0), skipping the runs ``opts.keep`` already holds and
    keeping each one that finishes there; return outcomes, engine limits, what ran, the checks."""
    from dataclasses import replace

    from real.clients.connect import stamped
    from real.runner.api import connect_cluster, max_context_of
    from real.runner.cluster import AllEnginesDown

    from .validate_store import RunStore

    vocab, notes = await precheck(opts)
    conn = await connect_cluster(replace(opts.target, vocab_size=vocab or opts.target.vocab_size),
                                 max_context_of(sc, opts.scale))
    conn.cluster.readmit_dead = False  # a run that lost an engine is no measurement: not healed
    for sl in conn.cluster.slots:
        sl.engine = stamped(sl.engine)
    live = Live(sc, opts, conn, progress)
    outcomes: list[LiveOutcome] = []
    what = f"{len(live.engines)} {conn.what}" if conn.local else conn.what
    try:
        await live.start(conn.vocab_size)
        store = RunStore(opts.keep).load() if opts.keep is not None else None
        limits, what, notes, facts = await _limits(live, specs, store, what, notes)
        if opts.pin:
            notes = [*notes, await live.pin()]
        done = store.done() if store is not None else {}
        rounds = opts.live_rounds
        for rnd in range(rounds):
            for spec in specs:
                if (spec, rnd) in done:
                    outcomes.append(done[(spec, rnd)])
                    continue
                try:
                    o = await live.one_run(spec, rnd, rounds, conn.vocab_size)
                except AllEnginesDown as e:
                    raise EnginesGone(f"all engines are gone ({e})") from None
                if live.dead():
                    raise EnginesGone(f"an engine died during {spec} round {rnd + 1}: "
                                      + "; ".join(live.dead()))
                outcomes.append(o)
                if store is not None:
                    store.save(o)
    finally:
        live.unpin()
        with contextlib.suppress(Exception):
            await asyncio.shield(conn.close())
    return outcomes, {**limits, "_facts": facts}, what, notes
