"""``aprilsim validate`` as a library: run the schedulers on engines, read their iterations,
calibrate, simulate the same runs, and hand both to :mod:`aprilsim.validate.report`.

Order: every scheduler first runs live (replay mode, the scenario's seeded groups at ``scale``),
in rounds (:mod:`real.validate_live`; each finished run kept in ``--out`` by
:mod:`real.validate_store`); then the cost is fitted on the live iterations (warm-up steps left
out; a held-out round, cross-fitting, or ``--calibration``); then each scheduler is simulated with
that cost, the engines' own limits and family rules (:mod:`real.validate_limits`), the same scale
and seed. The report compares decisions (:mod:`aprilsim.validate.decisions`) and times, and
leaves starved rounds (the machine check) out of every verdict. Imported by the CLI only when the
command runs (torch and aiohttp stay out of ``aprilsim``).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from dataclasses import replace as dc_replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .validate_limits import engine_rules, kv_block_size
from .validate_live import (
    CounterSampler,
    EngineSampler,
    EnginesGone,
    Interrupted,
    precheck,
    rows_for_run,
    run_live,
)
from .validate_report import live_notes, write_all
from .validate_types import (
    LiveOutcome,
    ValidateOptions,
    Validation,
    comparisons,
    computed_shares,
    fit_rows,
    steady_rows,
)

if TYPE_CHECKING:  # loaded where used: `aprilsim validate --help` stays under 0.5 s CPU
    from aprilsim.config import Scenario
    from aprilsim.validate.costfit import CostFit


def _guarded_live(sc: Scenario, specs: list[str], opts: ValidateOptions, progress):
    """:func:`run_live` under asyncio with SIGINT and SIGTERM turned into :class:`Interrupted`
    (in-flight work aborted, the finished runs kept by ``store``)."""

    async def guarded():
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, task.cancel)  # type: ignore[union-attr]
        try:
            return await run_live(sc, specs, opts, progress)
        except asyncio.CancelledError:
            raise Interrupted("interrupted") from None

    try:
        return asyncio.run(guarded())
    except KeyboardInterrupt:  # a signal before the handlers were installed
        raise Interrupted("interrupted") from None


def validate(sc: Scenario, specs: list[str], opts: ValidateOptions,
             progress=lambda *a: None, save: Path | None = None) -> Validation:
    """Check, run live, calibrate, simulate: the whole of ``aprilsim validate`` but the report.

    ``opts.repeats`` R > 1: the judged runs are R interleaved rounds; without a calibration
    file one more round runs first, for the fit alone (held out of every comparison).
    ``opts.keep``: every finished run is kept there as it finishes (and those it holds are not
    run again), and so is the fitted cost (``calibration.toml``).
    ``save``: pickle the live runs there (:func:`load_live` reads them back for :func:`judge`)."""
    t0 = time.monotonic()
    live, limits, what, checks = _guarded_live(sc, specs, opts, progress)
    t_live = time.monotonic() - t0
    if save is not None:
        import pickle

        save.write_bytes(pickle.dumps((live, limits, what, checks, t_live)))
    v = judge(sc, specs, opts, live, limits, what, checks, t_live)
    if opts.keep is not None and not opts.calibration:
        from .validate_store import write_calibration

        write_calibration(opts.keep / "calibration.toml", v.fit.effective,
                          f"aprilsim validate: {v.calibration_from}")
    return v


def load_live(path: Path) -> tuple[list[LiveOutcome], dict[str, Any], str, list[str], float]:
    """Live runs saved by ``validate(..., save=path)``: (live, limits, engines, checks, seconds)."""
    import pickle

    return pickle.loads(path.read_bytes())


def _fit(opts: ValidateOptions, logs, calib: list[LiveOutcome]) -> tuple[CostFit, str]:
    """The cost the simulation runs (fitted on ``logs``, or the calibration file's), its source."""
    from aprilsim.validate.costfit import CostFit, cost_errors, fit_iterations, load_calibration

    fit = None
    if any(logs):
        with contextlib.suppress(ValueError):
            fit = fit_iterations(logs)
    source = (f"the iteration rows of a calibration round held out of the comparison "
              f"({len(calib)} runs, warm-up steps left out)" if calib
              else "iteration rows of the live runs (warm-up steps left out; not held out)")
    if opts.calibration:
        cost = load_calibration(str(opts.calibration))
        de, pe, nd, npre = cost_errors(cost, logs) if any(logs) else (0.0, 0.0, 0, 0)
        fit = CostFit(cost=cost, wall=cost, overhead_s=0.0, decode_median_err=de,
                      prefill_median_err=pe, n_decode=nd, n_prefill=npre,
                      decode_share=fit.decode_share if fit else 0.0,
                      source=f"file {opts.calibration}, errors against the live runs' steps",
                      given=True)
        source = f"{opts.calibration} (held out: measured on its own runs)"
    if fit is None:
        raise RuntimeError("no decode iterations were logged or rebuilt from the token streams: "
                           "give --calibration FILE (from `aprilsim calibrate`)")
    return fit, source


def judge(sc: Scenario, specs: list[str], opts: ValidateOptions, live: list[LiveOutcome],
          limits: dict[str, Any], what: str, checks: list[str], t_live: float) -> Validation:
    """Fit (or load) the cost and simulate every scheduler against live runs already made: the
    offline half of :func:`validate`, so saved live runs can be judged again."""
    from aprilsim.validate.costfit import load_client_overhead
    from aprilsim.validate.scaled import matched_engine

    holdout = opts.holdout_round
    limits = dict(limits)
    facts = limits.pop("_facts", {})
    calib = [o for o in live if holdout and o.round == 0]
    judged = [o for o in live if not (holdout and o.round == 0)]
    logs = [eng for o in (calib or judged) for eng in fit_rows(o)]
    fit, source = _fit(opts, logs, calib)
    if opts.calibration:
        limits["client_overhead_s"] = load_client_overhead(str(opts.calibration))
    limits = _with_client_timing(limits, calib or judged)
    engine = matched_engine(fit.effective, **limits)
    if holdout:  # rounds counted from the first judged one (copies: ``live`` stays as run)
        judged = [dc_replace(o, round=o.round - 1) for o in judged]
    v = Validation(scenario=sc, specs=specs, scale=opts.scale, seed=opts.seed,
                   steps=opts.steps or sc.steps, engines=what, limits=limits, fit=fit,
                   live=judged, calibration_from=source, held_out=bool(calib or opts.calibration),
                   checks=checks, calibration_runs=calib, facts=facts)
    t1 = time.monotonic()
    for o in [] if opts.cross_fitted else judged:
        if o.label in v.sim:
            continue
        v.sim[o.label], v.sim_traces[o.label] = _simulate_like(sc, o, engine, opts)
    if opts.cross_fitted:
        _cross_fit(v, sc, opts, limits)
    v.timings = {"live_s": t_live, "sim_s": time.monotonic() - t1}
    return v


def _with_client_timing(limits: dict[str, Any], runs: list[LiveOutcome]) -> dict[str, Any]:
    """``limits`` with the client's timing measured on ``runs`` (the runs the cost is fitted on:
    held out of the round judged where they are): how long an abort took to land, where they
    aborted at all, and how long it took to reach the engines (where the iteration rows show
    steps after it), and when each request reached its server (`send_timing`: the overhead and
    the time per send; this replaces a calibration's overhead), where the spans record it."""
    from aprilsim.validate.abort_latency import measured_abort_delivery, measured_abort_latency
    from aprilsim.validate.send_timing import measured_send_timing

    out = dict(limits)
    lat = measured_abort_latency(o.trace for o in runs)
    if lat is not None:
        out["abort_latency_s"] = lat
    k = limits.get("abort_steps")
    got = None if k is None or k < 0 else measured_abort_delivery(
        ((o.trace, o.rows) for o in runs), int(k))
    if got:
        out["abort_delivery_s"] = got
    sent = measured_send_timing(o.trace for o in runs)
    if sent is not None:
        out["client_overhead_s"] = sent.overhead_s
        if _accept_is_arrival(limits.get("family")):
            out["client_send_s"] = sent.per_request_s
    return out


def _accept_is_arrival(family: str | None) -> bool:
    """Whether the family's servers answer once the engine can schedule the request (then the
    answers' pace is the engine's arrivals); False for an unknown family."""
    from aprilsim.engine.families import make_family

    if not family:
        return False
    try:
        return bool(getattr(make_family(family), "live_accept_is_arrival", False))
    except ValueError:  # an unknown family
        return False


def _simulate_like(sc: Scenario, o: LiveOutcome, engine, opts: ValidateOptions):
    """The simulation a live run is compared with (its scheduler, engines, steps), its trace."""
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
        others = [o for o in v.live if o.round != r]
        engine = matched_engine(fit.effective, **_with_client_timing(limits, others))
        for o in v.live:
            if o.round != r or (o.label, r) in v.round_sims:
                continue
            v.round_sims[(o.label, r)], tr = _simulate_like(sc, o, engine, opts)
            v.round_traces[(o.label, r)] = tr
            if r == rounds[0]:
                v.sim_traces[o.label] = tr
    v.fit = v.round_fits[rounds[0]]
    v.sim.update({lab: res for (lab, r), res in v.round_sims.items() if r == rounds[0]})
    v.held_out = True
    v.calibration_from = (f"cross-fitted: each of the {len(rounds)} rounds is judged with the cost "
                          f"fitted on the iteration rows of the other {len(rounds) - 1} (warm-up "
                          f"steps left out); the first round's fit is shown")


__all__ = ["CounterSampler", "EngineSampler", "EnginesGone", "Interrupted", "LiveOutcome",
           "ValidateOptions", "Validation", "comparisons", "computed_shares", "engine_rules",
           "fit_rows", "judge", "kv_block_size", "live_notes", "load_live", "precheck",
           "rows_for_run", "run_live", "steady_rows", "validate", "write_all"]
