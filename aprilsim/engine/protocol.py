"""The simulated-engine contract: what a driver may ask of an engine, and nothing more.

Both `FastEngine` (event jumping) and `ReferenceEngine` (one iteration at a time, the oracle in
tests) implement it; the drivers of simulated engines (the simulator, `aprilsim.sim`, and the live
driver's virtual-time engines, `real.runner.virtual`) are typed against it, never read or write an
engine's internals, and share its abort rule (`abort_engine`). An engine writes no sample: what a
driver records of one (its first scheduling) the engine reports (`started`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from aprilsim.engine.cost import EngineSpec
from aprilsim.engine.parts import EngineStats
from aprilsim.engine.request import Completion, Request, RequestBuilder


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

    @property
    def started(self) -> list[Request]:
        """Each sample's first request once scheduled (`Request.sample`, `Request.started_s`):
        the driver records them (the queue wait) and clears the list."""
        ...

    def spec_at(self, now: float) -> float:
        """Speculative decoding's decode seconds less their plain cost as of `now`, counted as
        `progress_at` counts tokens (0 when off)."""
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


EngineFactory = Callable[[EngineSpec, int], SimEngine]  # (spec, engine index) -> a new engine


def abort_engine(engine: SimEngine, now: float, spec: EngineSpec) -> tuple[float, list[Completion]]:
    """The abort rule every driver of simulated engines follows (an AbortAll, an interrupting
    weight sync): an idle engine has nothing to abort; with `abort_steps` -1 everything returns
    at `now`; else, as a live engine, the step in flight and `abort_steps` more decode steps run
    first (`abort_after_steps`), from when it reaches the engine (`abort_delivery_s` after it
    is sent); the client hears of it `abort_latency_s` after sending it at the earliest. Returns
    when the abort lands and what came back."""
    if engine.is_idle():
        return now, []
    if spec.aborts_at_once:
        land, got = now, engine.abort_all(now)
    else:
        land, got = engine.abort_after_steps(now + spec.abort_delivery_s, spec.abort_steps)
    return max(land, now + spec.abort_latency_s), got


def request_builder(spec: EngineSpec, group_size: int | None) -> RequestBuilder:
    """The request builder for engines under `spec` (`group_size`: the workload's, which
    speculative decoding with "siblings" acceptance stamps on each request)."""
    siblings = spec.speculative is not None and spec.speculative.by_siblings
    return RequestBuilder(spec.shares_prefixes, spec.retains_prefixes,
                          (group_size or 0) if siblings else 0, spec.hashes_tokens)
