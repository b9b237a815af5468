"""The live RL loop: the simulator's runtime (``aprilsim.sim.runtime``) on live engines, in asyncio.

Same events, same actions, same ledger, same records; wall-clock time instead of simulated time.
One *pump* task is the only caller of ``scheduler.handle``: everything that happens (a request
ended, the RL loop starts a rollout, the trainer finished, a weight sync finished) is posted to its
inbox and handled in order, and scheduler events are queued and handled one at a time, so a
scheduler sees a consistent world exactly as in simulation. Actions that need engine I/O (abort,
weight update) are awaited inside the pump, so nothing else happens to the ledger meanwhile.

Token credit follows the simulator: a request's tokens go to its sample under the version the
sample was submitted with (``submit_version``); an aborted request's partial output stays with
the sample (its ids are kept and re-sent as prompt + partial on resume). Faults that the scheduler
did not ask for (an engine died, a stream was cut or timed out for good, a 5xx after retries)
credit the partial output the same way and resubmit the remainder to another engine at once,
transparently to the scheduler; if no engine is left, :class:`AllEnginesDown` ends the run.

Colocated mode: RolloutStarted, wait for CloseBatch and nothing in flight, train (sleep or user
callable), update weights on every engine, next step. Disaggregated: batches queue for a trainer
task; after TrainStepDone the scheduler's UpdateWeights pauses (or, with interrupt, aborts) the
engines, updates them, and resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from aprilsim.metrics.records import RunResult, StepRecord
from aprilsim.metrics.trace import EngineSample, PhaseSpan, RequestSpan, Trace
from aprilsim.policies.base import (
    AbortAll,
    Action,
    CloseBatch,
    Context,
    Discard,
    Event,
    GroupFinished,
    PauseGeneration,
    ResumeGeneration,
    RolloutStarted,
    SampleCapped,
    SampleFinished,
    SamplesReturned,
    Scheduler,
    SchedulerError,
    Submit,
    TrainStepDone,
    UpdateWeights,
    WeightsUpdated,
)
from aprilsim.types import FinishReason, Group, Sample, SampleStatus
from real.protocol import GenerateResult

from .cluster import AllEnginesDown, Cluster, Fault, Slot
from .records import StepBook
from .source import FreeSource, LiveSource
from .trainer import TrainerStandIn

_DONE, _PARTIAL, _RUNNING = SampleStatus.DONE, SampleStatus.PARTIAL, SampleStatus.RUNNING
MAX_FAULT_RESUBMITS = 8  # per sample: a request that keeps failing is a bug, not a fault


class _Sources:
    """What ``ctx.new_groups`` / ``ctx.regenerate`` reach: the source's two calls and no more."""

    __slots__ = ("_src",)

    def __init__(self, src: LiveSource) -> None:
        self._src = src

    def new_groups(self, n: int, step: int, group_size: int | None = None) -> list[Group]:
        return self._src.new_groups(n, step, group_size)

    def regenerate(self, groups: Sequence[Group], step: int, group_size: int) -> list[Group]:
        return self._src.regenerate(groups, step, group_size)


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
    ) -> None:
        if batch_size < 1 or steps < 1:
            raise ValueError("batch_size and steps must be >= 1")
        self.source, self.cluster, self.scheduler = source, cluster, scheduler
        self.batch_size, self.steps, self.trainer = batch_size, steps, trainer
        self.version = 0
        self.ctx = Context(source=_Sources(source), batch_size=batch_size, max_len=source.max_len,
                           total_steps=steps, group_size=source.group_size)
        source.bind(self._register)
        self.groups: dict[int, Group] = {}
        self._left: dict[int, int] = {}
        self._ids: dict[int, list[int]] = {}  # sample uid -> every output id it holds
        self._inflight: dict[int, _Flight] = {}
        self._next_rid = 0
        self._events: deque[Event] = deque()
        self._paused = False  # PauseGeneration: submissions are held until ResumeGeneration
        self._paused_since = 0.0
        self._paused_s = 0.0  # paused time accumulated in the current step
        self._held: list[tuple[Sample, int | None]] = []
        self._sync_held: list[tuple[Sample, int | None]] = []
        self._updating = False
        self._training = False
        self._finished = False
        self._closed: list[tuple[Group, ...]] = []
        self._n_closed = 0
        self._ready: asyncio.Future | None = None
        self._synced: asyncio.Future | None = None
        self._batches: asyncio.Queue[tuple[Group, ...]] = asyncio.Queue()
        self._inbox: asyncio.Queue = asyncio.Queue()
        self.book = StepBook(cluster, scheduler, source, self.now, ctx=self.ctx)
        self._n_partial = 0
        self._sample_events = bool(getattr(scheduler, "sample_events", True))
        self._progress = progress
        self.trace = trace
        self._stall_s = stall_s
        self._fault_resubmits: dict[int, int] = {}
        self.faults: list[Fault] = []
        self.overhead_s = 0.0  # runner time spent per request outside the engines (submit + credit)
        self.requests = 0
        self._t0 = time.monotonic()
        self._tokens0 = 0

    # ------------------------------------------------------------------ clock and groups
    def now(self) -> float:
        return time.monotonic() - self._t0

    @property
    def records(self) -> list[StepRecord]:
        return self.book.records

    def _register(self, groups: list[Group]) -> list[Group]:
        for g in groups:
            self.groups[g.gid] = g
            self._left[g.gid] = g.size
        return groups

    # ------------------------------------------------------------------ running
    async def run(self) -> RunResult:
        """Run to the last step; the engines are left idle (everything in flight aborted)."""
        self._t0 = time.monotonic()
        self._tokens0 = self.cluster.tokens  # engines may be shared by consecutive runs
        loop = self._colocated() if self.scheduler.mode == "colocated" else self._disaggregated()
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
        self._finished = True
        end_state = await self.final_drain()
        return RunResult(
            scheduler=self.scheduler.name, steps=self.book.records, n_engines=len(self.cluster),
            peak_tokens_per_s=self.book.peak_tokens_per_s(), total_time_s=self.now(),
            end_state=end_state,
        )

    async def _colocated(self) -> None:
        for k in range(self.steps):
            self.book.begin(k)
            self._ready = asyncio.get_running_loop().create_future()
            self._post_event(RolloutStarted(k, self.version))
            groups = await self._ready
            rec = self.book.close(self._n_partial, self._take_paused())
            self.book.fill_trained(rec, groups, trainer_version=self.version)
            t0 = self.now()
            self._training = True
            rec.train_time_s = await self.trainer.train(
                groups, k, rec.trained_tokens + rec.trained_prompt_tokens)
            t1 = self.now()
            await self._sync_weights(self.version + 1)
            self._training = False
            if self.trace is not None:
                self.trace.phases += [PhaseSpan("rollout", k, rec.rollout_start_s, t0),
                                      PhaseSpan("train", k, t0, t1), PhaseSpan("sync", k, t1, self.now())]
            self.version += 1
            rec.step_time_s = self.now() - rec.rollout_start_s
            if self._progress is not None:
                self._progress(k + 1, self.steps)

    async def _disaggregated(self) -> None:
        self.book.begin(0)
        self._post_event(RolloutStarted(0, self.version))
        last_end = 0.0
        for k in range(self.steps):
            groups = await self._batches.get()
            rec = self.book.records[k]  # opened when its batch closed
            self.book.fill_trained(rec, groups, trainer_version=k)
            t0 = self.now()
            self._training = True
            rec.train_time_s = await self.trainer.train(
                groups, k, rec.trained_tokens + rec.trained_prompt_tokens)
            self._training = False
            if self.trace is not None:
                self.trace.phases.append(PhaseSpan("train", k, t0, self.now()))
            self._synced = asyncio.get_running_loop().create_future()
            self._post_event(TrainStepDone(k))
            await self._synced
            rec.step_time_s = self.now() - last_end
            last_end = self.now()
            if self._progress is not None:
                self._progress(k + 1, self.steps)

    async def _sync_weights(self, version: int) -> float:
        """Update every engine to ``version``; pad to the modelled sync time. Returns seconds."""
        t0 = time.monotonic()
        await self.cluster.update_weights(version, self.trainer.checkpoint)
        await self.trainer.sync_pad(time.monotonic() - t0)
        return time.monotonic() - t0

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
    def _post_event(self, event: Event) -> None:
        self._inbox.put_nowait(("event", event))

    async def _pump(self) -> None:
        """Handle inbox items one at a time, then every scheduler event they raised."""
        while True:
            try:
                kind, payload = await asyncio.wait_for(self._inbox.get(), timeout=self._stall_s)
            except asyncio.TimeoutError:
                if not self._inflight and not self._updating and not self._training:
                    raise SchedulerError(
                        f"live run stalled at t={self.now():.1f}s: nothing in flight for "
                        f"{self._stall_s:.0f}s but the {self.scheduler.mode} loop is still waiting "
                        f"(scheduler {self.scheduler.name!r} never closed a batch or never updated "
                        "weights)") from None
                continue
            if kind == "event":
                self._events.append(payload)
            elif kind == "result":
                flight = self._inflight.get(payload)
                if flight is not None:
                    await self._on_result(flight)
            elif kind == "synced":
                self._weights_synced(payload)
            await self._drain()

    async def _drain(self) -> None:
        while self._events:
            ev = self._events.popleft()
            self.ctx.version = self.version
            self.ctx.in_flight = len(self._inflight)
            for action in self.scheduler.handle(ev, self.ctx):
                await self._apply(action)
        self._check_ready()

    async def _apply(self, action: Action) -> None:
        if isinstance(action, Submit):
            if action.max_new_tokens is not None and action.max_new_tokens < 1:
                raise SchedulerError("Submit.max_new_tokens must be >= 1")
            if self._paused:
                self._held.extend((s, action.max_new_tokens) for s in action.samples)
            else:
                self._submit(action.samples, action.max_new_tokens)
        elif isinstance(action, AbortAll):
            returned = await self._abort_inflight()
            self._events.append(SamplesReturned(tuple(returned)))
        elif isinstance(action, CloseBatch):
            self._close_batch(action.groups)
        elif isinstance(action, Discard):
            self._discard(action.samples)
        elif isinstance(action, UpdateWeights):
            await self._update_weights(action.interrupt)
        elif isinstance(action, PauseGeneration):
            if not self._paused:
                self._paused, self._paused_since = True, self.now()
        elif isinstance(action, ResumeGeneration):
            if self._paused:
                self._paused_s += self.now() - self._paused_since
            self._paused = False
            held, self._held = self._held, []
            self._submit_grouped(held)
        else:
            raise SchedulerError(f"unknown action {action!r}")

    def _submit_grouped(self, held: list[tuple[Sample, int | None]]) -> None:
        by_cap: dict[int | None, list[Sample]] = {}
        for s, cap in held:
            by_cap.setdefault(cap, []).append(s)
        for cap, samples in by_cap.items():
            self._submit(samples, cap)

    # ------------------------------------------------------------------ submissions
    def _submit(self, samples: Sequence[Sample], cap: int | None = None) -> None:
        if self._finished or not samples:
            return
        if self._updating:  # new work starts under the new weights, once they are loaded
            self._sync_held.extend((s, cap) for s in samples)
            return
        for s in samples:
            st = s.status
            if st is _PARTIAL:
                self._n_partial -= 1
            elif st is not SampleStatus.PENDING:
                raise SchedulerError(f"cannot submit sample {s.uid} in status {st.value}")
            if s.generated:
                self.book.resumed += s.generated
            s.submits += 1
            self._send(s, None if cap is None or cap >= s.max_len - s.generated else cap)

    def _send(self, s: Sample, cap: int | None) -> None:
        """Send ``s`` (status set to running, version stamped) to the least loaded live engine."""
        t0 = time.monotonic()
        slot = self.cluster.pick(s.group_id)
        s.status = _RUNNING
        s.submit_version = self.version
        req = self.source.request(s, self._ids.get(s.uid, ()), cap)
        rid = self._next_rid
        self._next_rid += 1
        task = asyncio.create_task(self.cluster.generate(slot, req))
        task.add_done_callback(lambda _t, rid=rid: self._inbox.put_nowait(("result", rid)))
        span = None
        if self.trace is not None:
            now = self.now()
            span = RequestSpan(slot.index, rid, s.uid, s.group_id, self.version, now, now, 0,
                               "abort", carried=s.generated)
        self._inflight[rid] = _Flight(rid, s, slot, task, cap, span, t0)
        self.requests += 1
        self.overhead_s += time.monotonic() - t0

    # ------------------------------------------------------------------ results
    def _credit(self, flight: _Flight, res: GenerateResult, reason: str) -> None:
        s = flight.sample
        n = len(res.output_ids)
        s.add_tokens(n, s.submit_version)
        if n:
            self._ids.setdefault(s.uid, []).extend(res.output_ids)
        if flight.span is not None and self.trace is not None:
            sp = flight.span
            sp.end_s, sp.tokens, sp.reason = self.now(), n, reason  # type: ignore[assignment]
            if res.timings.first_token is not None:
                sp.first_token_s = res.timings.first_token - self._t0
            self.trace.requests.append(sp)

    def _is_complete(self, s: Sample, res: GenerateResult) -> bool:
        if isinstance(self.source, FreeSource):
            return self.source.complete(s, res, self.ctx.step, self._ids.get(s.uid, []))
        return self.source.complete(s, res, self.ctx.step)

    async def _on_result(self, flight: _Flight) -> None:
        """A request ended on its own (not by our abort): credit it, raise the scheduler's events."""
        t0 = time.monotonic()
        self._inflight.pop(flight.rid)
        res: GenerateResult = flight.task.result()
        s = flight.sample
        if res.failed or (res.aborted and not self._finished):
            await self._fault(flight, res)
            self.overhead_s += time.monotonic() - t0
            return
        complete = self._is_complete_after(flight, res)
        if complete:
            s.status, s.complete = _DONE, True
            if self._sample_events:
                self._events.append(SampleFinished(s))
            left = self._left[s.group_id] - 1
            self._left[s.group_id] = left
            if left == 0:
                self._events.append(GroupFinished(self.groups[s.group_id]))
        else:  # used its token budget unfinished
            s.status = _PARTIAL
            self._n_partial += 1
            self._events.append(SampleCapped(s))
        self.overhead_s += time.monotonic() - t0

    def _is_complete_after(self, flight: _Flight, res: GenerateResult) -> bool:
        capped = flight.cap is not None and res.finish_reason is FinishReason.LENGTH
        self._credit(flight, res, "capped" if capped else res.finish_reason.value)
        done = self._is_complete(flight.sample, res)
        if capped and done and flight.span is not None:
            flight.span.reason = res.finish_reason.value  # type: ignore[assignment]
        return done

    async def _fault(self, flight: _Flight, res: GenerateResult) -> None:
        """A request failed without being asked to: keep its partial output, resubmit the rest."""
        s, slot = flight.sample, flight.slot
        self._credit(flight, res, "failed")
        alive = await self.cluster.check(slot)
        fault = Fault(self.now(), slot.name, "request_failed" if alive else "engine_died",
                      res.error or res.abort_message or "aborted by the engine")
        slot.faults.append(fault)
        self.faults.append(fault)
        if self._is_complete(s, res):  # the partial output was the whole response after all
            s.status, s.complete = _DONE, True
            if self._sample_events:
                self._events.append(SampleFinished(s))
            self._left[s.group_id] -= 1
            if self._left[s.group_id] == 0:
                self._events.append(GroupFinished(self.groups[s.group_id]))
            return
        n = self._fault_resubmits.get(s.uid, 0) + 1
        self._fault_resubmits[s.uid] = n
        if n > MAX_FAULT_RESUBMITS:
            raise SchedulerError(f"sample {s.uid} failed {n} times; last error: {fault.message}")
        cap = None if flight.cap is None else flight.cap - len(res.output_ids)
        if cap is not None and cap <= 0:  # its budget was spent before the failure
            s.status = _PARTIAL
            self._n_partial += 1
            self._events.append(SampleCapped(s))
            return
        s.status = _PARTIAL  # what it is if no engine is left to take it
        try:
            self._send(s, cap)
        except AllEnginesDown:
            self._n_partial += 1
            raise

    async def _abort_inflight(self) -> list[Sample]:
        """Abort every request in flight; credit each; return the samples that came back unfinished."""
        flights = list(self._inflight.values())
        if not flights:
            return []
        await self.cluster.abort(list({f.slot for f in flights}))
        await asyncio.gather(*(f.task for f in flights), return_exceptions=True)
        returned: list[Sample] = []
        for f in flights:
            if self._inflight.pop(f.rid, None) is None:
                continue
            res: GenerateResult = f.task.result()
            s = f.sample
            self._credit(f, res, "abort" if res.aborted else res.finish_reason.value)
            if not res.aborted and not res.failed and self._is_complete(s, res):
                s.status, s.complete = _DONE, True  # finished just before the abort reached it
                if self._sample_events:
                    self._events.append(SampleFinished(s))
                self._left[s.group_id] -= 1
                if self._left[s.group_id] == 0:
                    self._events.append(GroupFinished(self.groups[s.group_id]))
                continue
            s.status = _PARTIAL
            self._n_partial += 1
            returned.append(s)
        return returned

    # ------------------------------------------------------------------ batches and weights
    def _discard(self, samples: Sequence[Sample]) -> None:
        for s in samples:
            if s.status in (SampleStatus.RUNNING, SampleStatus.TRAINED, SampleStatus.DISCARDED):
                raise SchedulerError(f"cannot discard sample {s.uid} in status {s.status.value}")
            if s.status == SampleStatus.PARTIAL:
                self._n_partial -= 1
            s.status = SampleStatus.DISCARDED
            self.book.waste += s.generated
            self.book.discarded += 1

    def _close_batch(self, groups: Sequence[Group]) -> None:
        for g in groups:
            if not g.finished or any(s.status == SampleStatus.TRAINED for s in g.samples):
                raise SchedulerError(f"group {g.gid} is not finished or was trained already")
            for s in g.samples:
                s.status = SampleStatus.TRAINED
        batch = tuple(groups)
        if self._n_closed >= self.steps:
            raise SchedulerError(
                f"scheduler {self.scheduler.name!r} closed more batches than the {self.steps} "
                "steps of the run (read ctx.total_steps)")
        self._n_closed += 1
        if self.scheduler.mode == "colocated":
            self._closed.append(batch)
            return
        rec = self.book.close(self._n_partial, self._take_paused())
        if self.trace is not None:
            self.trace.phases.append(PhaseSpan("rollout", rec.step, rec.rollout_start_s, self.now()))
        nxt = rec.step + 1
        if nxt < self.steps:
            self.book.begin(nxt)
            self._events.append(RolloutStarted(nxt, self.version))
        self._batches.put_nowait(batch)

    async def _update_weights(self, interrupt: bool) -> None:
        if self.scheduler.mode == "colocated":
            raise SchedulerError("UpdateWeights in colocated mode: the runtime syncs after training")
        if self._updating:
            raise SchedulerError("UpdateWeights while a weight update is in progress")
        self._updating = True
        t0 = self.now()
        if interrupt:
            returned = await self._abort_inflight()
        else:
            returned = []
            await self.cluster.pause()
        version = self.version + 1

        async def sync() -> None:
            await self._sync_weights(version)
            if not interrupt:
                await self.cluster.resume()
            if self.trace is not None:
                self.trace.phases.append(PhaseSpan("sync", self.version, t0, self.now()))
            self._inbox.put_nowait(("synced", tuple(returned)))

        asyncio.create_task(sync(), name="weight-sync")

    def _weights_synced(self, returned: tuple[Sample, ...]) -> None:
        self.version += 1
        self._updating = False
        held, self._sync_held = self._sync_held, []
        self._submit_grouped(held)
        self._events.append(WeightsUpdated(self.version))
        if returned:
            self._events.append(SamplesReturned(returned))
        if self._synced is not None and not self._synced.done():
            self._synced.set_result(None)

    def _take_paused(self) -> float:
        """Seconds submissions were held by PauseGeneration in the step now closing."""
        now = self.now()
        paused = self._paused_s + (now - self._paused_since if self._paused else 0.0)
        self._paused_s = 0.0
        if self._paused:
            self._paused_since = now
        return paused

    def _check_ready(self) -> None:
        if self._ready is not None and not self._ready.done() and self._closed and not self._inflight:
            self._ready.set_result(self._closed.pop(0))

    # ------------------------------------------------------------------ end of run
    async def final_drain(self) -> dict[str, int]:
        """Abort what is still in flight everywhere; count where every sample is (the ledger)."""
        self._finished = True
        flights = list(self._inflight.values())
        if flights:
            with contextlib.suppress(Exception):
                await self.cluster.abort(list({f.slot for f in flights}))
            await asyncio.gather(*(f.task for f in flights), return_exceptions=True)
        for f in flights:
            if self._inflight.pop(f.rid, None) is None:
                continue
            res: GenerateResult = f.task.result()
            s = f.sample
            self._credit(f, res, "abort" if res.aborted else res.finish_reason.value)
            done = not res.aborted and not res.failed and self._is_complete(s, res)
            s.status = _DONE if done else _PARTIAL
            s.complete = done
        counts = dict.fromkeys(SampleStatus, 0)
        tokens = dict.fromkeys(SampleStatus, 0)
        for g in self.groups.values():
            for s in g.samples:
                counts[s.status] += 1
                tokens[s.status] += s.generated
        out = {f"samples_{k.value}": v for k, v in counts.items()}
        out.update({f"tokens_{k.value}": v for k, v in tokens.items()})
        out["samples_created"] = sum(counts.values())
        out["engine_tokens"] = self.cluster.tokens - self._tokens0  # this run's share
        return out


__all__ = ["AllEnginesDown", "LiveRuntime"]
