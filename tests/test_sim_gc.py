"""A run turns automatic garbage collection off (collecting every `GC_STEPS` steps), so it must
leave no reference cycle behind (else memory grows over a sweep), must free the cycles a scheduler
makes every `GC_STEPS` steps, and must restore the collector.

Freed by refcount means: once the run is over, the caller's variable is the only reference to the
`Simulation` (nothing it holds points back at it), so deleting that variable frees it. The test
counts references rather than take a weak one: a compiled (mypyc) `Simulation` takes no weak
reference, and the count says the same on both builds."""

from __future__ import annotations

import gc
import sys
import weakref

import pytest

from aprilsim.config import scenario_from_dict
from aprilsim.engine.fast import FastEngine
from aprilsim.policies.registry import REGISTRY
from aprilsim.policies.sync import SyncScheduler
from aprilsim.sim.build import build_simulation
from aprilsim.sim.run import simulate
from aprilsim.sim.runtime import GC_STEPS

SMALL = {
    "name": "gc-check",
    "seed": 2,
    "steps": 3,
    "batch_size": 8,
    "group_size": 4,
    "max_response_len": 4096,
    "cluster": {"engines": 2, "preset": "qwen3-4b-h100-tp2", "kv_capacity": 20000},
    "lengths": {"family": "lognormal", "mu": 7.0, "sigma": 0.8},
}


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_finished_simulation_is_freed_by_refcount(name: str) -> None:
    sim = build_simulation(scenario_from_dict(SMALL), name)
    thresholds = gc.get_threshold()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        sim.run()
        assert gc.get_threshold() == thresholds
        probe = object()  # held by one variable only: the count that frees on `del`
        assert sys.getrefcount(sim) == sys.getrefcount(probe), (
            "a finished Simulation is kept alive by a reference cycle")
    finally:
        if was_enabled:
            gc.enable()


class _Node:
    """One end of a reference cycle (weak-referenceable, so a test can see it freed)."""

    def __init__(self) -> None:
        self.other: _Node | None = None


class _CycleMaker(SyncScheduler):
    """The sync baseline that leaves a two-object reference cycle behind at every event."""

    made: list = []

    def handle(self, event, ctx):
        a, b = _Node(), _Node()
        a.other, b.other = b, a
        self.made.append((ctx.step, weakref.ref(a)))
        return super().handle(event, ctx)


@pytest.mark.parametrize("fail", [False, True])
def test_a_run_restores_the_collector(fail: bool) -> None:
    """A run turns automatic collection off and back on (also when the run fails)."""
    sim = build_simulation(scenario_from_dict(SMALL), "sync")
    if fail:
        sim.scheduler.handle = lambda event, ctx: 1 / 0
    assert gc.isenabled()
    thresholds = gc.get_threshold()
    if fail:
        with pytest.raises(ZeroDivisionError):
            sim.run()
    else:
        sim.run()
    assert gc.isenabled() and gc.get_threshold() == thresholds


def test_cycles_a_scheduler_makes_are_freed_every_gc_steps() -> None:
    """With automatic collection off during a run, the cycles of a scheduler's steps are
    collected every `GC_STEPS` steps: memory stays bounded in steps."""
    steps = 2 * GC_STEPS + 1
    sim = build_simulation(scenario_from_dict({**SMALL, "steps": steps}), "sync")
    maker = _CycleMaker()
    maker.made = []
    sim.scheduler = sim.core.scheduler = maker
    checked = []

    def progress(done: int, total: int) -> None:  # after the step's collection, if any
        alive = sum(ref() is not None for step, ref in maker.made if step < done)
        checked.append((done, alive))

    sim._progress = progress
    assert gc.isenabled()
    sim.run()
    by_step = dict(checked)
    assert by_step[GC_STEPS] == 0 and by_step[2 * GC_STEPS] == 0  # collected there
    assert by_step[GC_STEPS + 1] > 0  # not collected in between: automatic collection was off
    assert gc.isenabled()


def test_simulate_frees_the_run_before_the_collector_comes_back() -> None:
    """`simulate` keeps automatic collection off until the finished Simulation is freed (by
    reference counting), so the first collection after the run finds none of the run's
    objects to traverse: each engine, owned by the Simulation alone, goes while it is off."""
    freed_while_enabled: list[bool] = []

    class Witness(FastEngine):
        def __del__(self) -> None:
            freed_while_enabled.append(gc.isenabled())

    assert gc.isenabled()
    simulate(scenario_from_dict(SMALL), "sync", engine_factory=Witness)
    assert freed_while_enabled == [False, False]  # both engines, before the collector is back
    assert gc.isenabled()
