"""`aprilsim plot ...`: figures from the files the other commands write.

A click group so that each figure is one sub-command (`steps`, `gain`, `timeline`; `sweep` can
join). Rendering lives in `aprilsim.report`; this module only parses arguments and reports errors.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import click

from aprilsim.cli_errors import fail


@click.group(short_help="Figures from simulation outputs (needs matplotlib).")
def plot() -> None:
    """Figures from the files `aprilsim simulate` writes (needs matplotlib: aprilsim[plot])."""


def _write_figure(draw: Callable[[], object], out: Path) -> None:
    """Draw a figure; a missing matplotlib or a bad input file is one line (exit 2)."""
    try:
        draw()
    except ImportError:
        fail("plotting needs matplotlib: pip install 'aprilsim[plot]'")
        return
    except (ValueError, OSError) as e:
        fail(str(e))
        return
    click.echo(f"wrote {out}")


@plot.command("steps", short_help="Per-step curves of a --steps-out file, one line per scheduler.")
@click.argument("steps_file", metavar="STEPS.jsonl",
                type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("-o", "--out", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("steps.png"), show_default=True,
              help="Figure file (PNG, PDF or SVG by suffix).")
@click.option("--each-seed", is_flag=True,
              help="With several seeds (simulate --seeds N): one line per seed, not the "
                   "mean with a min-max band.")
def plot_steps_command(steps_file, out, each_seed) -> None:
    """Rollout time, throughput, buffer size and off-policy share per step, for each scheduler.

    STEPS.jsonl is what `aprilsim simulate --steps-out STEPS.jsonl` writes; runs of several seeds
    are drawn as the mean over seeds with a min-max band (or one line per seed: --each-seed).
    """
    from aprilsim.report.steps_plot import plot_steps, read_steps

    _write_figure(lambda: plot_steps(read_steps(steps_file), out, each_seed=each_seed), out)


@plot.command("gain", short_help="The gain decomposition over sync: a stacked bar per scheduler.")
@click.argument("summary_file", metavar="SUMMARY.json",
                type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("-o", "--out", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("gain.png"), show_default=True,
              help="Figure file (PNG, PDF or SVG by suffix).")
def plot_gain_command(summary_file, out) -> None:
    """Where each scheduler's rollout-throughput gain over sync comes from (idle, batch, context,
    prefill, re-prefill, speculative; docs/metrics.md), with its waste and costs.

    SUMMARY.json is what `aprilsim simulate -s sync -s ... --json` prints (or
    --out DIR/summary.json).
    """
    from aprilsim.report.gain_plot import plot_gain, read_gains

    _write_figure(lambda: plot_gain(read_gains(summary_file), out), out)


@plot.command("timeline", short_help="Per-engine request timeline of a trace (PNG or HTML).")
@click.argument("trace_file", metavar="TRACE.jsonl",
                type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("-o", "--out", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("timeline.png"), show_default=True,
              help="PNG/PDF/SVG (matplotlib) or HTML (plotly, self-contained) by suffix.")
@click.option("--engines", "engines", metavar="E1,E2,...",
              help="Draw only these engines (numbers as in the trace, e.g. 0,3).")
@click.option("--steps", "steps", metavar="LO:HI",
              help="Draw only training steps LO..HI (inclusive; one step: N).")
def plot_timeline_command(trace_file, out, engines, steps) -> None:
    """Requests per engine coloured by policy version, aborts/retractions/resumes, batch and KV
    curves, training and weight-sync bands; live traces draw queued time apart from running time.
    TRACE.jsonl is a per-request trace (aprilsim.metrics.trace)."""
    from aprilsim.metrics.trace import Trace
    from aprilsim.report.timeline import select, write_timeline

    try:
        picked = _int_list(engines, "--engines") if engines else None
        window = _step_window(steps) if steps else None
        trace, labels = select(Trace.read(trace_file), picked, window)
        write_timeline(trace, out, labels)
    except ImportError as e:
        extra = "interactive" if out.suffix.lower() in (".html", ".htm") else "plot"
        fail(f"this figure needs {e.name}: pip install 'aprilsim[{extra}]'")
        return
    except (ValueError, KeyError, TypeError, OSError) as e:
        fail(f"{trace_file}: {e}")
        return
    click.echo(f"wrote {out}")


def _int_list(text: str, flag: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} {text!r}: expected numbers separated by commas, "
                         "e.g. 0,2") from None


def _step_window(text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition(":")
    try:
        a, b = int(lo), int(hi if sep else lo)
    except ValueError:
        raise ValueError(f"--steps {text!r}: expected LO:HI (whole numbers) "
                         "or one step N") from None
    if b < a:
        raise ValueError(f"--steps {text!r}: HI is below LO")
    return a, b
