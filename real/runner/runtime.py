"""The live RL loop: an asyncio driver of the rollout core (``aprilsim.rollout``) on live engines.

The core holds the rollout's state and the scheduler, exactly as in simulation (same events, same
actions, same ledger, same records); this driver owns the wall clock, the HTTP (or in-process)
engines, the trainer stand-in, faults, the stall watchdog and the load sampler. One *pump* task
is the only caller of the core: everything that happens (a request ended, the RL loop starts a
rollout, the trainer finished, a weight sync finished) is posted to its inbox and handed to the
core in order (what arrived together is credited together), then the core drains the scheduler's
events and returns the engine commands, which the pump carries out in that order: a weight
sync's pause or abort in the pump (nothing else reaches the ledger meanwhile), an AbortAll in the
background (its landing is posted like any result, and other events are heard while it is on
its way, as in simulation). The core decides when requests may start (it holds them behind an
abort or a sync) and in which order aborts land; this driver only does the I/O. The clock is
injectable (the parity test runs this driver in virtual time: `real.runner.virtual`).

Faults that the scheduler did not ask for (an engine died, a stream was cut or timed out for good,
a 5xx after retries) keep the partial output (its ids are re-sent as prompt + partial) and the core
sends the remainder to another engine at once, transparently to the scheduler; if no engine is
left, :class:`AllEnginesDown` ends the run. Each engine event is one fault (`real.runner.faults`):
a death counts the requests it cost, those an abort was waiting for included. Between steps, dead
engines that serve again are re-admitted (`Cluster.readmit`, on the run's weights).

Colocated mode: RolloutStarted, wait for the batch with nothing in flight, train (sleep or user
callable), update weights on every engine, next step. Disaggregated: batches queue for a trainer
task; after TrainStepDone the scheduler's UpdateWeights pauses (or, with interrupt, aborts) the
engines, updates them, and resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from aprilsim.engine.router import GroupAffinity
from aprilsim.metrics.records import RunResult, StepRecord
from aprilsim.metrics.trace import EngineSample, PhaseSpan, RequestSpan, Trace
from aprilsim.policies.base import BY_GROUP, MOST_ROOM, Scheduler, SchedulerError
from aprilsim.rollout.core import MAX_FAULT_RESUBMITS, RolloutCore, effective_cap
from aprilsim.rollout.ports import (
    Abort,
    BatchReady,
    Command,
    Meter,
    Placement,
    SyncWeights,
    ToolCall,
)
from aprilsim.types import Group, Sample, SampleStatus
from real.protocol import GenerateRequest, GenerateResult

from .cluster import AllEnginesDown, Cluster, Fault, Slot
from .faults import FaultLog
from .records import LiveMeter, peak_tokens_per_s
from .source import LiveSource
from .trainer import TrainerStandIn

_PARTIAL = SampleStatus.PARTIAL


@dataclass(eq=False)
class _Flight:
    """One request in flight: the sample it generates, where, and under what cap."""

    rid: int
    sample: Sample
    slot: Slot
    task: asyncio.Task
    cap: int | None
    span: RequestSpan | None
    submitted: float


@dataclass(frozen=True, slots=True)
class _Ended:
    """A request that came back, as the core reads it (rid, tokens, reason, and when it ended
    on the run's clock: a request that finished while an abort landed finished then), and when
    its engine first scheduled it where the engine says (`Timings.scheduled`; -1: not known)."""

    rid: int
    tokens: int
    reason: str
    time: float
    started: float = -1.0


def _how(res: GenerateResult) -> str:
    return "abort" if res.aborted or res.failed else res.finish_reason.value


class LiveRuntime:
    """Run ``scheduler`` for ``steps`` training steps of ``batch_size`` groups on ``cluster``."""

    def __init__(
        self,
        *,
        source: LiveSource,
        cluster: Cluster,
        scheduler: Scheduler,
        batch_size: int,
        steps: int,
        trainer: TrainerStandIn,
        progress: Callable[[int, int], None] | None = None,
        trace: Trace | None = None,
        stall_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        meter: Meter | None = None,
    ) -> None:
        self.source, self.cluster, self.scheduler = source, cluster, scheduler
        self.steps, self.trainer = steps, trainer
        # the run's clock (seconds; a virtual one in the parity test) and the engines' figures
        self._clock = clock
        self.meter: Meter = meter if meter is not None else LiveMeter(cluster, clock)
        self.core = RolloutCore(
            scheduler=scheduler, groups=source, batch_size=batch_size, steps=steps,
            max_len=source.max_len, group_size=source.group_size, meter=self.meter, sender=self,
            expected_length=source.expected_length, reveal=self._reveal,
        )
        self.core.on_ended = self._ended_hook
        self.ctx = self.core.ctx
        self._ids: dict[int, list[int]] = {}  # sample uid -> every output id it holds
        self._flights: dict[int, _Flight] = {}
        self._closing: dict[int, _Flight] = {}  # brought back by an abort, its span still open
        self._n_sends = 0  # sends so far (one MOST_ROOM chooser per send)
        self._room: tuple[int, Callable[[GenerateRequest], Slot]] | None = None
        self._by_group = GroupAffinity()  # `Submit.route = BY_GROUP`: each group's engine
        self._aborts: dict[int, asyncio.Task] = {}  # AbortAlls on their way, by key
        self._tool_timers: dict[int, asyncio.TimerHandle] = {}  # episodes' tool calls running
        self._training = False
        self._finished = False
        self._ready: asyncio.Future | None = None
        self._synced: asyncio.Future | None = None
        self._batches: asyncio.Queue[tuple[Group, ...]] = asyncio.Queue()
        self._inbox: asyncio.Queue = asyncio.Queue()
        self._progress = progress
        self.trace = trace
        self._stall_s = stall_s
        self.notify: Callable[[str], None] | None = None  # hears engine events as they come
        self._log = FaultLog(self.now, lambda: self.ctx.step, self._say)
        self.overhead_s = 0.0  # runner time spent per request outside the engines (submit + credit)
        self.requests = 0
        self._t0 = clock()

    # ------------------------------------------------------------------ clock and state
    def now(self) -> float:
        return self._clock() - self._t0

    @property
    def clock_origin(self) -> float:
        """The ``time.monotonic()`` the run's clock (:meth:`now`, every record's times) counts
        from, to put other clocks (engines' iteration stamps) on it."""
        return self._t0

    def _say(self, line: str) -> None:
        if self.notify is not None:
            self.notify(line)

    @property
    def faults(self) -> list[Fault]:
        """The run's faults, one per engine event (a death, a burst of failed requests)."""
        return self._log.faults

    @property
    def version(self) -> int:
        return self.core.version

    @property
    def groups(self) -> dict[int, Group]:
        return self.core.groups

    @property
    def records(self) -> list[StepRecord]:
        return self.core.records

    def _reveal(self, s: Sample, how: str) -> bool:
        return self.source.reveal(s, how, self._ids.get(s.uid, []), self.ctx.step)

    # ------------------------------------------------------------------ running
    async def run(self) -> RunResult:
        """Run to the last step; the engines are left idle (everything in flight aborted)."""
        self._t0 = self._clock()
        if isinstance(self.meter, LiveMeter):
            self.meter.tokens0 = self.cluster.tokens  # engines may be shared by consecutive runs
        loop = self._colocated() if self.core.colocated else self._disaggregated()
        rl = asyncio.create_task(loop, name="rl-loop")
        pump = asyncio.create_task(self._pump(), name="pump")
        sampler = asyncio.create_task(self._sample_loads(), name="load-sampler")
        try:
            done, _ = await asyncio.wait({rl, pump}, return_when=asyncio.FIRST_COMPLETED)
            if pump in done:  # the pump only ends by an error
                rl.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await rl
                pump.result()
                raise SchedulerError("the scheduler pump ended unexpectedly")
            rl.result()
        finally:
            for t in (rl, pump, sampler):
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
        end_state = await self.final_drain()
        return RunResult(
            scheduler=self.scheduler.name, steps=self.records, n_engines=len(self.cluster),
            peak_tokens_per_s=peak_tokens_per_s(self.records), total_time_s=self.now(),
            end_state=end_state,
        )

    def _post(self, fn: Callable[[], None]) -> None:
        """Hand ``fn`` (a call into the core) to the pump."""
        self._inbox.put_nowait(("call", fn))

    async def _colocated(self) -> None:
        core = self.core
        for k in range(self.steps):
            await self._readmit(k)
            self._ready = asyncio.get_running_loop().create_future()
            self._post(lambda k=k: core.start_rollout(k, self.now()))
            groups = await self._ready
            rec = core.end_rollout(groups, self.now())
            t0 = self.now()
            self._training = True
            rec.train_time_s = await self.trainer.train(
                groups, k, rec.trained_tokens + rec.trained_prompt_tokens)
            t1 = self.now()
            await self._sync_weights(core.version + 1)
            self._training = False
            if self.trace is not None:
                self.trace.phases += [PhaseSpan("rollout", k, rec.rollout_start_s, t0),
                                      PhaseSpan("train", k, t0, t1),
                                      PhaseSpan("sync", k, t1, self.now())]
            core.colocated_synced()
            rec.step_time_s = self.now() - rec.rollout_start_s
            if self._progress is not None:
                self._progress(k + 1, self.steps)

    async def _disaggregated(self) -> None:
        core = self.core
        self._post(lambda: core.start_rollout(0, self.now()))
        last_end = 0.0
        for k in range(self.steps):
            groups = await self._batches.get()
            rec = core.train_record(k, groups)
            t0 = self.now()
            self._training = True
            rec.train_time_s = await self.trainer.train(
                groups, k, rec.trained_tokens + rec.trained_prompt_tokens)
            self._training = False
            if self.trace is not None:
                self.trace.phases.append(PhaseSpan("train", k, t0, self.now()))
            self._synced = asyncio.get_running_loop().create_future()
            self._post(lambda k=k: core.train_done(k, self.now()))
            await self._synced
            if k + 1 < self.steps:  # the rollout goes on meanwhile: back for the step it is in
                await self._readmit(self.ctx.step)
            rec.step_time_s = self.now() - last_end
            last_end = self.now()
            if self._progress is not None:
                self._progress(k + 1, self.steps)

    async def _readmit(self, step: int) -> None:
        """Between steps: say the deaths that cost no request, and bring back the dead engines
        that serve again (on the weights the others serve)."""
        self._log.sweep(self.cluster.slots)
        version = self.core.version
        for slot in await self.cluster.readmit(version, self.trainer.checkpoint):
            self._log.readmitted(slot, step, version)

    async def _sync_weights(self, version: int) -> float:
        """Update every engine to ``version``; pad to the modelled sync time. Returns seconds."""
        t0 = self._clock()
        await self.cluster.update_weights(version, self.trainer.checkpoint)
        await self.trainer.sync_pad(self._clock() - t0)
        return self._clock() - t0

    async def _sample_loads(self, every_s: float = 0.05) -> None:
        """Read the engines' own load reports (running requests, KV tokens) where they give one:
        the KV peak of each step, and the engine curves of the trace."""
        last: dict[int, tuple[int, int]] = {}
        while True:
            for slot in self.cluster.slots:
                load = slot.load()
                if load is None:
                    continue
                slot.kv_peak = max(slot.kv_peak, load[1])
                if self.trace is not None and last.get(slot.index) != load:
                    last[slot.index] = load
                    self.trace.engine_samples.append(EngineSample(slot.index, self.now(), *load))
            await asyncio.sleep(every_s)

    # ------------------------------------------------------------------ the pump
    async def _pump(self) -> None:
        """Hand inbox items to the core one at a time, then let the scheduler react."""
        while True:
            try:
                kind, payload = await asyncio.wait_for(self._inbox.get(), timeout=self._stall_s)
            except asyncio.TimeoutError:
                if not self.core.inflight and not self.core.updating and not self._training:
                    raise self.core.stalled(
                        f"live run stalled at t={self.now():.1f}s",
                        f"nothing in flight for {self._stall_s:.0f}s") from None
                continue
            # what arrived together is credited together before the scheduler reacts (as the
            # simulator credits every request an engine event ends, then drains once)
            items = [(kind, payload)]
            while not self._inbox.empty():
                items.append(self._inbox.get_nowait())
            for kind, payload in items:
                if kind == "call":
                    payload()
                elif kind == "result":
                    flight = self._flights.get(payload)
                    if flight is not None:
                        await self._on_result(flight)
            await self._drain()

    async def _drain(self) -> None:
        """Let the scheduler react and carry out the commands the core returns, in order, until
        none is left."""
        core = self.core
        cmds = core.drain(self.now())
        while cmds:
            for cmd in cmds:
                await self._carry_out(cmd)
            cmds = core.drain(self.now())

    async def _carry_out(self, cmd: Command) -> None:
        """One command of the core: run a tool call's timer, hand a batch over, abort, or
        start a weight sync."""
        if isinstance(cmd, ToolCall):
            self._start_tool(cmd)
        elif isinstance(cmd, BatchReady):
            self._batch_ready(cmd.batch)
        elif isinstance(cmd, Abort):
            self._start_abort(cmd)
        elif isinstance(cmd, SyncWeights):
            await self._start_sync(cmd)
        else:  # pragma: no cover - the core returns no other command
            raise SchedulerError(f"unknown engine command {cmd!r}")

    # ------------------------------------------------------------ episodes' tool calls
    def _start_tool(self, cmd: ToolCall) -> None:
        """A tool call: a timed wait (the tool itself is not run); its end is posted like any
        result, and the core sends the episode's next turn with the tool tokens appended (the
        source builds them into the context)."""
        handle = asyncio.get_running_loop().call_later(
            cmd.seconds, self._post, lambda rid=cmd.rid: self._tool_done(rid))
        self._tool_timers[cmd.rid] = handle

    def _tool_done(self, rid: int) -> None:
        self._tool_timers.pop(rid, None)
        self.core.tool_done(rid, self.now())  # ignored when an abort cancelled the call

    # ------------------------------------------------------------ sends (the core's sender)
    def send(self, samples: Sequence[Sample], first_rid: int, cap: int | None, version: int,
             place: Placement | None = None) -> None:
        """Start each sample's request (the core sends only when nothing holds them)."""
        self._n_sends += 1
        for j, s in enumerate(samples):
            self._start(first_rid + j, s, effective_cap(s, cap), place, self._n_sends)

    def _start(self, rid: int, s: Sample, cap: int | None, place: Placement | None = None,
               send: int = 0) -> None:
        """Send request ``rid`` of ``s`` (of send number ``send``) to the engine the router
        picks, or the one ``place`` names (raises AllEnginesDown). ``MOST_ROOM`` is the
        cluster's choice (`Cluster.most_room`: live, the fewest requests outstanding) and
        ``keep_kv`` goes to the cluster (live engines re-prefill)."""
        t0 = time.monotonic()
        req = self.source.request(s, self._ids.get(s.uid, ()), cap)
        if place is not None and place.priority:
            req = dataclasses.replace(req, priority=place.priority)
        slot = self._slot(s, place, req, send)
        if place is not None and place.keep_kv:
            work = self.cluster.generate(slot, req, keep_kv=True)
        else:
            work = self.cluster.generate(slot, req)
        task = asyncio.create_task(work)
        task.add_done_callback(lambda _t, rid=rid: self._inbox.put_nowait(("result", rid)))
        span = None
        if self.trace is not None:
            now = self.now()
            span = RequestSpan(slot.index, rid, s.uid, s.group_id, s.submit_version, now, now, 0,
                               "abort", carried=s.generated)
        self._flights[rid] = _Flight(rid, s, slot, task, cap, span, t0)
        self.requests += 1
        self.overhead_s += time.monotonic() - t0

    def _slot(self, s: Sample, place: Placement | None, req: GenerateRequest, send: int) -> Slot:
        """The slot for a request: the router's, a named live engine, or the one with the most
        room (one chooser per send, as the simulator weighs a send's requests together)."""
        route = None if place is None else place.route
        if route is None:
            return self.cluster.pick(s.group_id)
        if route == MOST_ROOM:
            if self._room is None or self._room[0] != send:
                self._room = (send, self.cluster.most_room())
            return self._room[1](req)
        if route == BY_GROUP:  # the group's engine, as the simulator's GroupAffinity picks it
            live = self.cluster.alive
            if not live:
                return self.cluster.pick(s.group_id)  # raises AllEnginesDown
            slot = live[self._by_group.pick([sl.outstanding + sl.picked for sl in live],
                                            s.group_id)]
            slot.picked += 1
            return slot
        if not isinstance(route, int) or not 0 <= route < len(self.cluster.slots):
            raise SchedulerError(f"Submit.route {route!r}: an engine index, {MOST_ROOM!r}, "
                                 f"{BY_GROUP!r} or None")
        slot = self.cluster.slots[route]
        return slot if slot.alive else self.cluster.pick(s.group_id)  # a dead one: the router's

    # ------------------------------------------------------------ engine I/O (the core's commands)
    def _start_abort(self, cmd: Abort) -> None:
        """An `Abort`: abort the requests it names in the background (the pump goes on); its
        landing is posted like any result, and the core hears it in the order asked for."""
        # their results are the abort's from now on (the pump must not take one for a fault)
        flights = [self._flights.pop(r) for r in cmd.rids if r in self._flights]
        task = asyncio.create_task(self._abort(flights), name="abort")
        self._aborts[cmd.key] = task
        task.add_done_callback(
            lambda t, key=cmd.key: self._post(lambda: self._abort_landed(key, t)))

    def _abort_landed(self, key: int, task: asyncio.Task) -> None:
        self._aborts.pop(key, None)
        ended: list[_Ended] = task.result()
        self._note_started(ended)
        self.core.abort_landed(key, ended, self.now())

    def _note_started(self, ended: Sequence[_Ended]) -> None:
        """Tell the core when the engines first scheduled these requests, where they said."""
        self.core.requests_started([(e.rid, e.started) for e in ended if e.started >= 0])

    async def _start_sync(self, cmd: SyncWeights) -> None:
        """A `SyncWeights`: pause the engines, or abort the requests it names (in the pump:
        nothing else reaches the core meanwhile); then update them in the background."""
        t0 = self.now()
        interrupt = cmd.interrupt
        if interrupt:
            flights = [self._flights.pop(r) for r in cmd.rids if r in self._flights]
            ended = await self._abort(flights)
            self._note_started(ended)
            self.core.sync_aborted(ended, self.now())
        else:
            await self.cluster.pause()
        version = self.core.version + 1

        async def sync() -> None:
            await self._sync_weights(version)
            if not interrupt:
                await self.cluster.resume()
            if self.trace is not None:
                self.trace.phases.append(PhaseSpan("sync", self.core.version, t0, self.now()))
            self._post(self._weights_synced)

        asyncio.create_task(sync(), name="weight-sync")

    def _weights_synced(self) -> None:
        self.core.weights_synced(self.now())
        if self._synced is not None and not self._synced.done():
            self._synced.set_result(None)

    def _batch_ready(self, batch: tuple[Group, ...]) -> None:
        if self.core.colocated:
            assert self._ready is not None and not self._ready.done()
            self._ready.set_result(batch)
            return
        if self.trace is not None:
            rec = self.records[-1]
            self.trace.phases.append(PhaseSpan("rollout", rec.step, rec.rollout_start_s,
                                               self.now()))
        self._batches.put_nowait(batch)

    async def _abort(self, flights: Sequence[_Flight]) -> list[_Ended]:
        """Abort the requests of ``flights`` (taken from the map already); what each brought
        back, in order; the trace keeps when it was sent and when every request came back."""
        if flights:
            t0 = self.now()
            with contextlib.suppress(Exception):
                await self.cluster.abort(list({f.slot for f in flights}))
            await asyncio.gather(*(f.task for f in flights), return_exceptions=True)
            if self.trace is not None:
                step = self.records[-1].step if self.records else 0
                self.trace.phases.append(PhaseSpan("abort", step, t0, self.now()))
        ended: list[_Ended] = []
        for f in flights:
            ended.append(self._brought_back(f))
            self._closing[f.rid] = f
        return ended

    def _brought_back(self, flight: _Flight) -> _Ended:
        """What an abort brought back; a request that failed instead, its engine dead meanwhile
        (hung while the abort waited on it), counts on that engine's death."""
        res: GenerateResult = flight.task.result()
        if res.failed and not flight.slot.alive:
            why = flight.slot.hung or res.error or "failed"
            self._log.died(flight.slot, f"{why} (while an abort waited on it)")
        return self._took(flight, res)

    # ------------------------------------------------------------------ results
    def _took(self, flight: _Flight, res: GenerateResult, how: str | None = None) -> _Ended:
        """Keep a result's ids with its sample; the request as the core reads it."""
        n = len(res.output_ids)
        if n:
            self._ids.setdefault(flight.sample.uid, []).extend(res.output_ids)
        if flight.span is not None:
            flight.span.end_s, flight.span.tokens = self.now(), n
            if res.timings.first_token is not None:
                flight.span.first_token_s = res.timings.first_token - self._t0
            if res.timings.accepted is not None:
                flight.span.accepted_s = res.timings.accepted - self._t0
        end, started = res.timings.finished, res.timings.scheduled
        return _Ended(flight.rid, n, how or _how(res),
                      self.now() if end is None else end - self._t0,
                      -1.0 if started is None else started - self._t0)

    def _ended_hook(self, c: _Ended, s: Sample) -> None:
        """The core credited a request that an abort or a sync brought back: close its span."""
        f = self._closing.pop(c.rid, None)
        if f is not None:
            self._close_span(f, c.reason, s)

    def _close_span(self, flight: _Flight, how: str, s: Sample) -> None:
        sp = flight.span
        if sp is None or self.trace is None:
            return
        sp.reason = "capped" if how != "abort" and how != "failed" and s.status is _PARTIAL \
            else how  # type: ignore[assignment]
        self.trace.requests.append(sp)

    async def _on_result(self, flight: _Flight) -> None:
        """A request ended on its own (not by our abort): the core credits it and raises events."""
        t0 = time.monotonic()
        self._flights.pop(flight.rid)
        res: GenerateResult = flight.task.result()
        if res.failed or (res.aborted and not self._finished):
            await self._fault(flight, res)
        else:
            e = self._took(flight, res)
            if e.started >= 0:
                self.core.requests_started(((e.rid, e.started),))
            s = self.core.request_ended(e.rid, e.tokens, e.reason, self.now())  # its finish time
            self._close_span(flight, e.reason, s)
        self.overhead_s += time.monotonic() - t0

    async def _fault(self, flight: _Flight, res: GenerateResult) -> None:
        """A request failed without being asked to: keep its partial output, send the rest again."""
        slot = flight.slot
        e = self._took(flight, res, "failed")
        if flight.span is not None and self.trace is not None:
            flight.span.reason = "failed"
            self.trace.requests.append(flight.span)
        alive = await self.cluster.check(slot)
        why = res.error or res.abort_message or "aborted by the engine"
        if alive:
            self._log.failed(slot, why)
        else:
            self._log.died(slot, slot.hung or why)
        if e.started >= 0:
            self.core.requests_started(((e.rid, e.started),))
        self.core.request_failed(e.rid, e.tokens, why, self.now())

    # ------------------------------------------------------------------ end of run
    async def final_drain(self) -> dict[str, int]:
        """Abort what is still in flight everywhere; count where every sample is (the ledger)."""
        self._finished = True
        core = self.core
        core.finish()
        for handle in self._tool_timers.values():  # tool calls still running: stopped
            handle.cancel()
        self._tool_timers = {}
        for task in self._aborts.values():  # an AbortAll on its way: what it brought back is final
            with contextlib.suppress(Exception):
                for e in await task:
                    s = core.final_ended(e.rid, e.tokens, e.reason)
                    f = self._closing.pop(e.rid, None)
                    if f is not None:
                        self._close_span(f, e.reason, s)
        self._aborts = {}
        flights = list(self._flights.values())
        if flights:
            with contextlib.suppress(Exception):
                await self.cluster.abort(list({f.slot for f in flights}))
            await asyncio.gather(*(f.task for f in flights), return_exceptions=True)
        for f in flights:
            if self._flights.pop(f.rid, None) is None:
                continue
            e = self._brought_back(f)
            s = core.final_ended(e.rid, e.tokens, e.reason)
            self._close_span(f, e.reason, s)
        self._log.sweep(self.cluster.slots)
        return core.end_state()  # the core stops what it held, or what no engine took


__all__ = ["MAX_FAULT_RESUBMITS", "AllEnginesDown", "LiveRuntime"]
