"""What the rollout core and its driver exchange: engine figures in, engine commands out.

The core has no clock and does no I/O. A driver (the simpy simulator, the asyncio live runner)
gives it a `Meter` it reads engine figures through at step boundaries and a `Sender` that starts
requests; the core returns its other commands as values (`RolloutCore.drain`). Sending is the one
direct call: it is the common path (a request ends, the scheduler submits more), so it allocates
nothing; the rare commands (`Abort`, `SyncWeights`, `BatchReady`) come back in the order the
driver must carry them out, and the core holds sends behind those still on their way. An
episode's tool calls come back as values too (`ToolCall`: a timer the driver runs), first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from aprilsim.types import Group, Sample


class Ended(Protocol):
    """A request that left its engine (the simulator's `Completion`, a driver's or the core's
    `RequestEnd`); read-only, so that frozen records qualify."""

    @property
    def rid(self) -> int: ...

    @property
    def tokens(self) -> int:
        """Tokens it generated in this request."""
        ...

    @property
    def reason(self) -> str:
        """"stop", "length" or "abort"."""
        ...

    @property
    def time(self) -> float:
        """When it ended, on the run's clock (one that finished before an abort landed: then)."""
        ...


@dataclass(frozen=True, slots=True)
class RequestEnd:
    """An `Ended` made by a driver or by the core itself (a held send an abort ended unsent)."""

    rid: int
    tokens: int
    reason: str
    time: float


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
    cache_hit_tokens: int = 0  # input tokens a prefix cache served (not computed) so far


@dataclass(frozen=True, slots=True)
class Placement:
    """Where and in which order a submission's requests run (`Submit.priority`, `Submit.route`);
    the core hands one to `Sender.send` only when a scheduler set either."""

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
        """Output tokens the engines generated for this run (the end-of-run ledger's
        cross-check)."""
        ...


class Sender(Protocol):
    """How the core starts requests: the driver's one direct command."""

    def send(self, samples: Sequence[Sample], first_rid: int, cap: int | None, version: int,
             place: Placement | None = None) -> None:
        """Start generating `samples` (request ids first_rid, first_rid + 1, ...) under `version`.

        `place` (None: the router decides, priority 0) gives their admission priority and route.
        `cap` (when not None) limits what each request may generate where it is below what the
        sample has left (`effective_cap`). The core calls it only when nothing holds sends (no
        abort on its way, no weight sync in progress): the requests may start at once.
        """
        ...


@dataclass(frozen=True, slots=True)
class Abort:
    """Abort every request in flight on the engines; report the landing with
    `RolloutCore.abort_landed(key, ended, now)` (at once, or when the engines are done).

    `rids` are the requests the driver was given and that the abort stops (in the order sent);
    those the core still held were never sent, and the core ends them itself."""

    key: int
    rids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class SyncWeights:
    """Start a weight sync: interrupting, abort the requests `rids` (as `Abort`) and report what
    came back with `RolloutCore.sync_aborted`; else pause generation for the sync. Then load
    the new weights and report `RolloutCore.weights_synced`."""

    interrupt: bool
    rids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class BatchReady:
    """A closed batch is ready for the trainer (colocated: and nothing is in flight)."""

    batch: tuple[Group, ...]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """Run an episode's tool call: wait `seconds` (no engine work), then report
    `RolloutCore.tool_done(rid, now)`. `sample` is the episode; `tokens` the tool output it
    appends to the context (a live driver synthesises their ids). A call an abort cancelled
    meanwhile is ignored when it reports (`RolloutCore.tool_live`)."""

    rid: int
    sample: Sample
    seconds: float
    tokens: int


Command = Abort | SyncWeights | BatchReady | ToolCall
