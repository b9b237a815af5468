"""One place turns a validated scenario and a scheduler into a ready-to-run Simulation."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aprilsim.config import Scenario
from aprilsim.engine.fast import FastEngine
from aprilsim.metrics.trace import Trace
from aprilsim.policies.base import Scheduler
from aprilsim.scheduler_spec import build_scheduler
from aprilsim.sim.runtime import EngineFactory, Simulation


def build_simulation(
    scenario: Scenario,
    scheduler: str | Scheduler,
    *,
    seed: int | None = None,
    steps: int | None = None,
    settings: dict[str, Any] | None = None,
    engine_factory: EngineFactory = FastEngine,
    progress: Callable[[int, int], None] | None = None,
    trace: Trace | None = None,
    keep_groups: bool = True,
) -> Simulation:
    """A Simulation of `scheduler` on `scenario`.

    `scheduler` is a registered name, `module:Class`, `NAME@knob=v`, or an instance (used as is).
    A name takes its knobs from the scenario's `[schedulers.NAME]` table, updated by the spec's
    and then by `settings` (`aprilsim.scheduler_spec.build_scheduler`). Every scheduler sees
    the same groups for the same seed (common random numbers), so runs built here pair up.
    `keep_groups=False` lets the run release each group once its samples are trained or
    discarded (`sim.groups` then holds the live ones only): memory bounded in steps.
    """
    policy = build_scheduler(scenario, scheduler, settings)
    return Simulation(
        workload=scenario.workload_for(seed),
        engine=scenario.engine_spec(),
        n_engines=scenario.cluster.engines,
        scheduler=policy,
        batch_size=scenario.batch_size,
        steps=steps if steps is not None else scenario.steps,
        trainer=scenario.trainer_model(),
        router=scenario.cluster.router,
        engine_factory=engine_factory,
        progress=progress,
        trace=trace,
        keep_groups=keep_groups,
        slowdown=scenario.cluster.engine_slowdown,
    )
