"""Shared by the conformance suite and the scheduler tests: small scenarios, a spy, one run."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from aprilsim.config import Scenario
from aprilsim.conformance import BatchRecorder, ConformanceRun, run_under_check
from aprilsim.conformance import small_scenario as _small

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))

USER_SCHEDULER = "my_scheduler:EarlyStopScheduler"


def every_variant() -> list[tuple[str, dict[str, Any]]]:
    """Every registered scheduler and the example user one, each with its defaults and then every
    option variant its class declares (`registry.variants`): what the conformance, whole-run
    equivalence and live suites run; `tests/test_conformance.py::test_every_knob_is_varied` fails
    when a registered scheduler's knob is varied by none."""
    from aprilsim.policies.registry import variants

    return variants(USER_SCHEDULER)


def variant_ids(cases: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Test ids: `name` or `name-knob=value-...`."""
    return [f"{n}-{'-'.join(f'{k}={v}' for k, v in s.items())}" if s else n for n, s in cases]


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
    return _small(engines=engines, batch=batch, group=group, max_len=max_len, steps=steps,
                  seed=seed, rewards=(alpha, beta), schedulers=schedulers,
                  cluster={"router": router, **({"kv_capacity": kv} if kv is not None else {})})


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
