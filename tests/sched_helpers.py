"""Shared by the conformance suite and the scheduler tests: small scenarios, a spy, one run."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aprilsim.config import Scenario, scenario_from_dict
from aprilsim.metrics.records import RunResult
from aprilsim.policies.base import Action, CloseBatch, Context, Event
from aprilsim.policies.registry import make_scheduler
from aprilsim.sim.build import build_simulation
from aprilsim.sim.runtime import Simulation
from aprilsim.types import Group

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))

USER_SCHEDULER = "my_scheduler:EarlyStopScheduler"


def small_scenario(
    *,
    engines: int = 2,
    batch: int = 6,
    group: int = 4,
    max_len: int = 3072,
    steps: int = 5,
    seed: int = 0,
    alpha: float = 0.5,
    beta: float = 0.5,
    schedulers: dict[str, dict[str, Any]] | None = None,
) -> Scenario:
    """A few seconds of simulated cluster: long-tailed lengths, Beta(alpha, beta) pass rates."""
    return scenario_from_dict(
        {
            "name": "small",
            "seed": seed,
            "steps": steps,
            "batch_size": batch,
            "group_size": group,
            "max_response_len": max_len,
            "cluster": {"engines": engines},
            "trainer": {"base_s": 1.0, "per_token_s": 1e-5, "sync_s": 0.5},
            "lengths": {
                "family": "lognormal_mixture",
                "weights": [0.7, 0.3],
                "mus": [5.7, 7.3],  # ~300 and ~1,500 tokens
                "sigmas": [0.6, 0.7],
            },
            "prompts": {"family": "lognormal", "mu": 4.5, "sigma": 0.5, "max_len": 512},
            "workload": {"rewards": {"alpha": alpha, "beta": beta, "difficulty_length_corr": 0.5}},
            "schedulers": schedulers or {},
        }
    )


@dataclass
class Spy:
    """Wraps a scheduler and records every batch it closes (the runtime sees the same object)."""

    inner: Any
    batches: list[tuple[Group, ...]] = field(default_factory=list)

    force_sample_events: bool = False  # deliver SampleFinished even if the scheduler opts out

    def __post_init__(self) -> None:
        self.name = self.inner.name
        self.mode = self.inner.mode
        # forward the opt-out, so the production path (no SampleFinished events) is the one tested
        self.sample_events = self.force_sample_events or getattr(self.inner, "sample_events", True)

    def handle(self, event: Event, ctx: Context) -> list[Action]:
        actions = list(self.inner.handle(event, ctx))
        for a in actions:
            if isinstance(a, CloseBatch):
                self.batches.append(a.groups)
        return actions

    def step_stats(self) -> dict[str, float]:
        return self.inner.step_stats()


@dataclass
class Run:
    result: RunResult
    sim: Simulation
    spy: Spy
    scenario: Scenario


def run(
    scenario: Scenario,
    name: str,
    settings: dict[str, Any] | None = None,
    *,
    force_sample_events: bool = False,
    engine_factory: Any = None,
) -> Run:
    sched = make_scheduler(name, settings if settings is not None else scenario.settings_for(name))
    spy = Spy(sched, force_sample_events=force_sample_events)
    kw = {"engine_factory": engine_factory} if engine_factory is not None else {}
    sim = build_simulation(scenario, spy, **kw)  # type: ignore[arg-type]
    return Run(sim.run(), sim, spy, scenario)
