"""The conformance checks (`aprilsim.conformance`) through the live driver in virtual time.

Pass `run_under_live` as `check_scheduler(..., run=run_under_live)` to check a scheduler on both
drivers: the asyncio live driver over simulated engines (`real.runner.virtual`) must keep the
same invariants as the simulator. An adapter of its own, so that the virtual-time engines depend
on no check.
"""

from __future__ import annotations

from typing import Any

from aprilsim.config import Scenario
from aprilsim.conformance import ConformanceRun, recorder_for

from .virtual import run_virtual

__all__ = ["run_under_live"]


def run_under_live(scheduler: str | type, settings: dict[str, Any] | None, scenario: Scenario,
                   *, force_sample_events: bool = False, **build: Any) -> ConformanceRun:
    """`aprilsim.conformance.run_under_check` through the live driver in virtual time."""
    rec = recorder_for(scheduler, settings, force_sample_events=force_sample_events)
    run = run_virtual(scenario, rec, **build)  # type: ignore[arg-type]
    return ConformanceRun(run.runtime, rec, scenario, run.result)
