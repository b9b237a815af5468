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
from dataclasses import replace as dc_replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from aprilsim.cli_errors import OneLineCommand
from real.runner.options import EngineTarget

if TYPE_CHECKING:  # loaded where used: `aprilsim validate --help` stays under 0.5 s CPU
    from aprilsim.config import Scenario
    from aprilsim.metrics.records import RunResult
    from aprilsim.metrics.trace import Trace
    from aprilsim.validate.costfit import CostFit


@dataclass(frozen=True)
class ValidateOptions:
    """``aprilsim validate``'s options: the engines, the length scale (and the trainer's fixed
    times), the workload seed, the steps per run (default: the scenario's), a cost calibration
    file (default: fitted on the live runs), interleaved rounds of every scheduler, and the
    concurrency of engines that do not report it. ``cross_fit`` (R >= 2 rounds, no calibration
    file): every round is judged with the cost fitted on the other R - 1 rounds (leave one round
    out), instead of one extra round run for the fit alone."""

    target: EngineTarget
    scale: float = 1.0
    seed: int | None = None
    steps: int | None = None
    calibration: Path | None = None
    repeats: int = 1
    max_running: int | None = None
    cross_fit: bool = False

    @property
    def holdout_round(self) -> bool:
        """Whether one more round runs first, for the fit alone (R >= 2, no file, no cross-fit)."""
        return self.repeats > 1 and not self.calibration and not self.cross_fit

    @property
    def cross_fitted(self) -> bool:
        """Whether each round is judged with the cost fitted on the other rounds."""
        return self.cross_fit and self.repeats > 1 and not self.calibration


@dataclass
class LiveOutcome:
    """One scheduler's live run, the engines' iteration rows in its time (runtime clock), traces."""

    label: str
    result: RunResult
    rows: list[list[dict[str, Any]]]  # per engine; ``t_run``: end of step on the run's clock
    trace: Trace
    wall_s: float
    overhead_per_request_s: float
    round: int = 0
    timing: list[str] = field(default_factory=list)  # per engine: "iteration log" | "token stream"
    recon_error: list[dict[str, float] | None] = field(default_factory=list)  # vs the log, per engine
    counters: list[dict[str, float] | None] = field(default_factory=list)  # vLLM /metrics deltas


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
    live: list[LiveOutcome] = field(default_factory=list)  # the judged rounds' runs
    sim: dict[str, RunResult] = field(default_factory=dict)
    sim_traces: dict[str, Trace] = field(default_factory=dict)
    calibration_from: str = "iteration logs of the live runs"
    timings: dict[str, float] = field(default_factory=dict)
    held_out: bool = False  # the cost was fitted on runs the comparison does not use
    checks: list[str] = field(default_factory=list)  # what was checked before the first run
    calibration_runs: list[LiveOutcome] = field(default_factory=list)
    # cross-fitting: per judged round, its own cost (fitted on the other rounds) and simulations
    round_fits: dict[int, CostFit] = field(default_factory=dict)
    round_sims: dict[tuple[str, int], RunResult] = field(default_factory=dict)

    def fit_for(self, round_: int) -> CostFit:
        """The cost that judges ``round_`` (its own under cross-fitting, else the one fit)."""
        return self.round_fits.get(round_, self.fit)

    def sim_for(self, label: str, round_: int) -> RunResult:
        """The simulation ``round_``'s run of ``label`` is compared with."""
        return self.round_sims.get((label, round_), self.sim[label])

    @property
    def rounds(self) -> list[list[LiveOutcome]]:
        """The judged runs by round, in the order they ran."""
        out: dict[int, list[LiveOutcome]] = {}
        for o in self.live:
            out.setdefault(o.round, []).append(o)
        return [out[k] for k in sorted(out)]


async def _iteration_rows(engine, since: int) -> list[dict[str, Any]]:
    """The engine's iteration records with seq > since (in-process: the engine's deque; HTTP:
    ``GET /iteration_log?since=N`` of a bundled server; vLLM and SGLang: none)."""
    from real.clients.connect import unwrap

    base = unwrap(engine)
    inner = getattr(base, "engine", None)
    if inner is not None and hasattr(inner, "iterations"):
        return [r.to_dict() for r in list(inner.iterations) if r.seq > since]
    if _is_vllm(base):
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


def engine_rules(engine: Any, version: str | None, kv_block: int | None = None) -> dict[str, Any]:
    """When a simulated abort lands, where a retracted request re-enters the queue and how its
    prefix cache keeps prompts, as the engine's family does (``ENGINE_FAMILY_RULES``: SGLang's
    are its preset rules); the server's own cache grain (`kv_block`: vLLM's KV block size,
    SGLang's page size) replaces the family's default one."""
    from aprilsim.engine.cost import ENGINE_FAMILY_RULES
    from real.clients.connect import engine_family

    rules = dict(ENGINE_FAMILY_RULES[engine_family(engine, version)])
    if kv_block and "prefix_cache_block" in rules:
        rules["prefix_cache_block"] = int(kv_block)
    return rules


def kv_block_size(info: Any) -> int | None:
    """The prefix cache's grain a server reports, or None: vLLM's KV block size
    (``vllm:cache_config_info`` in /metrics), SGLang's resolved ``page_size`` (/server_info,
    the same on every worker)."""
    raw = getattr(info, "raw", None) or {}
    block = getattr(raw.get("metrics"), "block_size", None)
    if block:
        return int(block)
    pages = {w.get("page_size") for w in raw.get("workers") or [] if isinstance(w, dict)}
    if len(pages) == 1:
        (page,) = pages
        if isinstance(page, int) and not isinstance(page, bool) and page >= 1:
            return page
    return None


def _is_vllm(engine: Any) -> bool:
    from real.clients.connect import engine_family

    return engine_family(engine) == "vllm"


def _last_seq(rows: list[dict[str, Any]], prev: int) -> int:
    return max([prev, *(int(r["seq"]) for r in rows)])


CHECK_TIMEOUT_S = 5.0


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
                raise ValueError(f"{u}: the engine does not answer /health (within {CHECK_TIMEOUT_S:.0f} s)")
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


SAMPLE_S = 0.1  # vLLM /metrics sampling period during a live run


class CounterSampler:
    """Reads an engine's iteration counter (vLLM ``/metrics``) every SAMPLE_S while a run goes
    on: (monotonic time, cumulative iterations) samples for
    :func:`aprilsim.validate.reconstruct.fit_counts`."""

    def __init__(self, engine) -> None:
        from real.clients.connect import unwrap

        self.base = unwrap(engine)
        self.samples: list[tuple[float, float]] = []
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if hasattr(self.base, "counters"):
            self._task = asyncio.ensure_future(self._loop())

    async def _loop(self) -> None:
        while True:
            t = time.monotonic()
            c = await self.base.counters()
            if c and "iterations" in c:
                self.samples.append(((t + time.monotonic()) / 2, c["iterations"]))
            elif not self.samples:
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


def rows_for_run(logged: list[dict[str, Any]], logs: list, t0: float, shift: float,
                 counters: dict[str, float] | None,
                 samples: list[tuple[float, float]] | None = None) -> tuple[list[dict[str, Any]], str, dict | None]:
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


async def run_live(sc: Scenario, specs: list[str], opts: ValidateOptions, progress,
                   rounds: int = 1) -> tuple[list[LiveOutcome], dict[str, int], str, list[str]]:
    """Check what is needed, then run every scheduler on one cluster, in ``rounds`` rounds
    (A B A B ...; round numbers from 0); return outcomes, engine limits, what ran, the checks."""
    from dataclasses import replace

    from aprilsim.metrics.trace import Trace
    from aprilsim.metrics.warmup import clamp_warmup
    from aprilsim.validate.scaled import make_policy
    from real.clients.connect import stamped
    from real.runner.api import build_runtime, connect_cluster, max_context_of

    vocab, notes = await precheck(opts)
    scale = opts.scale
    conn = await connect_cluster(replace(opts.target, vocab_size=vocab or opts.target.vocab_size),
                                 max_context_of(sc, scale))
    cluster, vocab, what = conn.cluster, conn.vocab_size, conn.what
    for sl in cluster.slots:
        sl.engine = stamped(sl.engine)
    outcomes: list[LiveOutcome] = []
    try:
        info = await cluster.slots[0].engine.server_info()
        limits = {"max_running": int(info.max_running_requests or opts.max_running or 64),
                  "kv_capacity": int(info.kv_capacity_tokens or 1 << 30),
                  **engine_rules(cluster.slots[0].engine, info.version, kv_block_size(info))}
        if limits.get("prefix_cache", "none") != "none":
            # validate relabels the weights and loads none, so the engines keep their caches
            limits["prefix_cache_flush"] = False
            block = limits.get("prefix_cache_block", 1)
            notes.append(f"prefix cache: {limits['prefix_cache']}, kept across weight updates "
                         "(the engine family's default; validate loads no weights), serving "
                         + ("token by token" if block == 1 else f"whole blocks of {block} tokens"))
        if not info.max_running_requests:
            notes.append(f"max_running {limits['max_running']}: not reported by the engine "
                         f"({'--max-running' if opts.max_running else 'assumed'})")
        engines = [sl.engine for sl in cluster.slots]
        seqs = [0] * len(engines)
        for i, e in enumerate(engines):
            seqs[i] = _last_seq(await _iteration_rows(e, 0), 0)
        for rnd in range(rounds):
            for spec in specs:
                trace = Trace(scheduler=spec, n_engines=len(cluster), source="live")
                rt = build_runtime(sc, make_policy(sc, spec), cluster, vocab_size=vocab,
                                   seed=opts.seed, steps=opts.steps, scale=scale,
                                   progress=lambda d, t, spec=spec, rnd=rnd: progress(
                                       spec if rounds == 1 else f"{spec} (round {rnd + 1}/{rounds})", d, t),
                                   trace=trace)
                for e in engines:
                    e.take()
                before = [await _counters(e) for e in engines]
                samplers = [CounterSampler(e) for e in engines]
                for sm in samplers:
                    sm.start()
                t0 = time.monotonic()
                try:
                    result = await rt.run()
                finally:
                    samples = [await sm.stop() for sm in samplers]
                wall = time.monotonic() - t0
                result.warmup_steps = clamp_warmup(sc.warmup_steps, len(result.steps))
                # iteration stamps are time.time(); the run's clock is monotonic from its origin
                shift = (time.time() - time.monotonic()) + rt.clock_origin
                o = LiveOutcome(spec, result, [], trace, wall,
                                rt.overhead_s / rt.requests if rt.requests else 0.0, round=rnd)
                for i, e in enumerate(engines):
                    got = await _iteration_rows(e, seqs[i])
                    seqs[i] = _last_seq(got, seqs[i])
                    after = await _counters(e)
                    delta = ({k: after[k] - before[i][k] for k in after if k in before[i]}
                             if after and before[i] else None)
                    rows, how, err = rows_for_run(got, e.take(), rt.clock_origin, shift, delta, samples[i])
                    o.rows.append(rows)
                    o.timing.append(how)
                    o.recon_error.append(err)
                    o.counters.append(delta)
                outcomes.append(o)
    finally:
        await conn.close()
    return outcomes, limits, (f"{len(engines)} {what}" if conn.local else what), notes


def steady_rows(o: LiveOutcome) -> list[list[dict[str, Any]]]:
    """Iteration rows after the run's warm-up steps (engine warm-up left out of the fit)."""
    warm = o.result.warmup_steps
    t_min = o.result.steps[warm].rollout_start_s if warm < len(o.result.steps) else 0.0
    return [[r for r in eng if r["t_run"] >= t_min] for eng in o.rows]


def fit_rows(o: LiveOutcome) -> list[list[dict[str, Any]]]:
    """The steady rows a cost is fitted on, each rebuilt prefill counting the prompt tokens the
    engine computed (`pricing.computed_rows`), as the pricing counts them."""
    from aprilsim.validate.pricing import computed_rows

    return [computed_rows(rows, share) for rows, share in zip(steady_rows(o), computed_shares(o), strict=True)]


def validate(sc: Scenario, specs: list[str], opts: ValidateOptions,
             progress=lambda *a: None, save: Path | None = None) -> Validation:
    """Check, run live, calibrate, simulate: the whole of ``aprilsim validate`` but the report.

    ``opts.repeats`` R > 1: the judged runs are R interleaved rounds; without a calibration
    file one more round runs first, for the fit alone (held out of every comparison).
    ``save``: pickle the live runs there (:func:`load_live` reads them back for :func:`judge`)."""
    repeats = max(1, opts.repeats)
    holdout = opts.holdout_round
    t0 = time.monotonic()
    live, limits, what, checks = asyncio.run(run_live(
        sc, specs, opts, progress, rounds=repeats + (1 if holdout else 0)))
    t_live = time.monotonic() - t0
    if save is not None:
        import pickle

        save.write_bytes(pickle.dumps((live, limits, what, checks, t_live)))
    return judge(sc, specs, opts, live, limits, what, checks, t_live)


def load_live(path: Path) -> tuple[list[LiveOutcome], dict[str, Any], str, list[str], float]:
    """Live runs saved by ``validate(..., save=path)``: (live, limits, engines, checks, seconds)."""
    import pickle

    return pickle.loads(path.read_bytes())


def judge(sc: Scenario, specs: list[str], opts: ValidateOptions, live: list[LiveOutcome],
          limits: dict[str, Any], what: str, checks: list[str], t_live: float) -> Validation:
    """Fit (or load) the cost and simulate every scheduler against live runs already made: the
    offline half of :func:`validate`, so saved live runs can be judged again."""
    from aprilsim.validate.costfit import (
        CostFit,
        cost_errors,
        fit_iterations,
        load_calibration,
        load_client_overhead,
    )
    from aprilsim.validate.scaled import matched_engine

    holdout = opts.holdout_round
    limits = dict(limits)
    calib = [o for o in live if holdout and o.round == 0]
    judged = [o for o in live if not (holdout and o.round == 0)]
    fit_on = calib or judged
    logs = [eng for o in fit_on for eng in fit_rows(o)]
    fit = None
    if any(logs):
        try:
            fit = fit_iterations(logs)
        except ValueError:
            fit = None
    source = (f"the iteration rows of a calibration round held out of the comparison "
              f"({len(calib)} runs, warm-up steps left out)" if calib
              else "iteration rows of the live runs (warm-up steps left out; not held out)")
    if opts.calibration:
        cost = load_calibration(str(opts.calibration))
        de, pe, nd, npre = cost_errors(cost, logs) if any(logs) else (0.0, 0.0, 0, 0)
        fit = CostFit(cost=cost, wall=cost, overhead_s=fit.overhead_s if fit else 0.0,
                      decode_median_err=de, prefill_median_err=pe, n_decode=nd, n_prefill=npre,
                      decode_share=fit.decode_share if fit else 0.0,
                      source=f"file {opts.calibration}, errors against the live runs' steps")
        source = f"{opts.calibration} (held out: measured on its own runs)"
    if fit is None:
        raise RuntimeError("no decode iterations were logged or rebuilt from the token streams: "
                           "give --calibration FILE (from `aprilsim calibrate`)")
    if opts.calibration:
        limits["client_overhead_s"] = load_client_overhead(str(opts.calibration))
    engine = matched_engine(fit.effective, **limits)
    if holdout:  # rounds counted from the first judged one (copies: ``live`` stays as run)
        judged = [dc_replace(o, round=o.round - 1) for o in judged]
    v = Validation(scenario=sc, specs=specs, scale=opts.scale, seed=opts.seed,
                   steps=opts.steps or sc.steps, engines=what, limits=limits, fit=fit,
                   live=judged, calibration_from=source, held_out=bool(calib or opts.calibration),
                   checks=checks, calibration_runs=calib)
    t1 = time.monotonic()
    for o in [] if opts.cross_fitted else judged:
        if o.label in v.sim:
            continue
        v.sim[o.label], v.sim_traces[o.label] = _simulate_like(sc, o, engine, opts)
    if opts.cross_fitted:
        _cross_fit(v, sc, opts, limits)
    v.timings = {"live_s": t_live, "sim_s": time.monotonic() - t1}
    return v


def _simulate_like(sc: Scenario, o: LiveOutcome, engine, opts: ValidateOptions):
    """The simulation a live run is compared with (its scheduler, engines and steps) and its trace."""
    from aprilsim.metrics.trace import Trace
    from aprilsim.validate.scaled import simulate_matched

    tr = Trace(scheduler=o.label, n_engines=len(o.rows), source="sim")
    return simulate_matched(sc, o.label, engine, n_engines=len(o.rows), scale=opts.scale,
                            seed=opts.seed, steps=len(o.result.steps), trace=tr), tr


def _cross_fit(v: Validation, sc: Scenario, opts: ValidateOptions, limits: dict[str, Any]) -> None:
    """Leave one round out: fit the cost on the other rounds' iteration rows, simulate every
    scheduler with it, and judge the round by that (each judged run stays out of its own fit, and
    the machine's drift from round to round is averaged into every fit instead of one round's)."""
    from aprilsim.validate.costfit import fit_iterations
    from aprilsim.validate.scaled import matched_engine

    rounds = sorted({o.round for o in v.live})
    for r in rounds:
        logs = [eng for o in v.live if o.round != r for eng in fit_rows(o)]
        fit = fit_iterations(logs)
        v.round_fits[r] = fit
        engine = matched_engine(fit.effective, **limits)
        for o in v.live:
            if o.round != r or (o.label, r) in v.round_sims:
                continue
            v.round_sims[(o.label, r)], tr = _simulate_like(sc, o, engine, opts)
            if r == rounds[0]:
                v.sim_traces[o.label] = tr
    v.fit = v.round_fits[rounds[0]]
    v.sim.update({lab: res for (lab, r), res in v.round_sims.items() if r == rounds[0]})
    v.held_out = True
    v.calibration_from = (f"cross-fitted: each of the {len(rounds)} rounds is judged with the cost "
                          f"fitted on the iteration rows of the other {len(rounds) - 1} (warm-up "
                          f"steps left out); the first round's fit is shown")


def comparisons(v: Validation, round_: int | None = 0):
    """The per-scheduler comparisons of one round of a validation (all rounds: ``None``)."""
    from aprilsim.validate.compare import compare_runs
    from aprilsim.validate.pricing import per_step

    return [compare_runs(o.label, v.sim_for(o.label, o.round), o.result, per_step(o.result, o.rows),
                         per_step(o.result, o.rows, v.fit_for(o.round).effective, computed_shares(o)))
            for o in v.live if round_ is None or o.round == round_]


def computed_shares(o: LiveOutcome) -> list[float | None]:
    """Per engine of a live run, the share of the prompt tokens its rows count that it computed
    (`pricing.computed_share` of its counters), for rows rebuilt from token streams (they count
    every prompt token sent); None (all computed) for an engine's own iteration log, whose
    prefill rows count computed tokens, and where the engine reports no cache hits."""
    from aprilsim.validate.pricing import computed_share

    out: list[float | None] = []
    for i in range(len(o.rows)):
        rebuilt = i < len(o.timing) and o.timing[i].startswith("token stream")
        c = o.counters[i] if i < len(o.counters) else None
        out.append(computed_share(c) if rebuilt else None)
    return out


def live_notes(v: Validation) -> dict[str, Any]:
    """What the engines said about the runs: timing source, the reconstruction's error against
    the engine's own log (or vLLM's iteration count), vLLM's prefix-cache hits and preemptions."""
    import numpy as np

    recon = [e for o in v.live for e in o.recon_error if e]
    out: dict[str, Any] = {"timing": sorted({t for o in v.live for t in o.timing})}
    if recon and "matched_share" in recon[0]:
        keys = [k for k in recon[0] if k not in ("logged", "reconstructed")]
        out["reconstruction_vs_log"] = {k: float(np.median([e[k] for e in recon if k in e])) for k in keys}
    elif recon:
        out["reconstruction_vs_vllm_metrics"] = {
            "count_rel_err_median": float(np.median([e["count_rel_err"] for e in recon])),
            "runs": len(recon)}
    cs = [c for o in v.live for c in o.counters if c]
    if cs and not any("prefix_queries" in c for c in cs):  # SGLang's counters
        out["engine_counters"] = {"iterations": sum(c.get("iterations", 0) for c in cs),
                                  "busy_s": sum(c.get("busy_s", 0) for c in cs)}
    elif cs:
        q = sum(c.get("prefix_queries", 0) for c in cs)
        out["vllm"] = {"prefix_cache_hit_share": sum(c.get("prefix_hits", 0) for c in cs) / q if q else None,
                       "preemptions": sum(c.get("preemptions", 0) for c in cs),
                       "iterations": sum(c.get("iterations", 0) for c in cs)}
    return out


# ------------------------------------------------------------------------------ report
def write_all(v: Validation, out: Path, figures: bool = True) -> dict[str, Any]:
    """Compare, draw and write ``out/report.md``, ``out/report.json`` and the figures."""
    from aprilsim.validate.report import report_dict, write_figures, write_report
    from aprilsim.validate.rounds import pooled

    rows = comparisons(v, 0)
    by_round = [comparisons(v, r) for r in range(len(v.rounds))]
    meta = {"scenario": v.scenario.name, "schedulers": v.specs, "scale": v.scale, "seed": v.seed,
            "steps": v.steps, "engines": v.engines, "limits": v.limits,
            "calibration_from": v.calibration_from, "held_out": v.held_out, "checks": v.checks,
            "rounds": len(by_round), "timings": v.timings, "live": live_notes(v),
            "runner_overhead_per_request_s": {o.label: o.overhead_per_request_s for o in v.live if o.round == 0},
            "live_wall_s": {f"{o.label}#{o.round}": o.wall_s for o in v.live}}
    rep = report_dict(rows, meta, v.fit.to_dict(), pooled(by_round))
    out.mkdir(parents=True, exist_ok=True)
    figs: list[Path] = []
    if figures:
        figs = write_figures(rows, out)
        from aprilsim.report.timeline import write_timeline

        for o in (o for o in v.live if o.round == 0):
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
@click.option("--vocab-size", type=click.IntRange(min=17), help="Vocabulary of remote engines (default: what the server states, else probed).")
@click.option("--repeats", type=click.IntRange(min=1), default=1, show_default=True, help="Interleaved rounds of every scheduler (A B A B ...), same seed: the noise floor and paired gain intervals; without --calibration one more round runs first, for the fit alone.")
@click.option("--cross-fit", is_flag=True, help="With --repeats R >= 2 and no --calibration: judge every round with the cost fitted on the other R - 1 rounds (leave one round out) instead of one extra round for the fit; averages the machine's drift from round to round into every fit.")
@click.option("--max-running", type=click.IntRange(min=1), help="Concurrency of engines that do not report it (vLLM without dev mode; default 64, or what `calibrate` probed).")
@click.option("--no-figures", is_flag=True, help="Write report.md and report.json only.")
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path), help="Directory for report.md, report.json and the figures.")
def validate_command(scenario, schedulers, local, engines, router, calibration, steps, warmup, seed, scale,
                     vocab_size, repeats, cross_fit, max_running, no_figures, out) -> None:
    """Run SCENARIO's schedulers live (replay) and in simulation with a calibrated cost; report
    predicted vs measured rollout time, throughput, step time, off-policy share, wasted tokens and
    the gain over sync, with the targets (10 % per-step error, 3 pp gain, ranking) and, with
    --repeats, the noise floor beside every error."""
    from aprilsim.cli_errors import fail
    from aprilsim.config import ScenarioError, load_scenario, with_overrides
    from aprilsim.policies.base import SchedulerError
    from aprilsim.validate.scaled import make_policy
    from real.runner.options import local_scale

    try:
        target = EngineTarget.from_flags(local=local, engines=engines, router=router,
                                         vocab_size=vocab_size)
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
    if cross_fit and (repeats < 2 or calibration):
        fail("--cross-fit needs --repeats >= 2 and no --calibration (the cost is fitted on the "
             "other rounds' runs)")
        return
    opts = ValidateOptions(target=target, seed=seed, steps=steps, calibration=calibration,
                           repeats=repeats, max_running=max_running, cross_fit=cross_fit,
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
    noise = t["step_rollout_error"].get("noise_floor", {})
    for label, nf in noise.items():
        if nf is not None:
            click.echo(f"{label:>18}: noise floor {100 * nf:.1f}% (the same steps over {rep['meta']['rounds']} rounds)")
    for label, g in t["gain_vs_sync_pp"]["by_scheduler"].items():
        hw = g.get("diff_pp_half_width")
        click.echo(f"{label:>18}: gain over sync {100 * g['predicted']:+.1f}% predicted, "
                   f"{100 * g['measured']:+.1f}% measured ({g['diff_pp']:+.1f}"
                   + ("" if hw is None else f" +- {hw:.1f}") + " pp)")
    flags = [t[k]["met"] for k in ("step_rollout_error", "gain_vs_sync_pp", "ranking")]
    verdict = "missed" if False in flags else ("met" if all(flags) else "not all measured")

    def fig(x, unit):
        return "n/a" if x is None else (f"{100 * x:.1f}%" if unit == "%" else f"{x:.1f} pp")
    rk = t["ranking"]["met"]
    click.echo(f"targets {verdict}: step error {fig(t['step_rollout_error']['worst'], '%')} "
               f"(<= {100 * t['step_rollout_error']['bound']:.0f}%), gain "
               f"{fig(t['gain_vs_sync_pp']['worst'], 'pp')} (<= 3), ranking "
               f"{'n/a' if rk is None else ('preserved' if rk else 'NOT preserved')}")
    sys.stdout.flush()


__all__ = ["LiveOutcome", "ValidateOptions", "Validation", "comparisons", "engine_rules", "run_live",
           "validate", "validate_command", "write_all"]
