"""One call from a validated scenario to a finished run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aprilsim.config import Scenario
from aprilsim.engine.fast import FastEngine
from aprilsim.metrics.records import RunResult
from aprilsim.metrics.trace import Trace
from aprilsim.metrics.warmup import scaled_warmup
from aprilsim.policies.base import Scheduler, SchedulerError
from aprilsim.scheduler_spec import run_name
from aprilsim.sim.build import build_simulation
from aprilsim.sim.runtime import EngineFactory, collection_paused


def simulate(
    scenario: Scenario,
    scheduler: str | Scheduler,
    *,
    seed: int | None = None,
    steps: int | None = None,
    settings: dict[str, Any] | None = None,
    engine_factory: EngineFactory = FastEngine,
    progress: Callable[[int, int], None] | None = None,
    trace: Trace | None = None,
) -> RunResult:
    """Run `scheduler` (a registered name, `module:Class`, `NAME@knob=v`, or an instance) on
    `scenario`; a spec that sets knobs names the run (`april@ratio=1.5` beside `april`).

    Every scheduler sees the same groups for the same seed (common random numbers: group k's
    prompt, lengths and rewards depend only on the seed and k), so differences between runs come
    from scheduling alone. `progress(done, total)` is called after each training step; pass a
    `Trace` to record every request, the engines' batch and KV curves and the trainer phases.
    The result's summary leaves out the scenario's `warmup_steps`. The run lets go of each group
    once its samples are trained or discarded (only the result is returned), so its memory is
    bounded in steps.
    """
    sim = build_simulation(
        scenario, scheduler, seed=seed, steps=steps, settings=settings,
        engine_factory=engine_factory, progress=progress, trace=trace, keep_groups=False,
    )
    # the collector stays off until the simulation is freed (by reference counting: it holds no
    # cycle), so that its first collection after the run does not scan the run's objects
    with collection_paused():
        run = sim.run()
        del sim
    run.scheduler = run_name(scheduler, run.scheduler)
    run.warmup_steps = scaled_warmup(scenario.warmup_steps, scenario.steps, len(run.steps))
    check_trained(run)
    return run


class NothingTrained(SchedulerError):
    """A run trained no sample: its setting is infeasible (`tune` marks it so and goes on)."""


def check_trained(run: RunResult) -> None:
    """NothingTrained when a run trained no sample in its summarised steps: a table row of
    zeros is not a result (a token budget of 1, a filter no group passes)."""
    if run.steps and sum(s.trained_samples for s in run.steps[run.warmup_steps:]) == 0:
        n = len(run.steps) - run.warmup_steps
        raise NothingTrained(
            f"{run.scheduler}: trained no samples in {n} step(s) after warm-up "
            f"({sum(s.generated_tokens for s in run.steps):,} tokens generated, "
            f"{sum(s.wasted_tokens for s in run.steps):,} wasted): its knobs leave nothing to "
            "train (e.g. token_budget too small, a filter no group passes)")
