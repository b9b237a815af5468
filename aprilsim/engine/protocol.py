"""The simulated-engine contract: what the runtime may ask of an engine, and nothing more.

Both `FastEngine` (event jumping) and `ReferenceEngine` (one iteration at a time, the oracle in
tests) implement it; the runtime (`aprilsim.sim`) is typed against it and never reads or writes an
engine's internals.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from aprilsim.engine.parts import EngineStats
from aprilsim.engine.request import Completion, Request


@runtime_checkable
class SimEngine(Protocol):
    """One simulated SGLang server. `t_event` is the time of its next event (inf when idle)."""

    t_event: float
    busy_time: float
    tokens: int
    stats: EngineStats  # counters (decode iterations, prefill seconds: the gain decomposition)

    @property
    def retractions(self) -> int:
        """Requests retracted so far (KV cache full)."""
        ...

    @property
    def load(self) -> int:
        """Requests on the engine (running, prefilling, queued): what a router balances."""
        ...

    @property
    def n_running(self) -> int:
        """Requests decoding or prefilling (the running batch; queued requests excluded)."""
        ...

    @property
    def peak_kv(self) -> int:
        """Most KV tokens held since the last `reset_peak`."""
        ...

    def room_at(self, now: float) -> int:
        """KV tokens free at `now` less the input of queued requests (routing by room)."""
        ...

    def is_idle(self) -> bool:
        """True when nothing is queued, prefilling or decoding."""
        ...

    def reset_peak(self, now: float) -> None:
        """Start a new peak-KV window at the KV held at `now` (a new step)."""
        ...

    def progress_at(self, now: float) -> tuple[int, float, int]:
        """(tokens generated, busy seconds, KV tokens held) as of `now`, counting the decode
        iterations of a span in progress that have ended by then: a step boundary that falls
        inside a span is measured exactly, the same on every engine implementation."""
        ...

    def iterations_at(self, now: float) -> int:
        """Decode iterations done as of `now`, counted as `progress_at` counts their tokens."""
        ...

    def submit(self, reqs: list[Request], now: float) -> None:
        """Queue requests arriving at `now`."""
        ...

    def advance(self) -> list[Completion]:
        """Carry out the event due at `t_event`; return the requests that finished there."""
        ...

    def abort_all(self, now: float) -> list[Completion]:
        """Stop everything at `now`: finished work completes, the rest returns partial."""
        ...

    def abort_after_steps(self, now: float, k: int) -> tuple[float, list[Completion]]:
        """Abort as a live engine does: the step in flight at `now` completes, queued requests
        leave, running ones decode `k` more steps; return when that lands and the completions."""
        ...

    def pause(self, now: float, until: float) -> list[Completion]:
        """Stop generating from `now` to `until` (a weight update); work resumes after."""
        ...

    def flush_prefix_cache(self) -> None:
        """A weight update: forget the token runs the retained prefix cache kept."""
        ...

    def block_until(self, t: float) -> None:
        """Start nothing before time `t` (an interrupting weight update flushed the engine)."""
        ...
