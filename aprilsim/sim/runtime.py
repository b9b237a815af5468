"""The simulated RL loop: a simpy driver of the rollout core (`aprilsim.rollout`).

The core holds the rollout's state and the scheduler; this driver owns the clock, the simulated
engines and the trainer. Engines are plain objects that know their next event time. One simpy
process (`_engine_loop`) owns them: it pops the earliest engine event from a heap and handles it
at once, yielding to simpy only when another simpy event (the trainer, a weight sync) is due
first. So simpy orders the RL loop while engine events cost no simpy scheduling; `self.now` is the
simulated clock (simpy's `env.now` can lag behind it inside the loop, so every timeout is set at
an absolute time via `_at`). A request that ends is one direct call, `core.request_ended`.

Colocated mode (slime --colocate): rollout, then training, then weight sync; engines are idle
while the trainer runs. Disaggregated mode: the trainer runs on its own GPUs; batches queue up for
it, and weights are synced when the scheduler says so (`UpdateWeights`).
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from heapq import heappop, heapreplace
from typing import Final

import simpy

from aprilsim.engine.cost import EngineSpec, slowed
from aprilsim.engine.draft_board import DraftBoard, Stamp
from aprilsim.engine.fast import FastEngine
from aprilsim.engine.kv_transfer import transfer_delay
from aprilsim.engine.meter import SimMeter
from aprilsim.engine.protocol import EngineFactory, abort_engine, request_builder
from aprilsim.engine.request import Completion, Request
from aprilsim.engine.router import GroupAffinity, RoundRobin, Router, make_router
from aprilsim.engine.speculative import attach_board, engine_cost
from aprilsim.metrics.gain import fixed_iteration_cost
from aprilsim.metrics.records import RunResult, StepRecord
from aprilsim.metrics.trace import EngineSample, PhaseSpan, RequestSpan, Trace
from aprilsim.native import mypyc_attr
from aprilsim.policies.base import BY_GROUP, MOST_ROOM, Scheduler, SchedulerError
from aprilsim.rollout.core import RolloutCore
from aprilsim.rollout.ports import Abort, BatchReady, Command, Placement, SyncWeights, ToolCall
from aprilsim.sim.engine_clock import TupleClock, engine_clock
from aprilsim.trainer import TrainerModel
from aprilsim.types import Group, Sample, SampleStatus
from aprilsim.workload.generator import Workload

INF: Final = math.inf  # Final: a C static in the compiled build, not a dict lookup per use
GC_STEPS: Final = 8  # steps between the garbage collections of a run (`collection_paused`)
_PARTIAL: Final = SampleStatus.PARTIAL
_SYNC: Final = -1  # `_landing`'s key of a weight sync's abort (an abort's is its own key)


__all__ = ["EngineFactory", "SchedulerError", "Simulation", "SimMeter", "collection_paused"]


@contextmanager
def collection_paused() -> Iterator[None]:
    """Turn Python's automatic garbage collection off for a run: `_collect_steps` frees what
    the steps left in reference cycles every `GC_STEPS` steps instead.

    A run allocates hundreds of thousands of long-lived, acyclic objects (samples, segments,
    requests, groups) and makes no reference cycle of its own (a whole cluster run leaves none
    behind). The automatic collector scans them anyway: its full collections re-traversed the
    growing heap several times per run (about half of the CPU time of the cluster benchmark),
    and young collections every 20,000 allocations were still 3.6 % of a compiled cluster run's
    instructions, scanning objects that outlive them; one collection per step, 2.7 %. Every
    `GC_STEPS` steps, most objects of the steps before have been freed by reference counting,
    and memory stays bounded in steps if a scheduler makes cycles. A finished Simulation holds
    no cycle, so reference counting frees it; the collector's state comes back after the run.

    Nested, the outer one restores it: `simulate` keeps the collector off until the finished
    Simulation is freed, so that the first collection after the run does not traverse the
    run's last objects (30-90 ms of memory stalls after a cluster run, not seen in instruction
    counts).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _collect_steps(done: int) -> None:
    """`done` steps have ended: every `GC_STEPS` of them, collect the young generations (the
    survivors age out of them, so later collections do not scan them again)."""
    if done % GC_STEPS == 0:
        gc.collect(1)


class _Workload:
    """The workload as the core's group maker."""

    __slots__ = ("workload",)

    def __init__(self, workload: Workload) -> None:
        self.workload = workload

    @property
    def agentic(self) -> bool:
        """Whether its samples may be episodes (their steps record the episodes' figures)."""
        return bool(getattr(self.workload, "agentic", False))

    def new_groups(self, n: int, step: int, group_size: int | None = None) -> list[Group]:
        return self.workload.generate(n, step, group_size)

    def regenerate(self, groups: Sequence[Group], step: int, group_size: int) -> list[Group]:
        return self.workload.regenerate(list(groups), step, group_size)


class _Gone:
    """The sender of a finished run (the Simulation is freed by reference counting)."""

    def __getattr__(self, name: str):
        raise SchedulerError("the simulation is over")


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassed: tests, engine_factory
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
        keep_groups: bool = True,
        slowdown: Sequence[float] | None = None,
    ) -> None:
        if n_engines < 1 or batch_size < 1 or steps < 1:
            raise ValueError("n_engines, batch_size and steps must be >= 1")
        if slowdown is not None and len(slowdown) != n_engines:
            raise ValueError(f"slowdown has {len(slowdown)} values for {n_engines} engines")
        self.workload = workload
        self.spec = engine
        self._requests = request_builder(engine, workload.group_size)  # sample -> Request
        # the board models' draft material across engines (`draft_board`): one per run
        sp = engine.speculative
        self._board: DraftBoard | None = DraftBoard(sp) if sp is not None and sp.on_board else None
        self.scheduler = scheduler
        self.batch_size = batch_size
        self.steps = steps
        self.trainer = trainer or TrainerModel()
        self.router = make_router(router) if isinstance(router, str) else router
        self._by_group = GroupAffinity()  # `Submit.route = BY_GROUP`: each group's engine
        self.env = simpy.Environment()
        # engine i's steps take slowdown[i] times as long (stragglers, mixed devices)
        self.engines = [engine_factory(slowed(engine, slowdown[i]) if slowdown else engine, i)
                        for i in range(n_engines)]
        if self._board is not None:
            attach_board(self.engines, self._board)
        self.now = 0.0
        self.core = RolloutCore(
            scheduler=scheduler, groups=_Workload(workload), batch_size=batch_size, steps=steps,
            max_len=workload.max_len, group_size=workload.group_size, meter=SimMeter(self.engines),
            sender=self, expected_length=workload.expected_length, keep_groups=keep_groups,
        )
        self.ctx = self.core.ctx
        self.ledger = self.core.ledger
        self.records = self.core.records
        self._dirty: set[int] = set()
        self._clock = engine_clock(n_engines)  # each engine's next event time, earliest first
        self._wake: simpy.Event | None = None
        self._ready: simpy.Event | None = None
        self._batches = simpy.Store(self.env)
        self._synced: simpy.Event | None = None
        # what engine I/O on its way (an abort, a sync's abort: `abort_steps`) brought back, by
        # abort key (`_SYNC`: the sync's), until it lands; the end of the run stops it
        self._landing: dict[int, list[Completion]] = {}
        # requests on their way to the engines (`client_overhead_s`): id -> engine -> requests
        self._pending: dict[int, dict[int, list[Request]]] = {}
        self._n_sent = 0
        self._sending_until = 0.0  # the client's last send ends then (`client_send_s`)
        self._finished = False
        self._progress = progress  # called with (steps done, steps) after each training step
        self.trace = trace
        self._spans: dict[int, RequestSpan] = {}  # rid -> its open span (only with a trace)
        if trace is not None:
            self.core.on_ended = self._close_span  # type: ignore[assignment]  # ends: Completions

    @property
    def version(self) -> int:
        """The policy version the engines hold."""
        return self.core.version

    @property
    def groups(self) -> dict[int, Group]:
        return self.core.groups

    # ------------------------------------------------------------------ running
    def run(self) -> RunResult:
        with collection_paused():
            try:
                return self._run()
            finally:
                self.core.sender = _Gone()  # the core no longer holds this driver: no cycle
                self.core.on_ended = None

    def _run(self) -> RunResult:
        loop = self._colocated() if self.scheduler.mode == "colocated" else self._disaggregated()
        proc = self.env.process(loop)
        engine_loop = self._engine_loop()
        self.env.process(engine_loop)
        env = self.env
        try:
            while not proc.triggered:
                if env.peek() == INF:  # nothing scheduled, and the RL loop still waits: a stall
                    raise self.core.stalled(
                        f"simulation stalled at t={self.now:.1f}s",
                        "nothing in flight and no event pending")
                env.step()
        finally:
            engine_loop.close()  # its frame holds self: close it so no cycle outlives the run
        if not proc.ok:
            err = proc.value  # a failed process holds its exception
            assert isinstance(err, BaseException)
            raise err
        self._finished = True
        self.core.finish()
        end_state = self._final_drain()
        return RunResult(
            scheduler=self.scheduler.name,
            steps=self.records,
            n_engines=len(self.engines),
            peak_tokens_per_s=self._peak_tokens_per_s(),
            total_time_s=self.now,
            end_state=end_state,
            iteration_cost_s=fixed_iteration_cost(self.spec.cost),
        )

    def _colocated(self):
        core = self.core
        for k in range(self.steps):
            self._ready = self.env.event()
            core.start_rollout(k, self.now)
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
            if self.spec.prefix_cache_flush:  # the new weights make every kept run stale
                for e in self.engines:
                    e.flush_prefix_cache()
            core.colocated_synced()
            rec.step_time_s = self.now - rec.rollout_start_s
            _collect_steps(k + 1)
            if self._progress is not None:
                self._progress(k + 1, self.steps)

    def _disaggregated(self):
        core = self.core
        core.start_rollout(0, self.now)
        self._drain()
        last_end = 0.0
        for k in range(self.steps):
            groups = yield self._batches.get()
            self._sync_clock()
            self._record_starts()
            rec = core.train_record(k, groups)
            train = self.trainer.train_time(rec.trained_tokens + rec.trained_prompt_tokens)
            rec.train_time_s = train
            if self.trace is not None:
                self.trace.phases.append(PhaseSpan("train", k, self.now, self.now + train))
            yield self._at(self.now + train)
            self._sync_clock()
            self._synced = self.env.event()
            core.train_done(k, self.now)
            self._drain()
            yield self._synced
            self._sync_clock()
            rec.step_time_s = self.now - last_end
            last_end = self.now
            _collect_steps(k + 1)
            if self._progress is not None:
                self._progress(k + 1, self.steps)

    def _end_rollout(self, groups: tuple[Group, ...]) -> StepRecord:
        """Colocated: the batch is closed and the engines are drained; its record, to train on."""
        self._record_starts()
        return self.core.end_rollout(groups, self.now)

    def _sync_clock(self) -> None:
        self.now = max(self.now, self.env.now)

    def _drain(self) -> None:
        """Let the scheduler react, carry out the commands the core returns (and let it react to
        what they bring back) until none is left, then re-plan the engines they touched."""
        cmds = self.core.drain(self.now)
        if cmds:
            self._carry_out_all(cmds)
        self._rearm()

    def _carry_out_all(self, cmds: tuple[Command, ...]) -> None:
        """Carry out the core's commands, in the order given, and drain it again until it
        returns none."""
        core = self.core
        while cmds:
            for cmd in cmds:
                self._carry_out(cmd)
            cmds = core.drain(self.now)

    def _carry_out(self, cmd: Command) -> None:
        """One command of the core: run a tool call's timer, hand a batch over, abort, or
        start a weight sync."""
        if isinstance(cmd, ToolCall):
            self._at(self.now + cmd.seconds).callbacks.append(partial(self._tool_done, cmd.rid))
        elif isinstance(cmd, BatchReady):
            self._batch_ready(cmd.batch)
        elif isinstance(cmd, Abort):
            self._abort_engines(cmd.key)
        elif isinstance(cmd, SyncWeights):
            self._sync_engines(cmd.interrupt)
        else:  # pragma: no cover - the core returns no other command
            raise SchedulerError(f"unknown engine command {cmd!r}")

    # ------------------------------------------------------------ sends (the core's sender)
    def send(self, samples: Sequence[Sample], first_rid: int, cap: int | None, version: int,
             place: Placement | None = None) -> None:
        """Route each sample's request (`RequestBuilder`) to an engine and hand them over."""
        if place is not None:
            self._send_placed(samples, first_rid, cap, version, place)
            return
        reqs = self._requests.build_all(samples, first_rid, cap)
        # each engine's requests, the dict in the order engines were first picked (what
        # `_hand_over` and the trace see)
        per_engine: dict[int, list[Request]] = {}
        router, n = self.router, len(self.engines)
        if isinstance(router, RoundRobin):  # the default: engines in turn, whatever the load
            first = router.take(len(reqs), n)
            for j in range(min(n, len(reqs))):
                per_engine[(first + j) % n] = reqs[j::n]
            if self._board is not None:
                self._stamp_board(samples, first_rid, per_engine, version)
            self._hand_over(per_engine, version)
            return
        # any other router through its `pick`; each engine's requests found through a list
        # indexed by engine (no int-keyed dict operation per request)
        buckets: list[list[Request] | None] = [None] * n
        loads = [e.load for e in self.engines] if not self._pending else self._loads()
        pick = router.pick
        for s, req in zip(samples, reqs):
            i = pick(loads, s.group_id)
            loads[i] += 1
            bucket = buckets[i]
            if bucket is None:
                per_engine[i] = buckets[i] = [req]
            else:
                bucket.append(req)
        if self._board is not None:
            self._stamp_board(samples, first_rid, per_engine, version)
        self._hand_over(per_engine, version)

    def _send_placed(self, samples: Sequence[Sample], first_rid: int, cap: int | None,
                     version: int, place: Placement) -> None:
        """`send` with a priority and a route: a named engine, the one with the most room (its
        free KV less its queue's input, less what this send already put there: input plus the
        piece's max_new), its group's, or the router; `keep_kv` as `RequestBuilder.build` says
        (the migrated KV reaches the engine after its transfer)."""
        engines = self.engines
        route = place.route
        if isinstance(route, int) and not 0 <= route < len(engines):
            raise SchedulerError(f"Submit.route {route}: no such engine (0..{len(engines) - 1})")
        if isinstance(route, str) and route not in (MOST_ROOM, BY_GROUP):
            raise SchedulerError(f"Submit.route {route!r}: an engine index, {MOST_ROOM!r}, "
                                 f"{BY_GROUP!r} or None")
        rooms = self._rooms() if route == MOST_ROOM else []
        loads = self._loads()
        reqs = self._requests.build_all(samples, first_rid, cap, place.priority, place.keep_kv)
        per_engine: dict[int, list[Request]] = {}
        moving: dict[float, dict[int, list[Request]]] = {}  # transfer delay -> engine -> requests
        for s, req in zip(samples, reqs):
            wait = transfer_delay(self.spec, req.migrated) if req.migrated else 0.0  # KV pool
            i = self._placed_engine(route, rooms, loads, s.group_id, req)
            loads[i] += 1
            dest = per_engine if wait <= 0 else moving.setdefault(wait, {})
            dest.setdefault(i, []).append(req)
        if self._board is not None:
            self._stamp_board(samples, first_rid, per_engine, version)
            for late in moving.values():
                self._stamp_board(samples, first_rid, late, version)
        if per_engine or not moving:
            self._hand_over(per_engine, version)
        for wait, late in moving.items():  # migrated KV: the piece starts once it has arrived
            self._hand_over(late, version, wait)

    def _placed_engine(self, route: int | str | None, rooms: list[int], loads: list[int],
                       group: int, req: Request) -> int:
        """The engine a placed request goes to: the router's, the one with the most room (its
        room then counts the request: input plus max_new), its group's, or the named one."""
        if route is None:
            return self.router.pick(loads, group)
        if route == MOST_ROOM:
            i = max(range(len(rooms)), key=rooms.__getitem__)  # ties: the lowest index
            rooms[i] -= req.input_len + req.shared + req.max_new
            return i
        if route == BY_GROUP:
            return self._by_group.pick(loads, group)
        return route  # type: ignore[return-value]

    def _rooms(self) -> list[int]:
        """Each engine's room (`room_at`), less the input of requests on their way to it (a
        client overhead, a KV transfer): they count as queued there already."""
        rooms = [e.room_at(self.now) for e in self.engines]
        for per_engine in self._pending.values():
            for i, reqs in per_engine.items():
                rooms[i] -= sum(r.input_len + r.shared for r in reqs)
        return rooms

    def _stamp_board(self, samples: Sequence[Sample], first_rid: int,
                     per_engine: dict[int, list[Request]], version: int) -> None:
        """Speculative decoding read from the run's draft board: it learns what each request
        continues (`draft_board.Stamp`; the request carries its group: `RequestBuilder`)."""
        n = self.workload.group_size
        board = self._board
        assert board is not None
        for reqs in per_engine.values():
            for r in reqs:
                s = samples[r.rid - first_rid]
                t = s._target_len
                left = (t if t is not None else s.max_len) - s.generated
                board.stamp(r.rid, Stamp(s.group_id, n, s.uid, self._prompt_of(s.group_id),
                                         version, s.generated, left))

    def _prompt_of(self, gid: int) -> int:
        """The prompt id of group `gid` (-1: unknown)."""
        g = self.core.groups.get(gid)
        return g.prompt_id if g is not None else -1

    def _loads(self) -> list[int]:
        """Each engine's requests, those still on their way to it included (`client_overhead_s`:
        the live router counts a request from the moment it is sent)."""
        loads = [e.load for e in self.engines]
        for per_engine in self._pending.values():
            for i, reqs in per_engine.items():
                loads[i] += len(reqs)
        return loads

    def _hand_over(self, per_engine: dict[int, list[Request]], version: int,
                   extra_s: float = 0.0) -> None:
        """Submit each engine's requests now, or `client_overhead_s` (plus `extra_s`: a KV
        transfer) later, one after another where the client sends them so (`client_send_s`);
        open their trace spans now."""
        spans = self._spans if self.trace is not None else None
        inflight = self.core.inflight
        delay = self.spec.client_overhead_s + extra_s
        at_once = False
        if self.spec.client_send_s > 0:
            self._send_one_by_one(per_engine, delay)
        elif delay > 0:  # each request reaches its engine that much later (the client's own time)
            self._on_the_way(per_engine, delay)
        else:
            at_once = True
        for i, reqs in per_engine.items():
            if at_once:
                self.engines[i].submit(reqs, self.now)
                self._dirty.add(i)
            if spans is not None:
                for r in reqs:
                    smp = inflight[r.rid]
                    spans[r.rid] = RequestSpan(
                        i, r.rid, smp.uid, smp.group_id, version, self.now, self.now, 0, "abort",
                        carried=smp.generated,
                    )

    def _on_the_way(self, per_engine: dict[int, list[Request]], delay: float) -> None:
        """These requests reach their engines `delay` from now (unless an abort comes first)."""
        self._n_sent += 1
        self._pending[self._n_sent] = per_engine
        self._at(self.now + delay).callbacks.append(partial(self._deliver, self._n_sent))

    def _send_one_by_one(self, per_engine: dict[int, list[Request]], delay: float) -> None:
        """The client sends one request after another, in the order it made them (by rid),
        `client_send_s` each, once it has sent the ones before: the k-th of this send reaches its
        engine `delay` plus k sends after the client starts on it."""
        step = self.spec.client_send_s
        order = sorted((r.rid, i, r) for i, reqs in per_engine.items() for r in reqs)
        start = max(self.now, self._sending_until)
        for k, (_, i, r) in enumerate(order):
            self._on_the_way({i: [r]}, start - self.now + delay + k * step)
        self._sending_until = start + len(order) * step

    def _deliver(self, key: int, _ev) -> None:
        """Requests sent `client_overhead_s` ago reach their engines (unless aborted meanwhile)."""
        per_engine = self._pending.pop(key, None)
        if self._finished or per_engine is None:
            return
        self._sync_clock()
        spans = self._spans if self.trace is not None else None
        for i, reqs in per_engine.items():
            self.engines[i].submit(reqs, self.now)
            self._dirty.add(i)
            if spans is not None:  # when it reached its engine, as a live span says
                for r in reqs:
                    if r.rid in spans:
                        spans[r.rid].accepted_s = self.now
        self._drain()

    def _record_starts(self) -> None:
        """Record the first schedulings the engines reported: each sample's `start_s` (its queue
        wait), on the sample the request carries (`RequestBuilder`: only while the sample has
        none; reported once). Before the ledger reads them (a step's trained batch), so the
        engine loop pays nothing per event."""
        for e in self.engines:
            for r in e.started:  # the first scheduling: the earliest (a sample resubmitted
                s = r.sample  # within the step may report again, maybe on an engine before)
                if s.start_s < 0.0 or r.started_s < s.start_s:  # type: ignore[union-attr]
                    s.start_s = r.started_s  # type: ignore[union-attr]
            e.started.clear()

    # ------------------------------------------------------------ engine I/O (the core's commands)
    def _drop_pending(self) -> list[Completion]:
        """An abort: requests still on their way never reach an engine (no token generated)."""
        out = [Completion(r.rid, 0, "abort", self.now)
               for per_engine in self._pending.values() for reqs in per_engine.values()
               for r in reqs]
        self._pending.clear()
        self._sending_until = self.now  # what the client had yet to send is not sent
        return out

    def _abort_engines(self, key: int) -> None:
        """The `Abort` command `key`: every engine stops by the abort rule (`abort_engine`:
        with `abort_steps` k, as on a live engine, each finishes its step in flight and k more
        decode steps), requests on their way never arrive; the core hears it when the last
        engine's abort lands (at once: now)."""
        comps = self._drop_pending() if self._pending else []
        land = now = self.now
        for i, e in enumerate(self.engines):
            if e.is_idle():
                continue
            t, got = abort_engine(e, now, self.spec)
            comps += got
            land = max(land, t)
            self._dirty.add(i)
        if land <= now:
            self.core.abort_landed(key, comps, now)
            return
        self._landing[key] = comps
        self._at(land).callbacks.append(partial(self._abort_landed_at, key))

    def _abort_landed_at(self, key: int, _ev) -> None:
        if self._finished:
            return
        self._sync_clock()
        self.core.abort_landed(key, self._landing.pop(key), self.now)
        self._drain()

    def _sync_engines(self, interrupt: bool) -> None:
        """The `SyncWeights` command: pause the engines for the sync, or abort them (the abort
        rule, as an AbortAll) and sync once the abort has landed; the new weights are loaded
        `sync_s` later."""
        now, spec = self.now, self.spec
        comps = self._drop_pending() if interrupt and self._pending else []
        land = now
        if interrupt:
            for e in self.engines:
                t, got = abort_engine(e, now, spec)
                comps += got
                land = max(land, t)
        until = land + self.trainer.sync_s
        for i, e in enumerate(self.engines):
            if interrupt:
                e.block_until(until)
            else:
                comps += e.pause(now, until)
            if spec.prefix_cache_flush:
                e.flush_prefix_cache()
            self._dirty.add(i)
        if land > now:  # the requests come back, and the sync starts, once the abort has landed
            self._landing[_SYNC] = comps
            self._at(land).callbacks.append(partial(self._sync_landed_at, until))
        else:
            self.core.sync_aborted(comps, now)
            self._sync_started(now, until)

    def _sync_landed_at(self, until: float, _ev) -> None:
        if self._finished:
            return
        self._sync_clock()
        self.core.sync_aborted(self._landing.pop(_SYNC), self.now)
        self._sync_started(self.now, until)
        self._drain()

    def _sync_started(self, now: float, until: float) -> None:
        if self.trace is not None:
            self.trace.phases.append(PhaseSpan("sync", self.version, now, until))
        self._at(until).callbacks.append(self._weights_synced)

    def _weights_synced(self, _ev) -> None:
        self._sync_clock()
        self.core.weights_synced(self.now)
        self._drain()
        if self._synced is not None and not self._synced.triggered:
            self._synced.succeed()

    def _tool_done(self, rid: int, _ev) -> None:
        """An episode's tool call returned (unless an abort cancelled it): its next turn goes.
        While an interrupting sync's abort is on its way, the core holds it until that lands."""
        if self._finished or not self.core.tool_live(rid):
            return
        self._sync_clock()
        self.core.tool_done(rid, self.now)
        self._drain()

    def _batch_ready(self, batch: tuple[Group, ...]) -> None:
        """`BatchReady`: colocated, the loop trains the batch; else it queues for the trainer."""
        if self.core.colocated:
            assert self._ready is not None and not self._ready.triggered
            self._ready.succeed(batch)
            return
        self._sync_clock()
        if self.trace is not None:
            rec = self.records[-1]
            self.trace.phases.append(PhaseSpan("rollout", rec.step, rec.rollout_start_s, self.now))
        self._batches.put(batch)

    # ------------------------------------------------------------------ trace
    def _close_span(self, c: Completion, s: Sample) -> None:
        """Close the span of a request that ended (after the core credited it)."""
        span = self._spans.pop(c.rid)
        span.end_s, span.tokens = c.time, c.tokens
        capped = c.reason != "abort" and s.status is _PARTIAL
        span.reason = "capped" if capped else c.reason  # type: ignore[assignment]
        assert self.trace is not None
        self.trace.requests.append(span)

    def _sample_engine(self, i: int) -> None:
        """Trace the running batch and KV of engine i now (only when tracing)."""
        e = self.engines[i]
        assert self.trace is not None
        self.trace.engine_samples.append(
            EngineSample(i, self.now, e.n_running, e.progress_at(self.now)[2])
        )

    # ------------------------------------------------------------------ engine timers
    def _at(self, t: float) -> simpy.Event:
        """A simpy timeout firing at absolute simulated time t (env.now may lag self.now)."""
        return self.env.timeout(max(0.0, t - self.env.now))

    def _rearm(self) -> None:
        """Push the new next-event time of every engine whose plan changed."""
        if self.trace is not None:
            for i in self._dirty:
                self._sample_engine(i)
        clock, engines = self._clock, self.engines
        for i in self._dirty:
            clock.arm(i, engines[i].t_event)
        self._dirty.clear()
        if self._wake is not None and not self._wake.triggered and clock:
            self._wake.succeed()

    def _engine_loop(self) -> Generator[simpy.Event, None, None]:
        """Handle engine events in time order; yield to simpy only when one of its events is due."""
        env, clock = self.env, self._clock
        fast = self._fast_engines()
        core = self.core
        events, inflight, timers = core.events, core.inflight, core.timers
        tracing = self.trace is not None
        peek = env.peek
        # simpy's next event: its queue changes only when this loop yields or the core reacts
        # (a drain, a batch handed over), so it is read again only then
        due = peek()
        # pure Python: the tuple clock's `first`, `time` and `served` inline, on its heap and
        # times (three Python calls per engine event were ~7 % of a pure cluster run's CPU,
        # in the interpreter's dispatch more than in instructions: docs/development.md)
        tc = clock if isinstance(clock, TupleClock) else None
        heap: list[tuple[float, int]] = tc.heap if tc is not None else []
        armed: list[float] = tc.armed if tc is not None else []
        while not self._finished:
            if tc is not None:
                while heap and heap[0][0] != armed[heap[0][1]]:
                    heappop(heap)  # stale: that engine re-planned
                i = heap[0][1] if heap else -1
            else:
                i = clock.first()
            te = INF if i < 0 else armed[i] if tc is not None else clock.time(i)
            if i < 0 or (te > due and te > env.now):  # no engine armed, or simpy's event first
                due = yield from self._let_simpy_run(te)
                continue
            if te > self.now:
                self.now = te
            now = self.now  # the requests that end now finish at this time
            if fast is not None and not tracing:  # the common case
                for c in fast[i].advance():
                    core.request_ended(c.rid, c.tokens, c.reason, now)
                nxt = fast[i].t_event
            else:
                nxt = self._advance(i, now)
            if events or timers:  # the scheduler reacts, or an episode's tool call starts
                nxt = INF  # armed again once the scheduler has reacted
            if tc is None:
                clock.served(i, nxt)
            elif nxt < INF:
                armed[i] = nxt
                heapreplace(heap, (nxt, i))  # pop its event and push its next in one sift
            else:
                armed[i] = nxt
                heappop(heap)
            if events or timers:
                self._dirty.add(i)
                self._drain()
                due = peek()
            else:  # the common case: nothing for the scheduler, only this engine moved on
                if not inflight:  # colocated: the batch may be ready now
                    cmds = core.drain(now)
                    if cmds:
                        self._carry_out_all(cmds)
                    due = peek()

    def _fast_engines(self) -> list[FastEngine] | None:
        """The engines as FastEngines where they all are (every run but the reference's): a
        compiled loop then calls them natively instead of through the protocol's attributes."""
        if all(isinstance(e, FastEngine) for e in self.engines):
            return [e for e in self.engines if isinstance(e, FastEngine)]
        return None

    def _let_simpy_run(self, te: float) -> Generator[simpy.Event, None, float]:
        """The engine loop waits: until `te` (its next engine event) or until an engine is
        re-armed (`_rearm` wakes it); returns simpy's next event time then."""
        env = self.env
        self._wake = env.event()
        if te == INF:
            yield self._wake
        else:
            yield env.timeout(te - env.now) | self._wake
        return env.peek()

    def _advance(self, i: int, now: float) -> float:
        """`_engine_loop`'s engine event on engine i through the protocol (a reference engine),
        or with a trace (the spans closed, the engine sampled); its next event time."""
        e, core = self.engines[i], self.core
        for c in e.advance():
            s = core.request_ended(c.rid, c.tokens, c.reason, now)
            if self.trace is not None:
                self._close_span(c, s)
        if self.trace is not None:
            self._sample_engine(i)
        return e.t_event

    # ------------------------------------------------------------------ end of run
    def _final_drain(self) -> dict[str, int]:
        """Stop the engines at the end; count where every sample is (the conservation ledger:
        the core stops what it held, never sent)."""
        landing = [c for comps in self._landing.values() for c in comps]
        self._landing = {}
        core = self.core
        pending = self._drop_pending()
        stopped = [e.abort_all(self.now) for e in self.engines]
        self._record_starts()
        for comps in [landing, pending, *stopped]:
            for c in comps:
                s = core.final_ended(c.rid, c.tokens, c.reason)
                if self.trace is not None:
                    self._close_span(c, s)
        return core.end_state()

    def _peak_tokens_per_s(self) -> float:
        """Ideal per-engine decode rate: a full batch at the workload's mean context (docs)."""
        spec = self.spec
        mean_resp = self.workload.expected_length(0)
        mean_prompt = float(self.workload.prompt_lengths.mean())
        ctx = mean_prompt + mean_resp / 2
        b = max(1, min(spec.max_running, int(spec.kv_capacity // (mean_prompt + mean_resp))))
        return b / engine_cost(spec).decode_time(b, b * ctx)  # speculative decoding's if on

