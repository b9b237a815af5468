"""The engines a run drives: routing, liveness, and the per-engine counters the records need.

Each :class:`Slot` wraps one :class:`real.protocol.Engine` (an in-process engine, one server, or
a router standing for the servers behind it) and counts, from the runner's side, the tokens its
results carried and the time it had at least one request outstanding (its busy time). Routing uses the
simulator's routers (``aprilsim.engine.router``: the scenario's ``cluster.router``, round robin by
default) over the live slots, with each slot's outstanding requests as its load. A slot whose
engine failed a request and then a health check is marked dead and gets no more work.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from aprilsim.engine.router import RoundRobin, Router
from real.protocol import Engine, GenerateRequest, GenerateResult, WeightSync


class AllEnginesDown(RuntimeError):
    """No engine is left to send work to."""


@dataclass
class Fault:
    """A failure the runner met and recovered from (or not)."""

    t: float
    engine: str
    kind: str  # "engine_died" | "request_failed"
    message: str


@dataclass(eq=False)
class Slot:
    """One engine of the cluster and what the runner measured on it."""

    engine: Engine
    name: str
    index: int
    alive: bool = True
    outstanding: int = 0
    tokens: int = 0  # output tokens of every result it returned
    _busy: float = 0.0
    _since: float | None = None
    kv_peak: int = 0
    faults: list[Fault] = field(default_factory=list)

    def busy_time(self, now: float | None = None) -> float:
        """Seconds with at least one request outstanding (up to ``now``)."""
        if self._since is None:
            return self._busy
        return self._busy + ((time.monotonic() if now is None else now) - self._since)

    def started(self) -> None:
        if self.outstanding == 0:
            self._since = time.monotonic()
        self.outstanding += 1

    def ended(self, result: GenerateResult) -> None:
        self.outstanding -= 1
        self.tokens += len(result.output_ids)
        if self.outstanding == 0 and self._since is not None:
            self._busy += time.monotonic() - self._since
            self._since = None

    def load(self) -> tuple[int, int] | None:
        """(running, KV tokens) when the engine reports it in-process, else None."""
        fn = getattr(self.engine, "load", None)
        return fn() if callable(fn) else None


class Cluster:
    """The slots of a run, with routing and cluster-wide control (abort, pause, weight sync)."""

    def __init__(self, engines: Sequence[Engine], names: Sequence[str] | None = None) -> None:
        if not engines:
            raise ValueError("a cluster needs at least one engine")
        names = list(names or [getattr(e, "name", f"engine-{i}") for i, e in enumerate(engines)])
        self.slots = [Slot(e, n, i) for i, (e, n) in enumerate(zip(engines, names, strict=True))]
        self.router: Router = RoundRobin()

    def __len__(self) -> int:
        return len(self.slots)

    @property
    def alive(self) -> list[Slot]:
        return [s for s in self.slots if s.alive]

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.slots)

    def pick(self, key: int | None = None) -> Slot:
        """The live slot the router chooses (loads: outstanding requests; `key`: the request's
        group, for the group-affinity router); raises AllEnginesDown."""
        live = self.alive
        if not live:
            raise AllEnginesDown("every engine is gone")
        return live[self.router.pick([s.outstanding for s in live], key)]

    async def generate(self, slot: Slot, request: GenerateRequest) -> GenerateResult:
        slot.started()
        try:
            res = await slot.engine.generate(request)
        except Exception as exc:  # an engine must not raise, but a dead in-process one may
            from aprilsim.types import FinishReason
            from real.protocol import Timings

            now = time.monotonic()
            res = GenerateResult("", request, [], FinishReason.ABORT, Timings(now, None, now),
                                 error=f"{type(exc).__name__}: {exc}", worker=slot.name)
        slot.ended(res)
        return res

    async def check(self, slot: Slot, timeout: float = 5.0) -> bool:
        """Health-check ``slot``; mark it dead when it does not answer healthy."""
        ok = False
        with contextlib.suppress(Exception):
            ok = bool(await asyncio.wait_for(slot.engine.health(), timeout))
        if not ok:
            slot.alive = False
        return ok

    async def abort(self, slots: Sequence[Slot] | None = None, timeout: float = 60.0) -> None:
        """Abort everything in flight on ``slots`` (default: every live slot)."""
        targets = [s for s in (slots if slots is not None else self.slots) if s.alive]

        async def one(s: Slot) -> None:
            try:
                await asyncio.wait_for(s.engine.abort_all(), timeout)
            except Exception:  # noqa: BLE001 - a dead engine has nothing left to abort
                s.alive = s.alive and await self.check(s)

        await asyncio.gather(*(one(s) for s in targets))

    async def pause(self) -> None:
        await asyncio.gather(*(s.engine.pause() for s in self.alive if isinstance(s.engine, WeightSync)))

    async def resume(self) -> None:
        await asyncio.gather(*(s.engine.resume() for s in self.alive if isinstance(s.engine, WeightSync)))

    async def update_weights(self, version: int, path: str | None = None) -> None:
        """Every live engine serves ``version`` (loads ``path`` first when given)."""
        await asyncio.gather(*(s.engine.update_weights(str(version), path)
                               for s in self.alive if isinstance(s.engine, WeightSync)))

    async def close(self) -> None:
        for s in self.slots:
            with contextlib.suppress(Exception):
                await s.engine.close()

    @property
    def faults(self) -> list[Fault]:
        return sorted((f for s in self.slots for f in s.faults), key=lambda f: f.t)
