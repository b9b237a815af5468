"""Checks of `--out` and `--plot` before a fit that may take a minute, not after it.

A path is usable when its folder exists and is writable and it is not a folder itself, and it does
not exist yet (unless `--force`: the rule of `aprilsim.outputs`, never over what a user has). The
model file and the figure must not be one file (the figure would overwrite the model), and neither
may be the input log.
"""

from __future__ import annotations

import os
from pathlib import Path

from aprilsim.workload.fitting.errors import LengthDataError


def _check_writable(path: Path, option: str, force: bool) -> None:
    if path.is_dir():
        raise LengthDataError(f"{option} {path}: is a directory")
    if path.exists() and not force:
        raise LengthDataError(f"{option} {path}: exists; choose another {option}, or --force to "
                              "replace it")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise LengthDataError(f"{option} {path}: folder {parent} does not exist")
    if path.exists() and not os.access(path, os.W_OK):
        raise LengthDataError(f"{option} {path}: not writable")
    if not path.exists() and not os.access(parent, os.W_OK | os.X_OK):
        raise LengthDataError(f"{option} {path}: folder {parent} is not writable")


def _same(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:  # pragma: no cover - e.g. a symlink loop
        return False


def check_outputs(
    out: str | None, plot: str | None, inputs: tuple[str | None, ...] = (), force: bool = False
) -> tuple[Path | None, Path | None]:
    """(model path, figure path as it will really be written), or a one-line LengthDataError
    (an existing file is refused unless ``force``)."""
    out_p = Path(out) if out else None
    plot_p = None
    if plot:
        from aprilsim.workload.fitting.plots import plot_target

        plot_p = plot_target(plot)
    for p, option in ((out_p, "--out"), (plot_p, "--plot")):
        if p is None:
            continue
        for src in inputs:
            if src and src != "-" and _same(p, Path(src)):
                raise LengthDataError(f"{option} {p}: is the input file; choose another path")
        _check_writable(p, option, force)
    if out_p is not None and plot_p is not None and _same(out_p, plot_p):
        raise LengthDataError(
            f"--out and --plot are the same file ({out_p}): the figure would overwrite the model"
        )
    return out_p, plot_p
