"""``aprilsim validate``: the command line of :mod:`real.validate`.

Exit codes: 0 done; 2 bad input (one line, before any live run); 1 an engine died (the finished
runs are kept in ``--out``); 130 SIGINT or SIGTERM (the same). ``--resume`` continues a validate
whose finished runs ``--out`` keeps.
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path
from typing import Any

import click

from aprilsim.cli_errors import OneLineCommand
from real.runner.options import EXIT_ENGINES_GONE, EXIT_INTERRUPTED, EngineTarget

LOCAL_STEPS = 4  # default steps with --local: 1 warm-up + 3 compared, a few minutes on CPU


def _summary(rep: dict[str, Any], out: Path, t0: float) -> None:
    """The lines the command prints: per scheduler, the noise floors, the gains, the verdicts."""
    t = rep["targets"]
    click.echo(f"wrote {out / 'report.md'} ({time.monotonic() - t0:.0f}s)", err=True)
    for w in rep.get("warnings", []):
        click.echo(f"warning: {w}", err=True)
    for s in rep["schedulers"]:
        e = s["errors"]
        med = e.get("step_rollout_median_abs")
        click.echo(f"{s['label']:>18}: rollout "
                   f"{s['predicted']['mean_rollout_time_s']:.3f}s predicted, "
                   f"{s['measured']['mean_rollout_time_s']:.3f}s measured; per-step error "
                   f"{'n/a' if med is None else f'{100 * med:.1f}%'} median")
    for label, nf in t["step_rollout_error"].get("noise_floor", {}).items():
        if nf is not None:
            click.echo(f"{label:>18}: noise floor {100 * nf:.1f}% (the same steps over "
                       f"{rep['meta']['rounds']} rounds)")
    for label, g in t["gain_vs_sync_pp"]["by_scheduler"].items():
        hw = g.get("diff_pp_half_width")
        click.echo(f"{label:>18}: gain over sync {100 * g['predicted']:+.1f}% predicted, "
                   f"{100 * g['measured']:+.1f}% measured ({g['diff_pp']:+.1f}"
                   + ("" if hw is None else f" +- {hw:.1f}") + " pp)")
    for label, d in (rep.get("decisions") or {}).items():
        p = d["pooled"] if d["pooled"]["compared"] else d.get("pooled_all_rounds", d["pooled"])
        if p.get("share") is not None:
            fm = p.get("first_mismatch")
            which = "" if d["pooled"]["compared"] else " (all rounds: none was judged)"
            click.echo(f"{label:>18}: decisions agree in {100 * p['share']:.0f}% of "
                       f"{p['compared']} steps{which}"
                       + ("" if fm is None else f" (first mismatch: round "
                                                f"{fm['round'] + 1} step {fm['step']})"))

    def fig(x, unit):
        return "n/a" if x is None else (f"{100 * x:.1f}%" if unit == "%" else f"{x:.1f} pp")

    def word(k):
        return t[k].get("verdict") or "n/a"
    click.echo(f"targets {rep['verdict']}: step error {fig(t['step_rollout_error']['worst'], '%')} "
               f"(<= {100 * t['step_rollout_error']['bound']:.0f}%: {word('step_rollout_error')}), "
               f"gain {fig(t['gain_vs_sync_pp']['worst'], 'pp')} "
               f"(<= 3: {word('gain_vs_sync_pp')}), "
               f"ranking {word('ranking')}; "
               f"engine time {fig(t['step_priced_error']['worst'], '%')} "
               f"({word('step_priced_error')}), priced gain {word('gain_priced_pp')}"
               + ("" if t.get("decision_agreement", {}).get("share") is None else
                  f"; decisions {fig(t['decision_agreement']['share'], '%')} "
                  f"(>= 95%: {word('decision_agreement')})"))
    sys.stdout.flush()


def _options(f: dict[str, Any]):
    """(scenario, schedulers, target, steps) from the flags ``f``; ValueError and friends on bad
    input."""
    from aprilsim.config import load_scenario, with_overrides
    from aprilsim.validate.scaled import make_policy

    target = EngineTarget.from_flags(local=f["local"], engines=f["engines"], router=f["router"],
                                     vocab_size=f["vocab_size"])
    sc = load_scenario(f["scenario"])
    steps = f["steps"]
    if steps is None and f["local"]:
        steps = min(sc.steps, LOCAL_STEPS)
    sc = with_overrides(sc, steps=steps, warmup=f["warmup"])
    specs = list(f["schedulers"]) or list(sc.compare)
    for s in specs:
        make_policy(sc, s)
    return sc, specs, target, steps


@click.command("validate", cls=OneLineCommand,
               short_help="Simulation vs live engines: calibrate, run both, report the errors.")
@click.argument("scenario", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--scheduler", "-s", "schedulers", multiple=True,
              help="Scheduler to compare (repeatable; NAME or NAME@knob=value,...: e.g. "
                   "april@ratio=1.5); default: the scenario's `compare` list.")
@click.option("--local", type=click.IntRange(min=1),
              help="Start N bundled engines in this process (CPU).")
@click.option("--engines",
              help="Comma-separated engine URLs (bundled `python -m real.serve` servers log "
                   "iterations).")
@click.option("--router", help="URL of an sglang-router in front of the engines.")
@click.option("--from-log", "from_log", metavar="RUN",
              help="Validate offline against a run's own logs instead of live engines (the same as "
                   "`aprilsim replay-validate RUN`).")
@click.option("--calibration", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A cost calibration (TOML with a [cost] table: a, b, c, p0, p1); default: "
                   "fitted on the live runs' iteration logs.")
@click.option("--steps", type=click.IntRange(min=2),
              help=f"Training steps (default: the scenario's; with --local at most {LOCAL_STEPS}, "
                   "so a CPU run takes minutes).")
@click.option("--warmup", type=click.IntRange(min=0),
              help="Steps left out of every figure (default: the scenario's).")
@click.option("--seed", type=int, help="Workload seed (overrides the scenario).")
@click.option("--scale", type=click.FloatRange(min=0, max=1, min_open=True),
              help="Multiply every length and the trainer's fixed times (default: 1; with --local, "
                   "max_response_len -> 64).")
@click.option("--vocab-size", type=click.IntRange(min=17),
              help="Vocabulary of remote engines (default: what the server states, else probed).")
@click.option("--repeats", type=click.IntRange(min=1), default=1, show_default=True,
              help="Interleaved rounds of every scheduler (A B A B ...), same seed: the noise "
                   "floor and paired gain intervals that verdicts need (one round decides nothing "
                   "beyond a point value); without --calibration one more round runs first, for "
                   "the fit alone.")
@click.option("--cross-fit", is_flag=True,
              help="With --repeats R >= 2 and no --calibration: judge every round with the cost "
                   "fitted on the other R - 1 rounds (leave one round out) instead of one extra "
                   "round for the fit; averages the machine's drift from round to round into every "
                   "fit.")
@click.option("--max-running", type=click.IntRange(min=1),
              help="Concurrency of engines that do not report it (vLLM without dev mode; default: "
                   "probed on the engine).")
@click.option("--pin", is_flag=True,
              help="Put the client on one core and the engines (in-process, or servers on this "
                   "machine) on the others.")
@click.option("--resume", is_flag=True,
              help="Continue an interrupted validate: run only what --out does not hold yet, then "
                   "report.")
@click.option("--force", is_flag=True,
              help="Write into an --out that holds files (files of the same name replaced, an "
                   "earlier validate's finished runs removed); without it (or --resume) such an "
                   "--out is refused.")
@click.option("--no-figures", is_flag=True, help="Write report.md and report.json only.")
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory for report.md, report.json, the figures, calibration.toml and runs/ "
                   "(every finished live run, kept as it finishes).")
def validate_command(scenario, schedulers, local, engines, router, from_log, calibration, steps,
                     warmup, seed, scale, vocab_size, repeats, cross_fit, max_running, pin, resume,
                     force, no_figures, out) -> None:
    """Run SCENARIO's schedulers live (replay) and in simulation with a calibrated cost; report
    predicted vs measured rollout time, throughput, step time, off-policy share, wasted tokens,
    the gain over sync and the decisions step by step, with the targets (10 % per-step error,
    3 pp gain, ranking) judged met, missed or undecided against the noise of --repeats rounds."""
    import real.validate as rv
    from aprilsim.cli_errors import fail
    from aprilsim.config import ScenarioError
    from aprilsim.policies.base import SchedulerError
    from real.runner.options import local_scale

    from .validate_store import RunStore, identity

    if from_log is not None:  # `aprilsim validate --from-log` is rewritten before it gets here
        fail("--from-log: run it as `aprilsim validate --from-log RUN ...` "
             "(or `aprilsim replay-validate RUN`)")
        return
    try:
        sc, specs, target, steps = _options(dict(
            scenario=scenario, schedulers=schedulers, local=local, engines=engines, router=router,
            steps=steps, warmup=warmup, vocab_size=vocab_size))
    except (ScenarioError, SchedulerError, ValueError, TypeError) as e:
        fail(str(e))
        return
    if cross_fit and (repeats < 2 or calibration):
        fail("--cross-fit needs --repeats >= 2 and no --calibration (the cost is fitted on the "
             "other rounds' runs)")
        return
    opts = rv.ValidateOptions(target=target, seed=seed, steps=steps, calibration=calibration,
                              repeats=repeats, max_running=max_running, cross_fit=cross_fit,
                              pin=pin, keep=out,
                              scale=scale if scale is not None else (
                                  local_scale(sc.max_response_len) if local else 1.0))
    store = RunStore(out)
    try:
        had = store.begin(identity(sc, specs, opts.live_rounds, opts), resume, force)
    except (ValueError, OSError) as e:
        fail(str(e))
        return
    if had:
        click.echo(f"resuming: {had} finished runs in {store.dir}", err=True)

    def progress(name: str, done: int, total: int) -> None:
        click.echo(f"live {name}: step {done}/{total}", err=True)

    t0 = time.monotonic()
    before = _sigterm_interrupts()
    try:
        v = rv.validate(sc, specs, opts, progress)
        _sigterm_interrupts()  # asyncio gave SIGTERM back to its default: judging is not killed
        rep = rv.write_all(v, out, figures=not no_figures)
    except (rv.Interrupted, KeyboardInterrupt):
        click.echo(f"aprilsim: interrupted: {store.kept()} (continue with --resume)", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except rv.EnginesGone as e:
        click.echo(f"aprilsim: {e}; {store.kept()} (continue with --resume once it is back)",
                   err=True)
        sys.exit(EXIT_ENGINES_GONE)
    except (ScenarioError, SchedulerError, ValueError, RuntimeError) as e:
        fail(f"{e} ({store.kept()})" if store.dir.is_dir() and any(store.dir.glob("round*.pkl"))
             else str(e))
        return
    finally:
        _restore_sigterm(before)
    _summary(rep, out, t0)


def _sigterm_interrupts() -> Any:
    """SIGTERM outside the live runs (whose loop handles it) interrupts like Ctrl-C; returns
    the handler it replaced (None where this is not the main thread)."""
    import signal

    def interrupt(*_a) -> None:
        raise KeyboardInterrupt

    with contextlib.suppress(ValueError):  # not the main thread: leave it
        return signal.signal(signal.SIGTERM, interrupt)
    return None


def _restore_sigterm(handler: Any) -> None:
    import signal

    if handler is not None:
        with contextlib.suppress(ValueError):
            signal.signal(signal.SIGTERM, handler)


__all__ = ["LOCAL_STEPS", "validate_command"]
