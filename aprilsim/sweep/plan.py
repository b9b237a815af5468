"""What a sweep runs: points (a value for each swept key), schedulers and seeds, as runs.

A *point* is one combination of the swept values; a *run* is one simulation (point, scheduler,
seed); a *row* of the results is one run. Runs that cannot differ are simulated once: a scheduler
only reads its own `[schedulers.NAME]` table, so `sync` at every APRIL ratio is the same run
(common random numbers make it so) and its result is copied to every point's row.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from aprilsim.config import Scenario
from aprilsim.scheduler_spec import SchedulerSpec
from aprilsim.sweep.keys import Axis, apply, scenario_dict, validated


def canonical(obj: Any) -> str:
    """Stable JSON text: the identity of points, runs and whole sweeps."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class Point:
    """One combination of swept values, as (dotted key, value) pairs in axis order."""

    overrides: tuple[tuple[str, Any], ...]

    @property
    def id(self) -> str:
        return canonical([[k, v] for k, v in self.overrides])

    def values(self) -> dict[str, Any]:
        return dict(self.overrides)


@dataclass(frozen=True)
class Run:
    """One simulation: the unit of work sent to a worker."""

    point_id: str
    overrides: tuple[tuple[str, Any], ...]
    scheduler: str
    seed: int


@dataclass
class Plan:
    """A validated sweep: base scenario (steps and warm-up applied), axes, schedulers, seeds."""

    base: dict[str, Any]
    base_dir: str
    axes: list[Axis]
    schedulers: list[str]
    seeds: list[int]
    points: list[Point] = field(default_factory=list)

    @classmethod
    def build(
        cls,
        scenario: Scenario,
        axes: list[Axis],
        schedulers: list[str] | None = None,
        seeds: int | list[int] = 1,
    ) -> Plan:
        """Expand the axes into points and validate every point (ScenarioError naming the key)."""
        base = scenario_dict(scenario)
        names = list(dict.fromkeys(schedulers or scenario.compare))
        seed_list = (
            [scenario.seed + i for i in range(seeds)] if isinstance(seeds, int) else list(seeds)
        )
        if not seed_list:
            raise ValueError("a sweep needs at least one seed")
        seen: set[str] = set()
        for keys, _ in axes:
            for k in keys:
                if k in seen:
                    raise ValueError(f"{k}: swept twice")
                seen.add(k)
        points = []
        for combo in itertools.product(*(values for _, values in axes)):
            pairs = tuple((k, v) for (keys, _), v in zip(axes, combo) for k in keys)
            points.append(Point(pairs))
        plan = cls(base, scenario.base_dir, axes, names, seed_list, points)
        plan.check_points(points)
        return plan

    def check_points(self, points: list[Point]) -> None:
        """Validate each point like a scenario file, and its knobs for every scheduler."""
        from aprilsim.config import ScenarioError
        from aprilsim.scheduler_spec import build_scheduler

        for p in points:
            sc = validated(self.base, p.overrides, self.base_dir)
            for name in self.schedulers:  # a point must be runnable by every scheduler
                try:
                    build_scheduler(sc, name)
                except (ValueError, TypeError) as e:
                    raise ScenarioError(str(e)) from None

    @property
    def keys(self) -> list[str]:
        return [k for keys, _ in self.axes for k in keys]

    def fingerprint(self) -> str:
        """What must match for a results file to be resumed: the base scenario (steps, warm-up)
        and the aprilsim version. Unreleased changes to the simulator are not seen: delete the
        journal after changing the simulator's code."""
        from aprilsim._version import __version__

        key = canonical([self.base, self.base_dir, __version__])
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    def runs(self) -> list[Run]:
        """Every (point, scheduler, seed), points outermost so a worker's cache stays warm."""
        return [
            Run(p.id, p.overrides, name, seed)
            for p in self.points
            for seed in self.seeds
            for name in self.schedulers
        ]

    def run_key(self, run: Run) -> str:
        """Identity of what a run simulates: equal keys give equal results (run once, copy rows)."""
        d = apply(self.base, run.overrides)
        d.pop("name", None)
        d.pop("compare", None)
        name = SchedulerSpec.parse(run.scheduler).name  # `april@ratio=2` reads [schedulers.april]
        d["schedulers"] = {name: d.get("schedulers", {}).get(name, {})}
        return canonical([d, run.scheduler, run.seed])
