"""A live run's engine events, one :class:`Fault` each, and the lines that tell the user of them.

An engine that dies costs every request it held, and each comes back failed on its own: a
:class:`FaultLog` keeps one ``engine_died`` fault per death and counts the requests on it (also
those an abort was waiting for when the engine hung), and one ``request_failed`` fault per burst
of alike failures of a live engine in a step. A death stays open until the engine is re-admitted
(``back_at``: the step it serves again from), so the report says which steps ran without it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .cluster import Fault, Slot


@dataclass
class FaultLog:
    """The faults of one run, as engine events; ``notify`` hears of deaths and returns live."""

    now: Callable[[], float]
    step: Callable[[], int]
    notify: Callable[[str], None]
    faults: list[Fault] = field(default_factory=list)
    _open: dict[int, Fault] = field(default_factory=dict)  # slot index -> its death, while out

    def _add(self, slot: Slot, kind: str, why: str, requests: int) -> Fault:
        f = Fault(self.now(), slot.name, kind, why, requests, self.step())
        self.faults.append(f)
        slot.faults.append(f)
        return f

    def died(self, slot: Slot, why: str, requests: int = 1) -> Fault:
        """``slot`` is dead: its open death (the first of its requests opens it) counts
        ``requests`` more."""
        f = self._open.get(slot.index)
        if f is None:
            f = self._open[slot.index] = self._add(slot, "engine_died", why, 0)
            self._say(f"engine {slot.name} dropped at {f.t:.1f}s in step {f.step}: {why}")
        f.requests += requests
        return f

    def failed(self, slot: Slot, why: str) -> Fault:
        """A request failed on a live engine: counted on the same failure of this step, if any."""
        for f in reversed(slot.faults):
            if f.kind == "request_failed" and f.message == why and f.step == self.step():
                f.requests += 1
                return f
        return self._add(slot, "request_failed", why, 1)

    def sweep(self, slots: Iterable[Slot]) -> None:
        """Open a death for every dead slot that cost no request (an abort or a health check
        found it dead)."""
        for s in slots:
            if not s.alive and s.index not in self._open:
                self.died(s, s.hung or "failed a health check", 0)

    def readmitted(self, slot: Slot, step: int, version: int) -> None:
        f = self._open.pop(slot.index, None)
        if f is not None:
            f.back_at = step
        self._say(f"engine {slot.name} re-admitted for step {step}: serving again, on weights "
                  f"version {version}")

    def _say(self, line: str) -> None:
        self.notify(line)


def fault_line(f: Fault, steps: int) -> str:
    """One line for a fault of a run of ``steps`` steps: when, where, what, how many requests
    it cost, and (a death) which steps ran without the engine."""
    n = f"{f.requests} request{'s' if f.requests != 1 else ''}"
    head = f"fault at {f.t:.1f}s on {f.engine}: {f.kind} in step {f.step}, {n}"
    if f.kind != "engine_died":
        return f"{head} resubmitted ({f.message})"
    last = steps - 1
    if f.back_at is not None:
        gone = _steps(f.step + 1, f.back_at - 1)
        out = f"out for {gone}, re-admitted for step {f.back_at}" if gone \
            else f"re-admitted for step {f.back_at}"
    elif f.step >= last:
        out = "out for the rest of the last step"
    else:
        out = f"out for {_steps(f.step + 1, last)} (the rest of the run)"
    return f"{head} affected ({f.message}); {out}"


def _steps(a: int, b: int) -> str:
    return "" if b < a else (f"step {a}" if a == b else f"steps {a}-{b}")


__all__ = ["FaultLog", "fault_line"]
