"""The simulated RL loop: a simpy runtime that feeds a scheduler events and carries out its actions.

Engines are plain objects that know their next event time. One simpy process (`_engine_loop`)
owns them: it pops the earliest engine event from a heap and handles it at once, yielding to simpy
only when another simpy event (the trainer, a weight sync) is due first. So simpy orders the RL
loop while engine events cost no simpy scheduling; `self.now` is the simulated clock (simpy's
`env.now` can lag behind it inside the loop, so every timeout is set at an absolute time via
`_at`). Scheduler events are queued and handled one at a time (no re-entrancy), so a scheduler
always sees a consistent world.

Colocated mode (slime --colocate): rollout, then training, then weight sync; engines are idle
while the trainer runs. Disaggregated mode: the trainer runs on its own GPUs; batches queue up for
it, and weights are synced when the scheduler says so (`UpdateWeights`).
"""

from __future__ import annotations

import gc
import heapq
import math
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial

import simpy

from aprilsim.engine.cost import EngineSpec
from aprilsim.engine.fast import FastEngine
from aprilsim.engine.protocol import SimEngine
from aprilsim.engine.request import Completion, Request
from aprilsim.engine.router import Router, make_router
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
from aprilsim.sim.ledger import StepLedger
from aprilsim.trainer import TrainerModel
from aprilsim.types import Group, Sample, SampleStatus
from aprilsim.workload.generator import Workload

INF = math.inf
_DONE, _PARTIAL = SampleStatus.DONE, SampleStatus.PARTIAL
EngineFactory = Callable[[EngineSpec, int], SimEngine]


__all__ = ["EngineFactory", "SchedulerError", "Simulation", "WorkloadSource"]


@contextmanager
def _no_full_gc() -> Iterator[None]:
    """Hold off Python's full (oldest-generation) garbage collections for a run.

    A run allocates hundreds of thousands of long-lived, acyclic objects (samples, segments,
    requests, groups). The collector's full collections re-traverse that growing heap several
    times per run: about half of the CPU time of the cluster benchmark. Young collections go on
    (they collect the few cycles a run makes, simpy conditions), and a finished Simulation holds no
    cycle, so reference counting frees it; the previous thresholds come back after the run.
    """
    thresholds = gc.get_threshold()
    gc.set_threshold(thresholds[0], thresholds[1], 2**30)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


class WorkloadSource:
    """What a scheduler's `ctx.new_groups` / `ctx.regenerate` reach in simulation, and no more.

    Schedulers see this narrow source, not the Simulation: the live runner offers the same two
    calls over a dataset, so a scheduler that runs here runs there unchanged. It holds the
    Simulation weakly, so a finished Simulation is freed by reference counting (no cycle).
    """

    __slots__ = ("_sim",)

    def __init__(self, sim: Simulation) -> None:
        self._sim = weakref.ref(sim)

    def new_groups(self, n: int, step: int, group_size: int | None = None) -> list[Group]:
        sim = self._sim()
        assert sim is not None, "the simulation is gone"
        return sim._register(sim.workload.generate(n, step, group_size))

    def regenerate(self, groups: Sequence[Group], step: int, group_size: int) -> list[Group]:
        sim = self._sim()
        assert sim is not None, "the simulation is gone"
        return sim._register(sim.workload.regenerate(list(groups), step, group_size))


class Simulation:
    """Run `scheduler` for `steps` training steps of `batch_size` groups on `n_engines` engines."""

    def __init__(
        self,
        *,
        workload: Workload,
        engine: EngineSpec,
        n_engines: int,
        scheduler: Scheduler,
        batch_size: int,
        steps: int,
        trainer: TrainerModel | None = None,
        router: str | Router = "round_robin",
        engine_factory: EngineFactory = FastEngine,
        progress: Callable[[int, int], None] | None = None,
        trace: Trace | None = None,
    ) -> None:
        if n_engines < 1 or batch_size < 1 or steps < 1:
            raise ValueError("n_engines, batch_size and steps must be >= 1")
        self.workload = workload
        self.spec = engine
        self.scheduler = scheduler
        self.batch_size = batch_size
        self.steps = steps
        self.trainer = trainer or TrainerModel()
        self.router = make_router(router) if isinstance(router, str) else router
        self.env = simpy.Environment()
        self.engines = [engine_factory(engine, i) for i in range(n_engines)]
        self.now = 0.0
        self.version = 0
        self.ctx = Context(
            source=WorkloadSource(self), batch_size=batch_size, max_len=workload.max_len, total_steps=steps,
            group_size=workload.group_size,
        )
        self.groups: dict[int, Group] = {}
        self._left: dict[int, int] = {}  # unfinished samples per group
        self._inflight: dict[int, Sample] = {}  # request id -> the sample it generates
        self._next_rid = 0
        self._events: deque[Event] = deque()
        self._draining = False
        self._dirty: set[int] = set()
        self._armed = [INF] * n_engines  # t_event each engine has in the heap
        self._heap: list[tuple[float, int]] = []  # (t_event, engine index), lazily invalidated
        self._wake: simpy.Event | None = None
        self._paused = False  # PauseGeneration: submissions are held until ResumeGeneration
        self._held: list[tuple[Sample, int | None]] = []
        self._closed: list[tuple[Group, ...]] = []
        self._ready: simpy.Event | None = None
        self._batches = simpy.Store(self.env)
        self._synced: simpy.Event | None = None
        self._updating = False
        self._landing: list[list[Completion]] = []  # aborts on their way (`abort_steps` set)
        self.ledger = StepLedger(self.engines, workload.expected_length, scheduler.step_stats)
        self.records = self.ledger.records
        self._finished = False
        # schedulers that ignore SampleFinished may say so (a speed-up on large clusters)
        self._sample_events = bool(getattr(scheduler, "sample_events", True))
        self._cap: dict[int, int] = {}  # rid -> the max_new_tokens cap of its submission
        self._n_closed = 0  # batches closed so far
        self._progress = progress  # called with (steps done, steps) after each training step
        self.trace = trace
        self._spans: dict[int, RequestSpan] = {}  # rid -> its open span (only with a trace)

    # ------------------------------------------------------------------ groups
    def _register(self, groups: list[Group]) -> list[Group]:
        for g in groups:
            self.groups[g.gid] = g
            self._left[g.gid] = g.size
        return groups

    # ------------------------------------------------------------------ running
    def run(self) -> RunResult:
        with _no_full_gc():
            return self._run()

    def _run(self) -> RunResult:
        loop = self._colocated() if self.scheduler.mode == "colocated" else self._disaggregated()
        proc = self.env.process(loop)
        engine_loop = self._engine_loop()
        self.env.process(engine_loop)
        env = self.env
        try:
            while not proc.triggered:
                if env.peek() == INF:  # nothing scheduled, and the RL loop still waits: a stall
                    raise SchedulerError(
                        f"simulation stalled at t={self.now:.1f}s: nothing in flight and no event "
                        f"pending, but the {self.scheduler.mode} loop is still waiting (scheduler "
                        f"{self.scheduler.name!r} never closed a batch or never updated weights)"
                    )
                env.step()
        finally:
            engine_loop.close()  # its frame holds self: close it so no cycle outlives the run
        if not proc.ok:
            raise proc.value
        self._finished = True
        end_state = self._final_drain()
        peak = self._peak_tokens_per_s()
        return RunResult(
            scheduler=self.scheduler.name,
            steps=self.records,
            n_engines=len(self.engines),
            peak_tokens_per_s=peak,
            total_time_s=self.now,
            end_state=end_state,
        )

    def _colocated(self):
        for k in range(self.steps):
            self._begin_rollout(k)
            self._ready = self.env.event()
            self._emit(RolloutStarted(k, self.version))
            self._drain()
            groups = yield self._ready
            self._sync_clock()
            rec = self._end_rollout(groups)
            train = self.trainer.train_time(rec.trained_tokens + rec.trained_prompt_tokens)
            rec.train_time_s = train
            if self.trace is not None:
                t0, sync = self.now, self.trainer.sync_s
                self.trace.phases += [
                    PhaseSpan("rollout", k, rec.rollout_start_s, t0),
                    PhaseSpan("train", k, t0, t0 + train),
                    PhaseSpan("sync", k, t0 + train, t0 + train + sync),
                ]
            yield self._at(self.now + train + self.trainer.sync_s)
            self._sync_clock()
            self.version += 1
            rec.step_time_s = self.now - rec.rollout_start_s
            if self._progress is not None:
                self._progress(k + 1, self.steps)

    def _disaggregated(self):
        self._begin_rollout(0)
        self._emit(RolloutStarted(0, self.version))
        self._drain()
        last_end = 0.0
        for k in range(self.steps):
            groups = yield self._batches.get()
            self._sync_clock()
            rec = self._trained_record(k, groups)
            train = self.trainer.train_time(rec.trained_tokens + rec.trained_prompt_tokens)
            rec.train_time_s = train
            if self.trace is not None:
                self.trace.phases.append(PhaseSpan("train", k, self.now, self.now + train))
            yield self._at(self.now + train)
            self._sync_clock()
            self._synced = self.env.event()
            self._emit(TrainStepDone(k))
            self._drain()
            yield self._synced
            self._sync_clock()
            rec.step_time_s = self.now - last_end
            last_end = self.now
            if self._progress is not None:
                self._progress(k + 1, self.steps)

    def _sync_clock(self) -> None:
        self.now = max(self.now, self.env.now)

    # ------------------------------------------------------------------ step records
    def _begin_rollout(self, step: int) -> None:
        self.ctx.step = step
        self.ledger.begin(step, self.now)

    def _close_record(self) -> StepRecord:
        return self.ledger.close(self.now)

    def _end_rollout(self, groups: tuple[Group, ...]) -> StepRecord:
        """Colocated: the batch is closed and the engines are drained; train on it now."""
        rec = self._close_record()
        self.ledger.trained(rec, groups, trainer_version=self.version)
        return rec

    def _trained_record(self, k: int, groups: tuple[Group, ...]) -> StepRecord:
        """Disaggregated: the record of step k was opened when its batch closed."""
        rec = self.ledger.records[k]
        self.ledger.trained(rec, groups, trainer_version=k)
        return rec

    # ------------------------------------------------------------------ events and actions
    def _emit(self, event: Event) -> None:
        self._events.append(event)

    def _drain(self) -> None:
        if self._draining:
            return
        self._draining = True
        try:
            while self._events:
                ev = self._events.popleft()
                self.ctx.version = self.version
                self.ctx.in_flight = len(self._inflight)
                for action in self.scheduler.handle(ev, self.ctx):
                    self._apply(action)
        finally:
            self._draining = False
        self._rearm()
        self._check_ready()

    def _apply(self, action: Action) -> None:
        if isinstance(action, Submit):
            if action.max_new_tokens is not None and action.max_new_tokens < 1:
                raise SchedulerError("Submit.max_new_tokens must be >= 1")
            if self._paused:
                self._held.extend((s, action.max_new_tokens) for s in action.samples)
            else:
                self._submit(action.samples, action.max_new_tokens)
        elif isinstance(action, AbortAll):
            self._abort_all()
        elif isinstance(action, CloseBatch):
            self._close_batch(action.groups)
        elif isinstance(action, Discard):
            self._discard(action.samples)
        elif isinstance(action, UpdateWeights):
            self._update_weights(action.interrupt)
        elif isinstance(action, PauseGeneration):
            self._paused = True
            self.ledger.pause(self.now)
        elif isinstance(action, ResumeGeneration):
            self._paused = False
            self.ledger.resume(self.now)
            held, self._held = self._held, []
            by_cap: dict[int | None, list[Sample]] = {}
            for s, cap in held:
                by_cap.setdefault(cap, []).append(s)
            for cap, samples in by_cap.items():
                self._submit(samples, cap)
        else:
            raise SchedulerError(f"unknown action {action!r}")

    def _submit(self, samples: Sequence[Sample], cap: int | None = None) -> None:
        if self._finished or not samples:
            return
        per_engine: dict[int, list[Request]] = {}
        loads = [e.load for e in self.engines]
        pick = self.router.pick
        share = self.spec.prefix_sharing
        # during a weight sync, new work starts only once the new weights are loaded
        inflight, version = self._inflight, self.version + 1 if self._updating else self.version
        pending, partial_st, running = SampleStatus.PENDING, SampleStatus.PARTIAL, SampleStatus.RUNNING
        rid = self._next_rid
        ledger = self.ledger
        for s in samples:
            st = s.status
            if st is partial_st:
                ledger.n_partial -= 1
            elif st is not pending:
                raise SchedulerError(f"cannot submit sample {s.uid} in status {st.value}")
            g = s.generated
            if g:
                ledger.resumed(g)
            if cap is None or cap >= s.max_len - g:
                req = Request(rid, s.prompt_len + g, s.max_len - g, s._target_len - g)
            else:  # a token budget: stop this submission after `cap` tokens
                req = Request(rid, s.prompt_len + g, cap, min(s._target_len - g, cap))
                self._cap[rid] = cap
            if share and s.prompt_len > 1:  # the prompt but its last token, held once per engine
                req.prefix, req.shared = s.group_id, s.prompt_len - 1
                req.input_len -= req.shared
            i = pick(loads, s.group_id)
            loads[i] += 1
            s.status = running
            s.submits += 1
            s.submit_version = version
            inflight[rid] = s
            rid += 1
            reqs = per_engine.get(i)
            if reqs is None:
                per_engine[i] = [req]
            else:
                reqs.append(req)
        self._next_rid = rid
        spans = self._spans if self.trace is not None else None
        for i, reqs in per_engine.items():
            self.engines[i].submit(reqs, self.now)
            self._dirty.add(i)
            if spans is not None:
                for r in reqs:
                    smp = inflight[r.rid]
                    spans[r.rid] = RequestSpan(
                        i, r.rid, smp.uid, smp.group_id, version, self.now, self.now, 0, "abort",
                        carried=smp.generated,
                    )

    def _complete(self, c: Completion) -> Sample | None:
        """Credit a completion to its sample; return the sample if it came back unfinished."""
        s = self._inflight.pop(c.rid)
        s.add_tokens(c.tokens, s.submit_version)
        if self.trace is not None:
            self._close_span(c, s)
        if c.reason == "abort":
            s.status = _PARTIAL
            self.ledger.n_partial += 1
            if self._cap:
                self._cap.pop(c.rid, None)
            return s
        if self._cap and self._cap.pop(c.rid, None) is not None and s.generated < s._target_len:
            s.status = _PARTIAL  # used its token budget unfinished
            self.ledger.n_partial += 1
            self._events.append(SampleCapped(s))
            return None
        s.status = _DONE
        s.complete = True
        if self._sample_events:
            self._events.append(SampleFinished(s))
        gid = s.group_id
        left = self._left[gid] - 1
        self._left[gid] = left
        if left == 0:
            self._events.append(GroupFinished(self.groups[gid]))
        return None

    def _close_span(self, c: Completion, s: Sample) -> None:
        span = self._spans.pop(c.rid)
        span.end_s, span.tokens = c.time, c.tokens
        capped = c.rid in self._cap and c.reason != "abort" and s.generated < s._target_len
        span.reason = "capped" if capped else c.reason  # type: ignore[assignment]
        assert self.trace is not None
        self.trace.requests.append(span)

    def _abort_all(self) -> None:
        # with `abort_steps` k, as on a live engine: each engine finishes its step in flight (and
        # k more decode steps); the samples stay in flight, and the scheduler hears of them, when
        # the last one lands. Without it the abort lands at once.
        k = self.spec.abort_steps
        comps: list[Completion] = []
        land = self.now
        for i, e in enumerate(self.engines):
            if e.is_idle():
                continue
            if k is None:
                comps += e.abort_all(self.now)
            else:
                t, got = e.abort_after_steps(self.now, k)
                comps += got
                land = max(land, t)
            self._dirty.add(i)
        if land <= self.now:
            self._abort_landed(comps)
            return
        self._landing.append(comps)
        self._at(land).callbacks.append(partial(self._abort_landed_at, comps))

    def _abort_landed_at(self, comps: list[Completion], _ev) -> None:
        if self._finished:
            return
        self._sync_clock()
        self._landing.remove(comps)
        self._abort_landed(comps)
        self._drain()

    def _abort_landed(self, comps: list[Completion]) -> None:
        """Credit an abort's completions: finished samples as usual, the rest returned."""
        returned: list[Sample] = []
        for c in comps:
            s = self._complete(c)
            if s is not None:
                returned.append(s)
        self._emit(SamplesReturned(tuple(returned)))

    def _discard(self, samples: Sequence[Sample]) -> None:
        for s in samples:
            if s.status in (SampleStatus.RUNNING, SampleStatus.TRAINED, SampleStatus.DISCARDED):
                raise SchedulerError(f"cannot discard sample {s.uid} in status {s.status.value}")
            if s.status == SampleStatus.PARTIAL:
                self.ledger.n_partial -= 1
            s.status = SampleStatus.DISCARDED
            self.ledger.wasted(s.generated)

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
                "steps of the run (read ctx.total_steps)"
            )
        self._n_closed += 1
        if self.scheduler.mode == "colocated":
            self._closed.append(batch)
        else:
            self._sync_clock()
            self._end_rollout_disaggregated(batch)
            self._batches.put(batch)

    def _end_rollout_disaggregated(self, batch: tuple[Group, ...]) -> None:
        """Disaggregated: the batch queues for the trainer; the next rollout starts at once."""
        rec = self._close_record()
        if self.trace is not None:
            self.trace.phases.append(PhaseSpan("rollout", rec.step, rec.rollout_start_s, self.now))
        nxt = rec.step + 1
        if nxt < self.steps:
            self._begin_rollout(nxt)
            self._emit(RolloutStarted(nxt, self.version))

    def _update_weights(self, interrupt: bool) -> None:
        if self.scheduler.mode == "colocated":
            raise SchedulerError("UpdateWeights in colocated mode: the runtime syncs after training")
        if self._updating:
            raise SchedulerError("UpdateWeights while a weight update is in progress")
        self._updating = True
        until = self.now + self.trainer.sync_s
        returned: list[Sample] = []
        for i, e in enumerate(self.engines):
            comps = e.abort_all(self.now) if interrupt else e.pause(self.now, until)
            if interrupt:
                e.block_until(until)
            for c in comps:
                s = self._complete(c)
                if s is not None:
                    returned.append(s)
            self._dirty.add(i)
        if self.trace is not None:
            self.trace.phases.append(PhaseSpan("sync", self.version, self.now, until))
        done = self._at(until)
        done.callbacks.append(partial(self._weights_synced, tuple(returned)))

    def _weights_synced(self, returned: tuple[Sample, ...], _ev) -> None:
        self._sync_clock()
        self.version += 1
        self._updating = False
        self._emit(WeightsUpdated(self.version))
        if returned:
            self._emit(SamplesReturned(returned))
        self._drain()
        if self._synced is not None and not self._synced.triggered:
            self._synced.succeed()

    def _check_ready(self) -> None:
        if (
            self._ready is not None
            and not self._ready.triggered
            and self._closed
            and not self._inflight
        ):
            self._ready.succeed(self._closed.pop(0))

    # ------------------------------------------------------------------ engine timers
    def _at(self, t: float) -> simpy.Event:
        """A simpy timeout firing at absolute simulated time t (env.now may lag self.now)."""
        return self.env.timeout(max(0.0, t - self.env.now))

    def _sample_engine(self, i: int) -> None:
        """Trace the running batch and KV of engine i now (only when tracing)."""
        e = self.engines[i]
        assert self.trace is not None
        self.trace.engine_samples.append(
            EngineSample(i, self.now, e.n_running, e.progress_at(self.now)[2])
        )

    def _rearm(self) -> None:
        """Push the new next-event time of every engine whose plan changed."""
        if self.trace is not None:
            for i in self._dirty:
                self._sample_engine(i)
        for i in self._dirty:
            te = self.engines[i].t_event
            if te != self._armed[i]:
                self._armed[i] = te
                if te < INF:
                    heapq.heappush(self._heap, (te, i))
        self._dirty.clear()
        if self._wake is not None and not self._wake.triggered and self._heap:
            self._wake.succeed()

    def _engine_loop(self):
        """Handle engine events in time order; yield to simpy only when one of its events is due."""
        env, heap, armed, engines = self.env, self._heap, self._armed, self.engines
        while not self._finished:
            while heap and heap[0][0] != armed[heap[0][1]]:
                heapq.heappop(heap)  # stale: that engine re-planned
            if not heap:
                self._wake = env.event()
                yield self._wake
                continue
            te, i = heap[0]
            if te > env.peek() and te > env.now:
                # another simpy event comes first: let it run, then look again
                self._wake = env.event()
                yield env.timeout(te - env.now) | self._wake
                continue
            heapq.heappop(heap)
            if te > self.now:
                self.now = te
            e = engines[i]
            for c in e.advance():
                self._complete(c)
            if self.trace is not None:
                self._sample_engine(i)
            if self._events:
                armed[i] = INF
                self._dirty.add(i)
                self._drain()
            else:  # the common case: nothing for the scheduler, only this engine moved on
                nxt = e.t_event
                armed[i] = nxt
                if nxt < INF:
                    heapq.heappush(heap, (nxt, i))
                if not self._inflight:
                    self._check_ready()

    # ------------------------------------------------------------------ end of run
    def _final_drain(self) -> dict[str, int]:
        """Stop the engines at the end; count where every sample is (the conservation ledger)."""
        landing, self._landing = [c for comps in self._landing for c in comps], []
        for comps in [landing, *(e.abort_all(self.now) for e in self.engines)]:
            for c in comps:
                s = self._inflight.pop(c.rid)
                s.add_tokens(c.tokens, s.submit_version)
                if self.trace is not None:
                    self._close_span(c, s)
                done = c.reason != "abort" and s.generated >= s._target_len
                s.status = SampleStatus.DONE if done else SampleStatus.PARTIAL
                s.complete = done
        return self.ledger.end_state(self.groups.values())

    def _peak_tokens_per_s(self) -> float:
        """Ideal per-engine decode rate: a full batch at the workload's mean context (docs)."""
        spec = self.spec
        mean_resp = self.workload.expected_length(0)
        mean_prompt = float(self.workload.prompt_lengths.mean())
        ctx = mean_prompt + mean_resp / 2
        b = max(1, min(spec.max_running, int(spec.kv_capacity // (mean_prompt + mean_resp))))
        return b / spec.cost.decode_time(b, b * ctx)
