"""Ctrl-C and SIGTERM outside an asyncio loop's own handlers: one line and exit code 130.

`aprilsim run` installs these before it imports anything slow (`aprilsim.cli`'s group, before the
command loads), so a signal in its first seconds is not a silent death by SIGTERM (-15) or click's
`Aborted!` with exit code 1. The handlers raise :class:`Interrupted`, which click lets through
(it turns a KeyboardInterrupt into `Aborted!`); :func:`exit_130` turns it into the line
`aprilsim: error: interrupted <phase>`, where the command says which phase it is in
(:func:`set_phase`). Nothing heavy is imported here.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator

EXIT_INTERRUPTED = 130
_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_phase = ["before the run started; nothing was sent to the engines"]


class Interrupted(BaseException):
    """SIGINT or SIGTERM, raised by the handlers :func:`exit_130` installs."""


def _raise(signum: int, frame: object) -> None:
    raise Interrupted(signum)


def set_phase(what: str) -> None:
    """What the line says was going on, should a signal come now."""
    _phase[0] = what


@contextlib.contextmanager
def exit_130(phase: str | None = None) -> Iterator[None]:
    """Within: SIGINT and SIGTERM (and a KeyboardInterrupt raised already) end the command with
    one line and exit 130; the handlers found are restored after. Outside the main thread
    (signals are the main thread's), nothing is installed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if phase is not None:
        set_phase(phase)
    old = {sig: signal.getsignal(sig) for sig in _SIGNALS}
    for sig in _SIGNALS:
        signal.signal(sig, _raise)
    try:
        yield
    except (KeyboardInterrupt, Interrupted):
        print(f"aprilsim: error: interrupted {_phase[0]}", file=sys.stderr, flush=True)
        sys.exit(EXIT_INTERRUPTED)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


@contextlib.contextmanager
def handlers_kept() -> Iterator[None]:
    """Put back the SIGINT and SIGTERM handlers found on entry (``asyncio.run`` leaves the
    defaults behind: a SIGTERM while the results are written would kill silently)."""
    old = {sig: signal.getsignal(sig) for sig in _SIGNALS}
    try:
        yield
    finally:
        if threading.current_thread() is threading.main_thread():
            for sig, handler in old.items():
                if handler is not None:
                    signal.signal(sig, handler)


__all__ = ["EXIT_INTERRUPTED", "Interrupted", "exit_130", "handlers_kept", "set_phase"]
