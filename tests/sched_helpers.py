"""Shared by the conformance suite and the scheduler tests: small scenarios, a spy, one run."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from aprilsim.config import Scenario, scenario_from_dict
from aprilsim.conformance import BatchRecorder, ConformanceRun, run_under_check

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
    kv: int | None = None,
    router: str = "round_robin",
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
            "cluster": {"engines": engines, "router": router,
                        **({"kv_capacity": kv} if kv is not None else {})},
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


Spy = BatchRecorder  # the conformance module's recorder: it forwards `sample_events`
Run = ConformanceRun


def run(
    scenario: Scenario,
    name: str,
    settings: dict[str, Any] | None = None,
    *,
    force_sample_events: bool = False,
    engine_factory: Any = None,
) -> ConformanceRun:
    """Run scheduler `name` (knobs: `settings`, else the scenario's) under a BatchRecorder."""
    kw = {"engine_factory": engine_factory} if engine_factory is not None else {}
    knobs = settings if settings is not None else scenario.settings_for(name)
    return run_under_check(name, knobs, scenario, force_sample_events=force_sample_events, **kw)
