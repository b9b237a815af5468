"""The live driver on simulated engines in virtual time: what the parity test runs.

`run_virtual` runs the asyncio live driver (`real.runner.runtime.LiveRuntime`, unchanged) with
the simulator's engines (`aprilsim.engine.fast.FastEngine`) behind the live `Engine` protocol,
on an asyncio event loop whose clock is virtual: time moves only when nothing is ready to run,
to the earliest of the next timer (the trainer, a weight sync, an abort landing) and the next
engine event, so a run is deterministic and takes no wall time. Its records must equal those of
`aprilsim simulate` (`tests/real/test_parity.py`); `real.runner.live_conformance.run_under_live`
runs the conformance checks through it too.

The pieces, each the live counterpart of a piece of `aprilsim.sim.runtime`:

* `VirtualLoop`: the event loop with the virtual clock; at each idle point it first hands the
  engines the requests sent since, then carries out one engine event (the simulator's engine loop
  also handles one engine event, then lets the scheduler react, before the next);
* `VirtualEngine`: one FastEngine as an `Engine` + `WeightSync`: a request is queued on it at the
  moment the driver sends it (`VirtualCluster.generate`), built from its sample as the simulator
  builds it (`RequestBuilder`), its result comes when the engine ends it (with when it was first
  scheduled: `Timings.scheduled`); an abort follows the simulator's rule (`abort_engine`), a pause
  lasts the modelled sync time;
* `VirtualCluster`: the live `Cluster`, routing included, whose requests reach their engine at once
  (as the simulator's `send`), so a router sees every request of a batch;
* `VirtualMeter`: the simulated engines' meter (`SimMeter`), reading them exactly at the time given.
"""

from __future__ import annotations

import asyncio
import math
import selectors
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from aprilsim.config import Scenario
from aprilsim.engine.cost import slowed
from aprilsim.engine.fast import FastEngine
from aprilsim.engine.kv_transfer import transfer_delay
from aprilsim.engine.meter import SimMeter
from aprilsim.engine.protocol import EngineFactory, abort_engine, request_builder
from aprilsim.engine.request import Completion, Request
from aprilsim.engine.router import make_router
from aprilsim.metrics.records import RunResult
from aprilsim.metrics.trace import Trace
from aprilsim.metrics.warmup import scaled_warmup
from aprilsim.policies.base import Scheduler
from aprilsim.scheduler_spec import build_scheduler
from aprilsim.types import FinishReason, Sample
from real.protocol import (
    GenerateRequest,
    GenerateResult,
    Progress,
    ServerInfo,
    Timings,
    stream_via_generate,
)

from .cluster import Cluster, Slot
from .runtime import LiveRuntime
from .source import ReplaySource
from .trainer import TrainerStandIn

__all__ = ["SampleLookup", "VirtualCluster", "VirtualEngine", "VirtualLoop", "VirtualMeter",
           "VirtualRun", "run_virtual"]

INF = math.inf
_TOKEN = 7  # the id every simulated output token carries (a replayed run reads lengths only)


class _IdleSelector(selectors.DefaultSelector):
    """The loop's selector: where asyncio would block, the virtual clock moves on instead."""

    def __init__(self, loop: VirtualLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None):
        if timeout != 0:  # nothing ready to run: move virtual time on
            self._loop._idle()
        return super().select(0)


class VirtualLoop(asyncio.SelectorEventLoop):
    """An asyncio event loop on a virtual clock that also steps the simulated engines."""

    def __init__(self) -> None:
        self._vt = 0.0
        self.engines: list[VirtualEngine] = []
        super().__init__(_IdleSelector(self))
        self._clock_resolution = math.ulp(0.0)

    def time(self) -> float:
        return self._vt

    def _advance(self, t: float) -> None:
        if t > self._vt:
            self._vt = t
            # asyncio runs the timers due before time() + resolution: exactly those due by t
            self._clock_resolution = math.ulp(t)

    def _idle(self) -> None:
        """Hand the engines what was sent; then one engine event, or the next timer's time."""
        for e in self.engines:
            e.flush()
        scheduled = self._scheduled  # type: ignore[attr-defined]  # asyncio's timer heap
        t_timer = scheduled[0].when() if scheduled else INF
        t_engine, first = INF, None
        for e in self.engines:
            t = e.engine.t_event
            if t < t_engine:
                t_engine, first = t, e
        if first is not None and t_engine <= t_timer:  # an engine event first, as simulated
            self._advance(t_engine)
            first.step()
        elif t_timer < INF:
            self._advance(t_timer)
        else:
            raise RuntimeError(f"virtual loop stalled at t={self._vt:.3f}s: no "
                               "timer, no engine event")


@dataclass(frozen=True)
class SampleLookup:
    """How a virtual engine finds the sample a request generates (by the request's `tag`), so
    that its request is the simulator's; `group_size`: the workload's (speculative decoding
    with "siblings" acceptance stamps it on each request)."""

    find: Callable[[GenerateRequest], Sample]
    group_size: int | None = None


class VirtualEngine:
    """One simulated engine (`FastEngine`) behind the live `Engine` and `WeightSync` protocols."""

    def __init__(self, engine: FastEngine, loop: VirtualLoop, sync_s: float, name: str,
                 samples: SampleLookup | None = None) -> None:
        self.engine, self.loop, self.sync_s, self.name = engine, loop, sync_s, name
        # the sample a request generates: its request is then the simulator's (its group's
        # prefix, its retained run, its first scheduling reported); without, the request's own
        self.samples = samples
        self.spec = engine.spec
        self._requests = request_builder(self.spec, None if samples is None else samples.group_size)
        self._next = 0
        self._pending: list[Request] = []
        self._transit: dict[int, list[Request]] = {}  # on their way (`client_overhead_s`)
        self._moving: list[tuple[float, Request]] = []  # migrated KV on its way (`kv_transfer`)
        self._n_sent = 0
        self._waiting: dict[int, tuple[asyncio.Future, GenerateRequest, float]] = {}
        self._scheduled: dict[int, float] = {}  # request id -> its first scheduling (reported)
        self.version: str | None = None
        loop.engines.append(self)

    # ---- what the virtual cluster and loop use
    def submit(self, request: GenerateRequest, keep_kv: bool = False) -> asyncio.Future:
        """Queue ``request`` now; the future gets its result when the engine ends it. With a
        sample to read, the request is the simulator's (`RequestBuilder`: ``keep_kv``, a
        resumed sample's KV comes along; a live HTTP engine re-prefills instead)."""
        rid = self._next
        self._next += 1
        if self.samples is not None:
            req = self._requests.build(self.samples.find(request), rid, request.max_new_tokens,
                                       request.priority, keep_kv)
        else:
            req = Request(rid, len(request.prompt_ids), request.max_new_tokens,
                          request.tokens_to_generate, priority=request.priority)
        wait = transfer_delay(self.spec, req.migrated) if req.migrated else 0.0
        if wait > 0:  # its KV crosses the pool first, as the simulator's send charges
            self._moving.append((wait, req))
        else:
            self._pending.append(req)
        fut = self.loop.create_future()
        self._waiting[rid] = (fut, request, self.loop.time())
        return fut

    def flush(self) -> None:
        """Hand the engine the requests queued since the last flush (one submission, as the
        simulator's `send` hands each engine its share of a batch), `client_overhead_s` later
        where the spec charges the client's own time per request."""
        if self._pending:
            reqs, self._pending = self._pending, []
            self._send(reqs, self.spec.client_overhead_s)
        if self._moving:  # one submission per transfer delay, as the simulator's send
            by_wait: dict[float, list[Request]] = {}
            for wait, req in self._moving:
                by_wait.setdefault(wait, []).append(req)
            self._moving = []
            for wait, reqs in by_wait.items():
                self._send(reqs, self.spec.client_overhead_s + wait)

    def _send(self, reqs: list[Request], delay: float) -> None:
        if delay > 0:
            self._n_sent += 1
            self._transit[self._n_sent] = reqs
            self.loop.call_at(self.loop.time() + delay, self._arrive, self._n_sent)
        else:
            self.engine.submit(reqs, self.loop.time())
            self._take_started()

    def room_at(self, now: float) -> int:
        """The engine's room less the input of requests on their way to it (as simulated)."""
        on_way = [r for reqs in self._transit.values() for r in reqs]
        return self.engine.room_at(now) - sum(r.input_len + r.shared for r in on_way)

    def _arrive(self, key: int) -> None:
        reqs = self._transit.pop(key, None)
        if reqs:  # unless an abort dropped them on their way
            self.engine.submit(reqs, self.loop.time())
            self._take_started()

    def step(self) -> None:
        """Carry out the engine's next event (the loop's clock is at it)."""
        comps = self.engine.advance()
        self._take_started()
        self._deliver(comps)

    def _take_started(self) -> None:
        """Keep the first schedulings the engine reported, for the results (`Timings.scheduled`)."""
        started = self.engine.started
        if started:
            self._scheduled.update((r.rid, r.started_s) for r in started)
            started.clear()

    def _deliver(self, comps: Sequence[Completion]) -> None:
        for c in comps:  # each ended at its own time (an abort's steps: before it landed)
            fut, req, t0 = self._waiting.pop(c.rid)
            reason = FinishReason(c.reason)
            timings = Timings(t0, None, c.time, self._scheduled.pop(c.rid, None))
            if not fut.done():
                fut.set_result(GenerateResult(f"{self.name}-{c.rid}", req, [_TOKEN] * c.tokens,
                                              reason, timings, prompt_tokens=len(req.prompt_ids),
                                              weight_version=self.version, worker=self.name))

    # ---- Engine
    async def generate(self, request: GenerateRequest,
                       on_progress: Callable[[Progress], None] | None = None) -> GenerateResult:
        return await self.submit(request)

    def stream(self, request: GenerateRequest) -> AsyncIterator[Progress | GenerateResult]:
        return stream_via_generate(self, request)

    async def abort_all(self) -> None:
        """Abort everything by the simulator's rule (`abort_engine`: at once with
        ``abort_steps`` -1, else once the step in flight and k more decode steps have run)."""
        self.flush()
        now = self.loop.time()
        if self._transit:  # requests on their way never reach the engine (no token generated)
            dropped = [r for reqs in self._transit.values() for r in reqs]
            self._transit.clear()
            self._deliver([Completion(r.rid, 0, "abort", now) for r in dropped])
        land, comps = abort_engine(self.engine, now, self.spec)
        self._take_started()
        if land > now:
            landed = self.loop.create_future()
            self.loop.call_at(land, landed.set_result, None)
            await landed
        self._deliver(comps)

    async def health(self) -> bool:
        return True

    async def server_info(self) -> ServerInfo:
        return ServerInfo(max_running_requests=self.spec.max_running,
                          kv_capacity_tokens=self.spec.kv_capacity)

    async def weight_version(self) -> str | None:
        return self.version

    async def close(self) -> None:
        return None

    # ---- WeightSync
    async def update_weights(self, version: str, path: str | None = None) -> None:
        self.version = version
        if self.spec.prefix_cache_flush:  # the new weights make every kept run stale
            self.flush()
            self.engine.flush_prefix_cache()

    async def pause(self) -> bool:
        """Stop generating for the modelled sync time (the simulator's pause until the sync ends);
        what was due by now ends as usual."""
        self.flush()
        now = self.loop.time()
        comps = self.engine.pause(now, now + self.sync_s)
        self._take_started()
        self._deliver(comps)
        return True

    async def resume(self) -> bool:
        return True  # the engine was planned to go on when the sync ends


class VirtualCluster(Cluster):
    """The live cluster whose requests reach their simulated engine the moment they are sent."""

    def generate(self, slot: Slot, request: GenerateRequest, *,  # type: ignore[override]
                 keep_kv: bool = False):
        """Not a coroutine function: queue the request now, return the coroutine of its result
        (``keep_kv``: the simulated engine takes the resumed sample's KV, as simulated)."""
        slot.started()
        fut = slot.engine.submit(request, keep_kv)  # type: ignore[attr-defined]
        return self._result(slot, fut)

    def most_room(self) -> Callable[[GenerateRequest], Slot]:
        """The simulator's rule (`Simulation._send_placed`): each engine's room at the send
        (`room_at`: free KV less its queue's input and the input on its way to it, with what
        was sent before on it), less what this send already put there (input plus max_new);
        ties to the lowest index."""
        live = self.alive
        if not live:
            return super().most_room()
        engines: list[VirtualEngine] = [sl.engine for sl in live]  # type: ignore[misc]
        for e in engines:
            e.flush()  # what earlier sends put on an engine is on it (as simulated) before a read
        now = engines[0].loop.time()
        rooms = [e.room_at(now) for e in engines]

        def choose(request: GenerateRequest) -> Slot:
            k = max(range(len(rooms)), key=rooms.__getitem__)
            rooms[k] -= len(request.prompt_ids) + request.max_new_tokens
            live[k].picked += 1
            return live[k]

        return choose

    async def _result(self, slot: Slot, fut: asyncio.Future) -> GenerateResult:
        res = await fut
        slot.ended(res)
        return res


class VirtualMeter(SimMeter):
    """The simulator's meter on the virtual engines (what was sent is on them before a read)."""

    __slots__ = ("virtual",)

    def __init__(self, engines: Sequence[VirtualEngine]) -> None:
        super().__init__([e.engine for e in engines])
        self.virtual = engines

    def read(self, now: float):
        for e in self.virtual:
            e.flush()
        return super().read(now)

    def new_window(self, now: float) -> None:
        for e in self.virtual:
            e.flush()
        super().new_window(now)


@dataclass
class VirtualRun:
    """A finished virtual-time live run: its result and the runtime (groups, records, faults)."""

    result: RunResult
    runtime: LiveRuntime


def run_virtual(
    scenario: Scenario,
    scheduler: str | Scheduler,
    *,
    seed: int | None = None,
    steps: int | None = None,
    settings: dict[str, Any] | None = None,
    engine_factory: EngineFactory = FastEngine,
    trace: Trace | None = None,
    vocab_size: int = 32_000,
) -> VirtualRun:
    """Run `scheduler` on `scenario` with the live driver on simulated engines in virtual time
    (the arguments of `aprilsim.sim.run.simulate`; the same groups for the same seed)."""
    policy = build_scheduler(scenario, scheduler, settings)
    loop = VirtualLoop()
    try:
        return loop.run_until_complete(_run(loop, scenario, policy, seed, steps, engine_factory,
                                            trace, vocab_size))
    finally:
        loop.close()


async def _run(loop: VirtualLoop, scenario: Scenario, policy: Scheduler, seed: int | None,
               steps: int | None, engine_factory: EngineFactory, trace: Trace | None,
               vocab_size: int) -> VirtualRun:
    spec, tm = scenario.engine_spec(), scenario.trainer_model()
    samples: dict[int, Sample] = {}

    def sample_of(request: GenerateRequest) -> Sample:
        uid = request.tag
        if uid not in samples:  # a group drawn since the last look
            samples.update((s.uid, s) for g in rt.groups.values() for s in g.samples)
        return samples[uid]  # type: ignore[index]

    slow = scenario.cluster.engine_slowdown or [1.0] * scenario.cluster.engines
    source = ReplaySource(scenario.workload_for(seed), vocab_size)
    engines = [VirtualEngine(engine_factory(slowed(spec, slow[i]), i),  # type: ignore[arg-type]
                             loop, tm.sync_s,
                             f"sim-{i}", SampleLookup(sample_of, source.group_size))
               for i in range(scenario.cluster.engines)]
    cluster = VirtualCluster(engines, progress_deadline_s=None)
    cluster.router = make_router(scenario.cluster.router)
    rt = LiveRuntime(
        source=source, cluster=cluster,
        scheduler=policy, batch_size=scenario.batch_size,
        steps=steps if steps is not None else scenario.steps,
        trainer=TrainerStandIn(replace(tm), clock=loop.time), trace=trace,
        clock=loop.time, meter=VirtualMeter(engines),
    )
    result = await rt.run()
    result.warmup_steps = scaled_warmup(scenario.warmup_steps, scenario.steps, len(result.steps))
    return VirtualRun(result, rt)

