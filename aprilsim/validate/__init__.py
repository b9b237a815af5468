"""Sim-vs-live validation (`aprilsim validate`): pure comparison and report code.

The live side (starting engines, running schedulers, reading iteration logs) lives in
``real/validate.py``; this package imports neither torch nor aiohttp, so the comparison, the cost
fit and the report can be tested on recorded runs.
"""

from __future__ import annotations

from .compare import SchedulerComparison, compare_runs, gains, ranking_preserved
from .costfit import CostFit, fit_iterations
from .scaled import ScaledWorkload, parse_scheduler_spec, simulate_matched

__all__ = [
    "CostFit",
    "ScaledWorkload",
    "SchedulerComparison",
    "compare_runs",
    "fit_iterations",
    "gains",
    "parse_scheduler_spec",
    "ranking_preserved",
    "simulate_matched",
]
