"""How every aprilsim command reports bad input: one line on stderr, exit code 2.

Kept apart from `aprilsim.cli` so that command modules (plots, fit, sweep, run) can use it without
importing the command group that imports them.
"""

from __future__ import annotations

import sys

import click

EXIT_USAGE = 2


def fail(message: str) -> None:
    """One line on stderr, exit code 2: never a traceback for bad input."""
    click.echo(f"aprilsim: error: {message}", err=True)
    sys.exit(EXIT_USAGE)
