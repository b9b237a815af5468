"""One call from a scenario, a scheduler and a cluster of engines to a finished live run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from aprilsim.config import Scenario
from aprilsim.engine.router import make_router
from aprilsim.metrics.records import RunResult
from aprilsim.metrics.trace import Trace
from aprilsim.metrics.warmup import clamp_warmup
from aprilsim.policies.base import Scheduler
from aprilsim.policies.registry import make_scheduler
from real.protocol import SamplingParams

from .cluster import Cluster, Fault
from .runtime import LiveRuntime
from .source import FreeSource, LiveSource, ReplaySource
from .trainer import TrainerStandIn, TrainFn


@dataclass
class LiveRun:
    """A finished (or interrupted) live run: the records, the faults met, and runner figures."""

    result: RunResult | None
    runtime: LiveRuntime
    faults: list[Fault] = field(default_factory=list)

    @property
    def overhead_per_request_s(self) -> float:
        rt = self.runtime
        return rt.overhead_s / rt.requests if rt.requests else 0.0


def make_policy(scenario: Scenario, scheduler: str | Scheduler) -> Scheduler:
    """A registered name or module:Class with the scenario's knobs, or an instance as is."""
    if isinstance(scheduler, str):
        return make_scheduler(scheduler, scenario.settings_for(scheduler))
    return scheduler


def build_runtime(
    scenario: Scenario,
    scheduler: str | Scheduler,
    cluster: Cluster,
    *,
    vocab_size: int,
    seed: int | None = None,
    steps: int | None = None,
    scale: float = 1.0,
    source: LiveSource | None = None,
    train_fn: TrainFn | None = None,
    checkpoint: str | None = None,
    temperature: float = 1.0,
    progress: Callable[[int, int], None] | None = None,
    trace: Trace | None = None,
    stall_s: float = 30.0,
) -> LiveRuntime:
    """The live counterpart of ``aprilsim.sim.build.build_simulation``.

    Replay mode unless ``source`` (e.g. a :class:`FreeSource`) is given. ``scale`` multiplies
    every length of the workload and the trainer's fixed times (``base_s``, ``sync_s``); the
    per-token training time applies to the scaled tokens, so training keeps its share of a step.
    """
    policy = make_policy(scenario, scheduler)
    cluster.router = make_router(scenario.cluster.router)  # a fresh router per run, as simulated
    if source is None:
        source = ReplaySource(scenario.workload_for(seed), vocab_size, scale,
                              SamplingParams(temperature=temperature))
    tm = scenario.trainer_model()
    tm = replace(tm, base_s=tm.base_s * scale, sync_s=tm.sync_s * scale)
    return LiveRuntime(
        source=source, cluster=cluster, scheduler=policy, batch_size=scenario.batch_size,
        steps=steps if steps is not None else scenario.steps,
        trainer=TrainerStandIn(tm, train_fn, checkpoint), progress=progress, trace=trace,
        stall_s=stall_s,
    )


async def run_live(scenario: Scenario, scheduler: str | Scheduler, cluster: Cluster,
                   **kw: Any) -> LiveRun:
    """Run ``scheduler`` on ``cluster``; the summary leaves out the scenario's warm-up steps."""
    rt = build_runtime(scenario, scheduler, cluster, **kw)
    result = await rt.run()
    result.warmup_steps = clamp_warmup(scenario.warmup_steps, len(result.steps))
    return LiveRun(result, rt, list(rt.faults))


__all__ = ["FreeSource", "LiveRun", "ReplaySource", "build_runtime", "make_policy", "run_live"]
