"""A run pauses full garbage collections, so it must leave no reference cycle behind (else memory
grows over a sweep) and must restore the collector's thresholds.

Freed by refcount means: once the run is over, the caller's variable is the only reference to the
`Simulation` (nothing it holds points back at it), so deleting that variable frees it. The tests
count references rather than take a weak one: a compiled (mypyc) `Simulation` takes no weak
reference, and the count says the same on both builds."""

from __future__ import annotations

import gc
import sys

import pytest

from aprilsim.config import scenario_from_dict
from aprilsim.policies.registry import REGISTRY
from aprilsim.sim.build import build_simulation

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
