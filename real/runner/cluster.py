"""The engines a run drives: routing, liveness, and the per-engine counters the records need.

Each :class:`Slot` wraps one :class:`real.protocol.Engine` (an in-process engine, one server, or
a router standing for the servers behind it) and counts, from the runner's side, the tokens its
results carried and the time it had at least one request outstanding (its busy time). Routing uses
the
simulator's routers (``aprilsim.engine.router``: the scenario's ``cluster.router``, round robin by
default) over the live slots, with each slot's outstanding requests as its load. A slot whose
engine failed a request and then a health check is marked dead and gets no more work.

A hung engine (a stopped process, a wedged scheduler behind an open socket) fails nothing: its
streams just go silent. So each slot has a *progress deadline*: when it holds requests and no
token came from any of its streams for ``progress_deadline_s`` (default
:data:`DEFAULT_PROGRESS_DEADLINE_S`), the cluster health-checks it; an engine that does not
answer healthy within ``health_timeout_s`` is marked dead, its requests come back failed with
the tokens they had streamed (the runtime resubmits them elsewhere, as for a dead engine) and
control calls waiting on it (abort, pause, weight sync) stop waiting. An engine that answers
healthy gets another deadline, but not forever: a server whose /health answers while its
scheduler is wedged streams nothing either, so after ``stalled_after`` consecutive deadlines
healthy but without a token (default :data:`DEFAULT_STALLED_AFTER`: 3 minutes at the default
deadline) it is treated as dead the same way. Deadlines while the cluster is paused for a weight
sync do not count, nor do engines that cannot stream (no ``on_progress``: silence is all they
show). :func:`check_reachable` asks every engine once before a run.

A dead slot is not gone for good (a restarted server, a SIGCONTed one): the same watchdog probes
it with back-off (:data:`READMIT_FIRST_S`, doubling up to :data:`READMIT_MAX_S`): /health, then
a one-token request. One that serves again is brought back between steps by :meth:`Cluster.readmit`
(what it held is aborted and it loads the run's weights first). While a slot holds requests and
streams nothing, ``on_note`` hears of it after ``stall_note_s`` seconds (then at twice, four
times that...) and again when tokens flow: a silence shorter than the deadline is said, not
only waited out.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from aprilsim.engine.router import RoundRobin, Router
from real.protocol import Engine, GenerateRequest, GenerateResult, WeightSync

from .options import DEFAULT_PROGRESS_DEADLINE_S, DEFAULT_STALLED_AFTER

DEFAULT_HEALTH_TIMEOUT_S = 5.0
READMIT_FIRST_S, READMIT_MAX_S = 1.0, 10.0  # a dead slot's probe back-off: first, longest
STALL_NOTE_S = 10.0  # a silent slot is noted after this (at most half the progress deadline)


class AllEnginesDown(RuntimeError):
    """No engine is left to send work to."""


class EnginesUnreachable(ValueError):
    """An engine did not answer before the run started (bad input: exit 2)."""


@dataclass
class Fault:
    """A failure the runner met and recovered from (or not)."""

    t: float
    engine: str
    kind: str  # "engine_died" | "request_failed"
    message: str
    requests: int = 1  # requests it cost (ended, resubmitted): one Fault per engine event
    step: int = -1  # the rollout step it happened in
    back_at: int | None = None  # engine_died: the step it was re-admitted for (None: never)


@dataclass(eq=False)
class Slot:
    """One engine of the cluster and what the runner measured on it."""

    engine: Engine
    name: str
    index: int
    alive: bool = True
    outstanding: int = 0
    picked: int = 0  # routed here and not started yet: a batch's router sees its earlier picks
    tokens: int = 0  # output tokens of every result it returned
    _busy: float = 0.0
    _since: float | None = None
    kv_peak: int = 0
    faults: list[Fault] = field(default_factory=list)
    last_progress: float = 0.0  # monotonic time of its last token (or of its first request)
    hung: str | None = None  # why the progress deadline declared it dead
    stalls: int = 0  # consecutive deadlines it answered /health healthy but streamed nothing
    quiet_since: float = 0.0  # monotonic time of its last token (not moved by a healthy answer)
    noted: int = 0  # silence notes said since its last token
    noted_since: float = 0.0  # the quiet_since those notes were about
    next_probe: float = 0.0  # dead: monotonic time of its next revival probe
    backoff: float = READMIT_FIRST_S
    serving_since: float | None = None  # dead, but a probe found it serving: readmit() takes it
    readmissions: int = 0
    _dead: asyncio.Event | None = None
    _dead_loop: object = None
    _probing: bool = False

    @property
    def dead(self) -> asyncio.Event:
        """Set once the slot is declared dead (one per event loop: a cluster may outlive one)."""
        loop = asyncio.get_running_loop()
        if self._dead is None or self._dead_loop is not loop:
            self._dead, self._dead_loop = asyncio.Event(), loop
            if not self.alive:
                self._dead.set()
        return self._dead

    def mark_dead(self, why: str | None = None) -> None:
        if self.alive:
            self.next_probe = time.monotonic() + self.backoff
        self.alive = False
        if why is not None and self.hung is None:
            self.hung = why
        if self._dead is not None:
            self._dead.set()

    def back_off(self) -> None:
        """A revival probe or a re-admission failed: the next probe waits twice as long."""
        self.serving_since = None
        self.backoff = min(READMIT_MAX_S, self.backoff * 2)
        self.next_probe = time.monotonic() + self.backoff

    def revive(self) -> None:
        """Back in the cluster (`Cluster.readmit`): alive, its death forgotten; a later death
        is probed after a longer first wait (an engine that keeps dying is not re-admitted
        every step)."""
        self.alive, self.hung, self._dead, self.serving_since = True, None, None, None
        self.stalls = self.picked = self.noted = 0
        self.readmissions += 1
        self.backoff = min(READMIT_MAX_S, READMIT_FIRST_S * 2 ** self.readmissions)
        self.last_progress = self.quiet_since = time.monotonic()

    def busy_time(self, now: float | None = None) -> float:
        """Seconds with at least one request outstanding (up to ``now``)."""
        if self._since is None:
            return self._busy
        return self._busy + ((time.monotonic() if now is None else now) - self._since)

    def started(self) -> None:
        if self.picked:
            self.picked -= 1
        if self.outstanding == 0:
            self._since = time.monotonic()
            self.last_progress = self.quiet_since = self._since
            self.noted = 0
        self.outstanding += 1

    def progressed(self) -> None:
        """A token arrived: the deadline and the count of healthy silences start again."""
        self.last_progress = self.quiet_since = time.monotonic()
        self.stalls = 0

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
    """The slots of a run, with routing and cluster-wide control (abort, pause, weight sync).

    ``progress_deadline_s``: seconds without a token from a slot that holds requests before it
    is health-checked (and, failing that, declared dead); None or 0 turns the deadline off.
    ``stalled_after``: consecutive deadlines answered healthy without a token before the slot is
    declared dead anyway; None or 0: a healthy engine is never declared dead. Attributes a
    caller may set: ``readmit_dead`` (default True: probe dead slots, and let :meth:`readmit`
    bring back those that serve again), ``stall_note_s`` (seconds of silence before ``on_note``
    hears of it; default :data:`STALL_NOTE_S`, at most half the deadline; None: never).
    """

    def __init__(self, engines: Sequence[Engine], names: Sequence[str] | None = None, *,
                 progress_deadline_s: float | None = DEFAULT_PROGRESS_DEADLINE_S,
                 health_timeout_s: float = DEFAULT_HEALTH_TIMEOUT_S,
                 stalled_after: int | None = DEFAULT_STALLED_AFTER) -> None:
        if not engines:
            raise ValueError("a cluster needs at least one engine")
        if progress_deadline_s is not None and progress_deadline_s < 0:
            raise ValueError("progress_deadline_s must be >= 0")
        if stalled_after is not None and stalled_after < 0:
            raise ValueError("stalled_after must be >= 0")
        names = list(names or [getattr(e, "name", f"engine-{i}") for i, e in enumerate(engines)])
        self.slots = [Slot(e, n, i) for i, (e, n) in enumerate(zip(engines, names, strict=True))]
        self.router: Router = RoundRobin()
        self.progress_deadline_s = progress_deadline_s or None
        self.health_timeout_s = health_timeout_s
        self.stalled_after = stalled_after or None
        self.readmit_dead = True
        self.stall_note_s: float | None = min(
            STALL_NOTE_S, (self.progress_deadline_s or 2 * STALL_NOTE_S) / 2)
        self.on_note: Callable[[str], None] | None = None  # silences and their end, as they come
        self._paused = False  # between pause() and resume(): silence is expected
        self._watchdog: asyncio.Task | None = None
        self._probes: set[asyncio.Task] = set()

    def __len__(self) -> int:
        return len(self.slots)

    @property
    def alive(self) -> list[Slot]:
        return [s for s in self.slots if s.alive]

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.slots)

    def pick(self, key: int | None = None) -> Slot:
        """The live slot the router chooses (loads: requests outstanding or routed there and
        not started yet; `key`: the request's group, for the group-affinity router); raises
        AllEnginesDown. The caller sends the slot its request (`generate`)."""
        live = self.alive
        if not live:
            dead = "; ".join(f"{s.name}: {s.hung or 'failed a health check'}" for s in self.slots)
            raise AllEnginesDown(f"{len(self.slots)} of {len(self.slots)} dead ({dead})"[:600])
        slot = live[self.router.pick([s.outstanding + s.picked for s in live], key)]
        slot.picked += 1  # counted at once, as the simulator counts a request it routes
        return slot

    def most_room(self) -> Callable[[GenerateRequest], Slot]:
        """The chooser for one submission's `Submit.route == MOST_ROOM` requests (one per
        submission, called once per request): live, the slot with the fewest requests
        outstanding or picked (an engine's KV is not read over HTTP), ties to the lowest index;
        raises AllEnginesDown. `real.runner.virtual.VirtualCluster` reads the simulated room."""

        def choose(request: GenerateRequest) -> Slot:
            live = self.alive
            if not live:
                return self.pick()  # raises AllEnginesDown
            slot = min(live, key=lambda sl: (sl.outstanding + sl.picked, sl.index))
            slot.picked += 1
            return slot

        return choose

    # ---- the progress deadline -------------------------------------------------------------
    def watch(self) -> None:
        """Start the watchdog (progress deadlines, silence notes, revival probes) in this loop,
        unless it runs already; every request starts it."""
        loop = asyncio.get_running_loop()
        if self._watchdog is None or self._watchdog.done() or self._watchdog.get_loop() is not loop:
            for s in self.slots:
                s._probing = False  # a probe of a finished loop will never report
            self._watchdog = loop.create_task(self._watch(), name="progress-deadline")

    async def _watch(self) -> None:
        """Every fraction of the deadline (or half a second): health-check the slots that hold
        requests and have streamed nothing for ``progress_deadline_s``, note long silences, and
        probe the dead slots whose back-off is over."""
        deadline = self.progress_deadline_s
        while True:
            await asyncio.sleep(min(1.0, (deadline or 2.0) / 4, (self.stall_note_s or 1.0) / 2))
            now = time.monotonic()
            for s in self.slots:
                if s._probing:
                    continue
                if not s.alive:
                    if self.readmit_dead and s.serving_since is None and now >= s.next_probe:
                        self._spawn(s, self._revival_probe(s))
                    continue
                self._note_silence(s, now)
                if deadline and s.outstanding and now - s.last_progress > deadline:
                    self._spawn(s, self._probe(s, now - s.last_progress))

    def _spawn(self, slot: Slot, probe: Awaitable[None]) -> None:
        """Run one probe of ``slot`` in the background (one at a time per slot)."""
        slot._probing = True
        t = asyncio.ensure_future(probe)
        self._probes.add(t)
        t.add_done_callback(self._probes.discard)

    def _note_silence(self, s: Slot, now: float) -> None:
        """Tell ``on_note`` of a live slot's silence (after stall_note_s, then 2x, 4x...) and
        of the first token after it."""
        if self.on_note is None or self.stall_note_s is None or self._paused:
            return
        if s.noted and s.quiet_since != s.noted_since:
            self.on_note(f"{s.name} streams again after {s.quiet_since - s.noted_since:.1f}s "
                         "without a token")
            s.noted = 0
        silent = now - s.quiet_since
        if s.outstanding and silent >= self.stall_note_s * 2 ** s.noted \
                and _takes_progress(s.engine):
            s.noted, s.noted_since = s.noted + 1, s.quiet_since
            deadline = self.progress_deadline_s
            check = f"; health check after {deadline:g}s without one" if deadline else ""
            self.on_note(f"waiting on {s.name}: no token for {silent:.1f}s from its "
                         f"{s.outstanding} requests{check}")

    async def _revival_probe(self, slot: Slot) -> None:
        """Ask a dead slot whether it serves again: /health, then a one-token request (a wedged
        engine answers /health); yes: `readmit` takes it at the next step, no: back off."""
        try:
            ok = False
            with contextlib.suppress(Exception):
                ok = bool(await asyncio.wait_for(slot.engine.health(), self.health_timeout_s)) \
                    and await asyncio.wait_for(_serves(slot.engine), self.health_timeout_s)
            if ok:
                slot.serving_since = time.monotonic()
            else:
                slot.back_off()
        finally:
            slot._probing = False

    async def readmit(self, version: int, path: str | None = None) -> list[Slot]:
        """Bring back the dead slots a probe found serving (call it between steps): each has
        what it still held aborted and loads weights ``version`` (``path`` first when given);
        one that fails waits for its next probe. Returns the slots brought back."""
        back = []
        for s in self.slots:
            if s.alive or s.serving_since is None:
                continue
            ok = False
            with contextlib.suppress(Exception):
                ok = await asyncio.wait_for(_rejoin(s.engine, version, path),
                                            2 * self.health_timeout_s)
            if ok:
                s.revive()
                back.append(s)
            else:
                s.back_off()
        return back

    async def _probe(self, slot: Slot, silent_s: float) -> None:
        try:
            ok = False
            with contextlib.suppress(Exception):
                ok = bool(await asyncio.wait_for(slot.engine.health(), self.health_timeout_s))
            if ok:  # busy (a long prefill, a paused engine) but alive: another deadline ...
                slot.last_progress = time.monotonic()
                if not self._paused and _takes_progress(slot.engine):
                    slot.stalls += 1
                if self.stalled_after and slot.stalls >= self.stalled_after and slot.alive:
                    # ... but not forever: healthy yet tokenless deadline after deadline is wedged
                    slot.mark_dead(
                        f"stalled: /health answered but no token came for "
                        f"{slot.last_progress - slot.quiet_since:.1f}s from its {slot.outstanding} "
                        f"requests ({slot.stalls} progress deadlines of "
                        f"{self.progress_deadline_s:g}s in a row)")
            elif slot.alive:
                slot.mark_dead(f"hung: no token for {silent_s:.1f}s from its {slot.outstanding} "
                               f"requests and /health did not answer within "
                               f"{self.health_timeout_s:g}s")
        finally:
            slot._probing = False

    async def _unless_dead(self, slot: Slot, work: Awaitable, timeout: float | None = None):
        """Await ``work`` unless ``slot`` is declared dead first (then cancel it, return None)."""
        task = asyncio.ensure_future(work)
        dead = asyncio.ensure_future(slot.dead.wait())
        try:
            done, _ = await asyncio.wait({task, dead}, timeout=timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # cancelled from outside: the work goes too
            task.cancel()
            raise
        finally:
            dead.cancel()
        if task in done:
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        if not done:
            raise asyncio.TimeoutError
        return None

    # ---- requests --------------------------------------------------------------------------
    async def generate(self, slot: Slot, request: GenerateRequest, *,
                       keep_kv: bool = False) -> GenerateResult:
        """Run ``request`` on ``slot``. ``keep_kv`` (`Submit.keep_kv`) is ignored: an HTTP
        engine cannot take a resumed sample's KV from another, so it re-prefills."""
        slot.started()
        self.watch()
        streamed: list[int] = []

        def progressed(p) -> None:
            if p.new_ids:
                slot.progressed()
            else:
                slot.last_progress = time.monotonic()
            streamed.extend(p.new_ids)

        try:
            if _takes_progress(slot.engine):
                work = slot.engine.generate(request, on_progress=progressed)
            else:
                work = slot.engine.generate(request)
            res = await self._unless_dead(slot, work)
            if res is None:  # declared dead while the request ran: keep what it streamed
                res = _failed(request, slot, f"engine {slot.hung or 'declared dead'}",
                              list(streamed))
        except Exception as exc:  # an engine must not raise, but a dead in-process one may
            res = _failed(request, slot, f"{type(exc).__name__}: {exc}", [])
        slot.ended(res)
        return res

    async def check(self, slot: Slot, timeout: float | None = None) -> bool:
        """Health-check ``slot``; mark it dead when it does not answer healthy. A slot already
        declared dead stays dead (and is not asked again)."""
        if not slot.alive:
            return False
        ok = False
        with contextlib.suppress(Exception):
            ok = bool(await self._unless_dead(slot, slot.engine.health(),
                                              timeout or self.health_timeout_s))
        if not ok:
            slot.mark_dead()
        return ok

    async def abort(self, slots: Sequence[Slot] | None = None, timeout: float = 60.0) -> None:
        """Abort everything in flight on ``slots`` (default: every live slot)."""
        targets = [s for s in (slots if slots is not None else self.slots) if s.alive]

        async def one(s: Slot) -> None:
            try:
                await self._unless_dead(s, s.engine.abort_all(), timeout)
            except Exception:  # noqa: BLE001 - a dead engine has nothing left to abort
                s.alive = s.alive and await self.check(s)

        await asyncio.gather(*(one(s) for s in targets))

    async def pause(self) -> None:
        self._paused = True
        await asyncio.gather(*(self._unless_dead(s, s.engine.pause()) for s in self.alive
                               if isinstance(s.engine, WeightSync)))

    async def resume(self) -> None:
        await asyncio.gather(*(self._unless_dead(s, s.engine.resume()) for s in self.alive
                               if isinstance(s.engine, WeightSync)))
        self._paused = False
        now = time.monotonic()
        for s in self.slots:  # the pause was no stall: every slot's silence starts again
            s.last_progress = s.quiet_since = now
            s.stalls = s.noted = 0

    async def update_weights(self, version: int, path: str | None = None) -> None:
        """Every live engine serves ``version`` (loads ``path`` first when given)."""
        await asyncio.gather(*(self._unless_dead(s, s.engine.update_weights(str(version), path))
                               for s in self.alive if isinstance(s.engine, WeightSync)))

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        for t in (self._watchdog, *self._probes):
            if t is not None and t.get_loop() is loop:
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
        self._watchdog = None
        for s in self.slots:
            with contextlib.suppress(Exception):
                await s.engine.close()

    @property
    def faults(self) -> list[Fault]:
        return sorted((f for s in self.slots for f in s.faults), key=lambda f: f.t)


def _takes_progress(engine: Engine) -> bool:
    """Whether ``engine.generate`` accepts ``on_progress`` (the protocol's; test doubles may
    not)."""
    try:
        params = inspect.signature(engine.generate).parameters
    except (TypeError, ValueError):
        return False
    return "on_progress" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


async def _serves(engine: Engine) -> bool:
    """Whether ``engine`` generates: one token of a three-token prompt, without an error."""
    res = await engine.generate(GenerateRequest((1, 2, 3), 1))
    return not res.failed


async def _rejoin(engine: Engine, version: int, path: str | None) -> bool:
    """Make a returning engine like the others: nothing left running, the run's weights."""
    await engine.abort_all()
    if isinstance(engine, WeightSync):
        await engine.update_weights(str(version), path)
    return True


def _failed(request: GenerateRequest, slot: Slot, error: str, output: list[int]) -> GenerateResult:
    from aprilsim.types import FinishReason
    from real.protocol import Timings

    now = time.monotonic()
    return GenerateResult("", request, output, FinishReason.ABORT, Timings(now, None, now),
                          error=error, worker=slot.name)


async def check_reachable(cluster: Cluster, timeout_s: float = 1.5) -> None:
    """Ask every engine's health at once before a run; EnginesUnreachable names the first that
    does not answer healthy within ``timeout_s`` (one line, so the CLI exits 2 at once)."""
    async def one(s: Slot) -> str | None:
        try:
            ok = await asyncio.wait_for(s.engine.health(), timeout_s)
        except asyncio.TimeoutError:
            return f"no answer within {timeout_s:g}s"
        except Exception as exc:  # noqa: BLE001 - any failure is the answer
            return f"{type(exc).__name__}: {exc}"
        return None if ok else "not healthy (connection refused, or /health not 200)"

    answers = await asyncio.gather(*(one(s) for s in cluster.slots))
    bad = [(s, a) for s, a in zip(cluster.slots, answers, strict=True) if a is not None]
    if bad:
        s, why = bad[0]
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise EnginesUnreachable(f"engine {s.name} is not reachable: {why}{more}")
