"""`aprilsim fit`: fit a response-length model to a log and write it where a scenario can use it.

Errors in the input are one line on stderr and exit code 2; nothing here prints a traceback
(set APRILSIM_DEBUG=1 to see one for an unexpected error).
"""

from __future__ import annotations

import json
import math
import os
import sys

import click

from aprilsim.cli_errors import OneLineCommand
from aprilsim.workload.fitting.errors import LengthDataError
from aprilsim.workload.fitting.names import ALL_FAMILIES
from aprilsim.workload.fitting.outputs import check_outputs
from aprilsim.workload.fitting.skipped import MAX_SKIPPED, skipped_line
from aprilsim.workload.fitting.text import printable, printable_lines

EXIT_BAD_INPUT = 2


def _fail(msg: str, code: int = EXIT_BAD_INPUT) -> None:
    one_line = " ".join(str(msg).split()) if "\n" in str(msg) else str(msg)
    click.echo(f"aprilsim fit: error: {printable(one_line)}", err=True)
    sys.exit(code)


def _note(msg: str) -> None:
    click.echo(f"aprilsim fit: {printable(msg)}", err=True)


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if hasattr(x, "item"):  # numpy scalars
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _log_lines():
    """Progress lines for a log (stderr no terminal): `aprilsim.progress.PeriodicLines`."""
    from aprilsim.progress import PeriodicLines

    return PeriodicLines("aprilsim: fit")


def _status_line():
    """A one-line status on the terminal, rewritten in place (progress of long fits)."""

    def show(message: str) -> None:
        click.echo(f"\r\033[K{message}", err=True, nl=False)

    return show


def _families(value: str | None) -> tuple[str, ...]:
    if not value:
        return ALL_FAMILIES
    names = tuple(v.strip() for v in value.split(",") if v.strip())
    aliases = {"mixture2": "lognormal_mixture2", "mixture3": "lognormal_mixture3"}
    names = tuple(aliases.get(n, n) for n in names)
    unknown = [n for n in names if n not in ALL_FAMILIES]
    if unknown or not names:
        raise click.BadParameter(
            f"unknown {', '.join(unknown) or 'empty list'}; choose from {', '.join(ALL_FAMILIES)}"
        )
    return names


@click.command(
    "fit",
    cls=OneLineCommand,
    short_help="Fit length distributions to generation logs.",
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.argument("path", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--column", help="Length column (default: detected among common names).")
@click.option("--group-column", help="Prompt id column, for the prompt split ('none': off).")
@click.option("--step-column", help="Training step column, for the drift fit ('none': off).")
@click.option(
    "--max-len", type=click.IntRange(min=2), help="Cap: lengths >= it are right-censored."
)
@click.option("--no-detect-cap", is_flag=True, help="Do not look for a spike at the maximum.")
@click.option("--families", help=f"Comma-separated subset of: {', '.join(ALL_FAMILIES)}.")
@click.option("--criterion", type=click.Choice(["bic", "aic"]), default="bic", show_default=True)
@click.option(
    "--bootstrap",
    "n_bootstrap",
    type=click.IntRange(min=0),
    default=200,
    show_default=True,
    help="Resamples for the confidence intervals (0: none).",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--max-skipped",
    type=click.FloatRange(0.0, 1.0),
    default=MAX_SKIPPED,
    show_default=True,
    help="Refuse the file (exit 2) when more than this share of rows is unusable.",
)
@click.option(
    "--drift-from",
    type=click.Path(dir_okay=False),
    help="A mean-length curve (step, length per row) whose drift to add to the model.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print the results as JSON instead of a table."
)
@click.option("--out", type=click.Path(dir_okay=False), help="Write the model file (TOML).")
@click.option(
    "--plot", type=click.Path(dir_okay=False), help="Write the fit figure (e.g. fit.png)."
)
@click.option(
    "--force", is_flag=True, help="Replace an existing --out or --plot file (else refused)."
)
def fit_command(
    path: str,
    column: str | None,
    group_column: str | None,
    step_column: str | None,
    max_len: int | None,
    no_detect_cap: bool,
    families: str | None,
    criterion: str,
    n_bootstrap: int,
    seed: int,
    max_skipped: float,
    drift_from: str | None,
    as_json: bool,
    out: str | None,
    plot: str | None,
    force: bool,
) -> None:
    """Fit response-length models to a log (CSV/TSV, JSONL, Parquet, plain; .gz ok; - for stdin).

    Lengths at or above the cap (--max-len, or a spike detected at the maximum) are right-censored.
    With a prompt id column the length variance is split between and within prompts; with a step
    column (or --drift-from) the drift of the length scale over training is fitted.
    """
    try:
        from aprilsim.workload.fitting.api import fit_log

        # fail before a long fit, not after it
        fams = _families(families)
        out_path, plot_path = check_outputs(out, plot, (path, drift_from), force)
        report = fit_log(
            path,
            column=column,
            group_column=group_column,
            step_column=step_column,
            max_len=max_len,
            detect_cap=not no_detect_cap,
            families=fams,
            criterion=criterion,
            n_bootstrap=n_bootstrap,
            drift_from=drift_from,
            random_state=seed,
            progress=_status_line() if sys.stderr.isatty() else _log_lines(),
            max_skipped=max_skipped,
        )
        if sys.stderr.isatty():
            click.echo("\r\033[K", err=True, nl=False)
        skipped = skipped_line(report.data)
        if skipped:
            _note(skipped)
        for warning in report.warnings():
            _note(f"warning: {warning}")
        if as_json:
            click.echo(json.dumps(_jsonable(report.to_dict()), indent=2))
        else:
            click.echo(printable_lines(report.table()))
        written = []
        if out_path is not None:
            report.write_model(out_path)
            written.append(out_path)
        if plot_path is not None:
            written.append(report.plot(plot_path))
        if not as_json:
            for w in written:
                click.echo(printable(f"wrote {w}"))
    except LengthDataError as e:
        _fail(str(e))
    except click.BadParameter as e:
        _fail(f"--families: {e.message}")
    except OSError as e:
        _fail(f"{e.filename or path}: {e.strerror or e}")
    except RecursionError:
        _fail(f"{path}: input nested too deeply to read")
    except MemoryError:
        _fail(f"{path}: out of memory while reading or fitting")
    except Exception as e:  # never a traceback for the user; APRILSIM_DEBUG=1 shows it
        if os.environ.get("APRILSIM_DEBUG"):
            raise
        _fail(f"internal error ({type(e).__name__}: {e}); rerun with APRILSIM_DEBUG=1", 1)
