"""The loop that drives one engine through a workload in virtual steps, for recording a golden
trace from a real scheduler and for replaying it through a model of that scheduler.

Each step `t`: the workload's aborts at `t` (in order), then its arrivals at `t` (in id order;
a resubmitted partial is sent only if its parent's abort caught it live, with the parent's
tokens at the abort as its prompt), then, if the engine has work, one engine step (schedule,
the stub model's tokens, update). With no work the step counter jumps to the next event.
Both sides run this same loop, so a trace and a replay see the same inputs at the same steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from aprilsim.engine.families.traces import StepRecord, Trace
from aprilsim.engine.families.workloads import Workload

MAX_STEPS = 2_000_000  # a workload that runs longer is a bug (a livelock), not a long trace


class EngineAdapter(Protocol):
    """One engine behind the driver: a real scheduler (the recorder) or a model (the replay)."""

    def add(self, rid: int, prompt: list[int], max_tokens: int, target: int) -> None:
        """Queue request `rid`; the stub stops it after `target` outputs (or at its cap)."""

    def abort(self, rid: int) -> tuple[list[int], int] | None:
        """Abort `rid`: its tokens (prompt + outputs) and output count if it was live."""

    def has_work(self) -> bool:
        """Whether the engine holds unfinished requests."""

    def step(self) -> StepRecord:
        """One scheduler step with the stub model's outputs."""


class Diverged(Exception):
    """A replayed step differs from the recorded one."""


@dataclass(slots=True)
class _Effective:
    """A sent request's cap and target (a partial's are its parent's less its outputs)."""

    max_tokens: int
    target: int


def drive(workload: Workload, engine: EngineAdapter,
          on_step: Callable[[int, StepRecord], None]) -> list[list[int | str]]:
    """Run `workload` through `engine`, calling `on_step(step, record)`; returns the events."""
    arrivals: dict[int, list[int]] = {}
    for rid, spec in enumerate(workload.requests):
        arrivals.setdefault(spec.arrive, []).append(rid)
    aborts: dict[int, list[int]] = {}
    for t, rid in workload.aborts:
        aborts.setdefault(t, []).append(rid)
    pending = sorted(set(arrivals) | set(aborts))
    run = _Inputs(workload, engine)
    t, steps = 0, 0
    while True:
        for rid in aborts.get(t, ()):
            run.abort(t, rid)
        for rid in arrivals.get(t, ()):
            run.send(t, rid)
        if engine.has_work():
            on_step(t, engine.step())
            t, steps = t + 1, steps + 1
            if steps > MAX_STEPS:
                raise RuntimeError(f"{workload.name}: over {MAX_STEPS} steps")
            continue
        later = [s for s in pending if s > t]
        if not later:
            return run.events
        t = later[0]


class _Inputs:
    """What the workload sends the engine: aborts (keeping what they caught) and requests."""

    def __init__(self, workload: Workload, engine: EngineAdapter) -> None:
        self.workload = workload
        self.engine = engine
        self.events: list[list[int | str]] = []
        self.caught: dict[int, tuple[list[int], int]] = {}
        self.sent: dict[int, _Effective] = {}

    def abort(self, t: int, rid: int) -> None:
        got = self.engine.abort(rid)
        if got is not None:
            self.caught[rid] = got
            self.events.append(["abort", t, rid, got[1]])

    def send(self, t: int, rid: int) -> None:
        spec = self.workload.requests[rid]
        if spec.continues < 0:
            self.sent[rid] = _Effective(spec.max_tokens, spec.target)
            self.engine.add(rid, spec.prompt_tokens(), spec.max_tokens, spec.target)
            return
        got = self.caught.get(spec.continues)
        if got is None:
            return  # the parent finished before its abort: nothing to resubmit
        tokens, made = got
        parent = self.sent[spec.continues]
        eff = _Effective(parent.max_tokens - made, parent.target - made)
        self.sent[rid] = eff
        self.engine.add(rid, list(tokens), eff.max_tokens, eff.target)
        self.events.append(["resubmit", t, rid, len(tokens), eff.max_tokens])


def record(trace: Trace, engine: EngineAdapter) -> Trace:
    """Fill `trace` (its workload) with `engine`'s steps and events."""
    trace.events = drive(trace.workload, engine, trace.add_step)
    return trace


@dataclass(slots=True)
class Agreement:
    """How a replay compared with a trace: steps that matched, and the first divergence."""

    steps: int
    matched: int
    divergence: str = ""

    @property
    def exact(self) -> bool:
        return not self.divergence and self.matched == self.steps


class _Checker:
    """Compares replayed steps with a trace's runs, step by step; raises `Diverged`."""

    def __init__(self, trace: Trace) -> None:
        self.runs = trace.runs
        self.i = 0  # run index
        self.k = 0  # step within the run
        self.matched = 0

    def __call__(self, step: int, rec: StepRecord) -> None:
        if self.i >= len(self.runs):
            raise Diverged(f"step {step}: the trace has ended, the model goes on: {rec}")
        run = self.runs[self.i]
        want = run.step + self.k
        if step != want or not run.record.same_plan(rec):
            raise Diverged(f"step {step}: model {rec}\n  trace step {want}: {run.record}")
        self.k += 1
        if self.k == run.count:
            if rec.free != run.record.free:
                raise Diverged(f"step {step}: free KV {rec.free}, trace {run.record.free}")
            self.i, self.k = self.i + 1, 0
        self.matched += 1


def replay(trace: Trace, engine: EngineAdapter) -> Agreement:
    """Drive `engine` (a model) through the trace's workload and compare every step and event."""
    check = _Checker(trace)
    total = trace.num_steps
    try:
        events = drive(trace.workload, engine, check)
    except Diverged as e:
        return Agreement(total, check.matched, str(e))
    if check.i != len(trace.runs):
        return Agreement(total, check.matched, "the model finished before the trace")
    if events != trace.events:
        diff = next((a, b) for a, b in zip(events + [[]], trace.events + [[]]) if a != b)
        return Agreement(total, check.matched, f"events differ: model {diff[0]}, "
                                               f"trace {diff[1]}")
    return Agreement(total, check.matched)
