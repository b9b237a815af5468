"""`aprilsim ...`: the command line. Each sub-command lives beside the code it drives."""

from __future__ import annotations

import click

from aprilsim import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="aprilsim")
def main() -> None:
    """Simulate, compare and tune rollout schedulers (APRIL and friends) for RL on LLMs."""


def _register() -> None:
    from aprilsim.workload.fitting.cli import fit_command

    main.add_command(fit_command, "fit")


try:
    _register()
except ImportError:  # pragma: no cover - only while a sub-command is being written
    pass
