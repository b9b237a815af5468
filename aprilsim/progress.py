"""Progress for logs: when stderr is no terminal, a line now and then instead of a silent wait.

On a terminal the commands rewrite one status line in place; in a log (CI, `nohup`, a batch
job) that is impossible, and a long run used to print only `simulating seer ...` for minutes.
`PeriodicLines` prints a progress message at most every `period_s` seconds (default 10, or
`APRILSIM_PROGRESS_SECONDS`; 0 prints every message), with the time elapsed.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

DEFAULT_PERIOD_S = 10.0


def period_s() -> float:
    """The period of progress lines: `APRILSIM_PROGRESS_SECONDS` when set (>= 0), else 10 s."""
    raw = os.environ.get("APRILSIM_PROGRESS_SECONDS", "")
    try:
        value = float(raw)
    except ValueError:
        return DEFAULT_PERIOD_S
    return value if value >= 0 else DEFAULT_PERIOD_S


class PeriodicLines:
    """A progress callback for logs: `self(message)` prints `prefix: message (N s)` when
    `period` seconds passed since the last line (the first message waits one period too: a
    short run prints nothing extra)."""

    def __init__(self, prefix: str, period: float | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 echo: Callable[[str], None] | None = None) -> None:
        self.prefix, self.clock = prefix, clock
        self.period = period_s() if period is None else period
        self.echo = echo or (lambda line: print(line, file=sys.stderr, flush=True))
        self.start = self.last = clock()

    def __call__(self, message: str) -> None:
        now = self.clock()
        if now - self.last >= self.period:
            self.last = now
            self.echo(f"{self.prefix}: {message} ({now - self.start:.0f} s)")

    def steps(self, done: int, total: int) -> None:
        """A run's progress callback (`progress(done, total)`): `step done/total`."""
        self(f"step {done}/{total}")
