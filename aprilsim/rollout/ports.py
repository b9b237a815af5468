"""What the rollout core asks of its driver: engine figures in (a Meter), engine commands out.

The core has no clock and does no I/O. A driver (the simpy simulator, the asyncio live runner)
gives it two small objects: a `Meter` it reads engine figures through at step boundaries, and a
`Commands` sink it hands engine commands to. Commands are method calls, not queued objects, so
the common path (a request ends, the scheduler submits more) allocates nothing for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from aprilsim.types import Group, Sample


class Ended(Protocol):
    """A request that left its engine (the simulator's `Completion` is one)."""

    rid: int
    tokens: int  # tokens it generated in this request
    reason: str  # "stop", "length" or "abort"



@dataclass(frozen=True, slots=True)
class Reading:
    """The engines' counters at one instant (read at step boundaries only)."""

    tokens: int  # output tokens generated so far, every engine together
    busy_by_engine: list[float]  # seconds each engine has been busy so far
    retractions: int  # requests retracted so far (0 where an engine does not report it)
    kv_peak: int  # most KV tokens any engine held since the last `new_window`
    # the gain decomposition's engine time (0 where an engine does not report it)
    iterations: int = 0  # decode iterations so far, every engine together
    prefill_s: float = 0.0  # seconds of prefill batches that ended so far
    prefill_tokens: int = 0  # tokens they prefilled
    spec_s: float = 0.0  # speculative decoding: decode seconds less their plain cost so far


@dataclass(frozen=True, slots=True)
class Placement:
    """Where and in which order a submission's requests run (`Submit.priority`, `Submit.route`);
    the core hands one to `Commands.send` only when a scheduler set either."""

    priority: int = 0
    route: int | str | None = None
    keep_kv: bool = False  # simulated KV migration: a resumed piece does not re-prefill


class Meter(Protocol):
    """Engine figures, read at the time the core gives (a simulated or a run-relative clock)."""

    def read(self, now: float) -> Reading:
        """The engines' counters as of `now`."""
        ...

    def new_window(self, now: float) -> None:
        """Start a new peak-KV window (a new step)."""
        ...

    def engine_tokens(self) -> int:
        """Output tokens the engines generated for this run (the end-of-run ledger's cross-check)."""
        ...


class Commands(Protocol):
    """Engine commands the core gives its driver; the driver carries them out."""

    def send(self, samples: Sequence[Sample], first_rid: int, cap: int | None, version: int,
             place: Placement | None = None) -> None:
        """Start generating `samples` (request ids first_rid, first_rid + 1, ...) under `version`.

        `place` (None: the router decides, priority 0) gives their admission priority and route.

        `cap` (when not None) limits what each request may generate where it is below what the
        sample has left (`effective_cap`). During a weight sync `version` is the new one: the
        requests must start only once the new weights are loaded.
        """
        ...

    def abort_all(self) -> Sequence[Ended] | None:
        """Abort every request in flight: the requests that ended now, or None when the abort
        lands later (the driver then calls `RolloutCore.abort_landed`)."""
        ...

    def sync_weights(self, interrupt: bool) -> Sequence[Ended] | None:
        """Start a weight sync (interrupting: abort in-flight requests; else pause them). Returns
        the requests that ended now, or None (then `sync_aborted` brings them); the driver calls
        `RolloutCore.weights_synced` when the new weights are loaded."""
        ...

    def batch_ready(self, batch: tuple[Group, ...]) -> None:
        """A closed batch is ready for the trainer (colocated: and nothing is in flight)."""
        ...
