"""How every aprilsim command reports bad input (one line on stderr, exit code 2), and the
command line as typed, for the metadata commands write.

Kept apart from `aprilsim.cli` so that command modules (plots, fit, sweep, and `real/`'s run and
validate) can use it without importing the command group that imports them.

`fail` is for a command's own checks. Click's usage errors would otherwise print three lines
(usage, a "Try --help" hint, the error): commands and groups built with `OneLineCommand` /
`OneLineGroup` (`cls=OneLineGroup`) re-raise any ClickException from parsing or invoking as one
that shows a single line (`aprilsim fit: error: Invalid value for '--max-len': 0 is not in the
range x>=2.`); `--help` and a bare group call still print the full help.
"""

from __future__ import annotations

import sys
from typing import Any

import click

EXIT_USAGE = 2


def fail(message: str) -> None:
    """One line on stderr, exit code 2: never a traceback for bad input."""
    click.echo(f"aprilsim: error: {message}", err=True)
    sys.exit(EXIT_USAGE)


def command_line() -> str:
    """The command as typed (`aprilsim simulate ...`), for the JSON and --out metadata: the
    arguments the root group was given (its ``argv``, where it keeps them), else sys.argv."""
    import shlex

    root = click.get_current_context().find_root().command
    return shlex.join(["aprilsim", *getattr(root, "argv", sys.argv[1:])])


class FiniteFloatRange(click.FloatRange):
    """click's FloatRange that also refuses nan and inf (nan passes every comparison, so
    FloatRange(0, 1) took `--max-offpolicy nan` and every run met the limit)."""

    name = "finite float range"

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        import math

        rv = super().convert(value, param, ctx)
        if isinstance(rv, float) and not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return rv


class OneLineError(click.ClickException):
    """A click error shown as `<command path>: error: <message>` on one line."""

    exit_code = EXIT_USAGE

    def __init__(self, error: click.ClickException) -> None:
        super().__init__(" ".join(error.format_message().split()))
        ctx = getattr(error, "ctx", None)
        self.prog = ctx.command_path if ctx is not None else "aprilsim"

    def show(self, file: Any = None) -> None:
        click.echo(f"{self.prog}: error: {self.message}", err=True)


def _convert(error: click.ClickException) -> click.ClickException:
    if isinstance(error, OneLineError) or type(error).__name__ == "NoArgsIsHelpError":
        return error  # already one line / the full help on purpose
    return OneLineError(error)


class _OneLineMixin:
    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        try:
            return super().make_context(*args, **kwargs)  # type: ignore[misc]
        except click.ClickException as e:
            raise _convert(e) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)  # type: ignore[misc]
        except click.ClickException as e:
            raise _convert(e) from None


class OneLineCommand(_OneLineMixin, click.Command):
    """A click.Command with one-line usage errors."""


class OneLineGroup(_OneLineMixin, click.Group):
    """A click.Group with one-line usage errors, for itself and every sub-command."""
