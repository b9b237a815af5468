"""Shared by the CLI tests: `aprilsim ARGS` run in this process through click's runner.

A subprocess per call costs an interpreter start and the imports (torch's alone is seconds on a
loaded machine); tests keep one only where the process is the point: the entry point, exit codes
set by signals, start-up time, pipes.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Result:
    """What a command printed and returned (the fields of subprocess.CompletedProcess used here)."""

    returncode: int
    stdout: str
    stderr: str


def aprilsim(*args: object, cwd: str | Path | None = None, input: str | None = None) -> Result:
    """Run `aprilsim ARGS` in this process (click's runner: no interpreter start per call); an
    exception the command did not turn into an exit code is raised here, with its traceback."""
    from click.testing import CliRunner

    from aprilsim.cli import main

    with contextlib.chdir(cwd or os.getcwd()):
        r = CliRunner().invoke(main, [str(a) for a in args], input=input)
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return Result(r.exit_code, r.stdout, r.stderr)
