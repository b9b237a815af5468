"""Where a command writes: never over what a user already has, unless they say `--force`.

`simulate --out`, `replay-validate --out` and `advise --out` write a folder, `tune` a scenario
file, `sweep --out` a results table with files beside it. Each claims its outputs here before any
work, so a name that is taken costs nothing and loses nothing: one line, exit 2.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path


class OutputTaken(ValueError):
    """An output path holds something the command would replace; the message is one line."""


def claim_dir(path: Path, flag: str = "--out", force: bool = False) -> Path:
    """Create folder `path`; OutputTaken when it exists and is not empty (unless `force`: its
    files are then replaced one by one, others kept), or when it is a file."""
    if path.exists() and not path.is_dir():
        raise OutputTaken(f"{flag} {path}: is a file, not a folder")
    if path.is_dir() and not force and any(path.iterdir()):
        raise OutputTaken(f"{flag} {path}: exists and is not an empty folder; choose another "
                          f"{flag}, or --force to write into it (files of the same name replaced)")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputTaken(f"{flag} {path}: cannot create it: {e.strerror}") from None
    return path


def claim_files(paths: Iterable[Path], flag: str = "--out", force: bool = False) -> None:
    """OutputTaken naming the first of `paths` that exists (unless `force`) or whose folder does
    not; nothing is written here."""
    for p in paths:
        if p.exists() and (p.is_dir() or not force):
            what = "is a folder" if p.is_dir() else "exists"
            more = "" if p.is_dir() else ", or --force to replace it"
            raise OutputTaken(f"{flag} {p}: {what}; choose another {flag}{more}")
        if not p.parent.is_dir():
            raise OutputTaken(f"{flag} {p}: folder {p.parent} does not exist")
