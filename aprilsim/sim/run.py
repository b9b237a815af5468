"""One call from a validated scenario to a finished run."""

from __future__ import annotations

from collections.abc import Callable

from aprilsim.config import Scenario
from aprilsim.engine.fast import FastEngine
from aprilsim.metrics.records import RunResult
from aprilsim.policies.registry import make_scheduler
from aprilsim.sim.runtime import EngineFactory, Simulation


def simulate(
    scenario: Scenario,
    scheduler: str,
    *,
    seed: int | None = None,
    steps: int | None = None,
    engine_factory: EngineFactory = FastEngine,
    progress: Callable[[int, int], None] | None = None,
) -> RunResult:
    """Run `scheduler` (a registered name or `module:Class`) on `scenario`.

    Every scheduler of a comparison sees the same workload stream (same seed), so differences come
    from scheduling alone. `progress(done, total)` is called after each training step.
    """
    sim = Simulation(
        workload=scenario.workload_for(seed),
        engine=scenario.engine_spec(),
        n_engines=scenario.cluster.engines,
        scheduler=make_scheduler(scheduler, scenario.settings_for(scheduler)),
        batch_size=scenario.batch_size,
        steps=steps if steps is not None else scenario.steps,
        trainer=scenario.trainer_model(),
        router=scenario.cluster.router,
        engine_factory=engine_factory,
        progress=progress,
    )
    return sim.run()
