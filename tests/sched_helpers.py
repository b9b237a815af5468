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

# The option settings the suites run besides each scheduler's defaults: one hand-kept list;
# `tests/test_conformance.py::test_every_knob_is_varied` fails when a registered scheduler's knob
# is varied by none of them.
OPTION_VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("april", {"recycle": False}),
    ("april", {"resume_order": "most_progress"}),
    ("april", {"resume_order": "oldest_version", "ratio": 1.5}),
    ("april", {"max_staleness": 1, "stale_action": "complete"}),
    ("april", {"max_staleness": 2, "stale_action": "discard"}),
    ("april", {"token_budget": 600}),
    ("april", {"max_new_groups": 2.0}),
    ("april", {"surplus": "recycle", "mask_offpolicy": True}),
    ("slime_dapo", {"refill": "one_for_one", "surplus": "recycle", "mask_offpolicy": True}),
    ("async_april", {"dynamic_filter": True}),
    ("april_ds", {"token_budget": 800, "resume_order": "most_progress"}),
    ("april_ds", {"std_threshold": 0.05}),
    ("fully_async", {"eta": 0, "interrupt": True}),
    ("fully_async", {"eta": 1, "interrupt": False}),
    ("fully_async", {"eta": 2, "interrupt": True, "inflight_ratio": 1.0}),
    ("dynamic_sampling", {"gen_batch_size": 3, "on_cap": "train", "max_rounds": 2}),
    ("dynamic_sampling", {"std_threshold": 0.05, "on_cap": "train"}),
    ("tail_batching", {"prompt_ratio": 1.5, "extra_responses": 1, "long_round_size": 3}),
    ("seer", {"hold": True, "route": "router", "chunk": 300}),
    ("seer", {"chunk": 0, "probe": False}),
    ("seer_history", {"chunk": 500, "hold": True}),
]


def registered() -> list[tuple[str, dict[str, Any]]]:
    """Every registered scheduler with its defaults (from the registry), and the example user one."""
    from aprilsim.policies.registry import REGISTRY

    return [(name, {}) for name in sorted(REGISTRY)] + [(USER_SCHEDULER, {})]


def every_variant() -> list[tuple[str, dict[str, Any]]]:
    """`registered()` and every option variant: what the conformance suites run."""
    return registered() + OPTION_VARIANTS


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
    return _small(engines=engines, batch=batch, group=group, max_len=max_len, steps=steps, seed=seed,
                  rewards=(alpha, beta), schedulers=schedulers,
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
