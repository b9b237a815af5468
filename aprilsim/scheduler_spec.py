"""The one resolver from what a user writes to a scheduler: `NAME`, `module:Class`, `NAME@knob=v`.

Every command (`simulate`, `run`, `validate`, `sweep`, `tune`, `replay-validate`) and every API
that takes a scheduler by name (`aprilsim.simulate`, `build_simulation`, `build_runtime`,
`simulate_matched`) goes through `build_scheduler`, so one spelling means one scheduler everywhere,
and every way of setting a knob (a scenario's `[schedulers.NAME]`, `--set`, `-s NAME@knob=v`,
Python's `settings`) meets the same checks: known knobs, declared types, then the bounds of what
can be simulated (`aprilsim.scenario_limits.check_scheduler_limits`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from aprilsim.policies.base import Scheduler


class Scenario(Protocol):
    """What the resolver reads of a scenario (`aprilsim.config.Scenario`, not imported here: the
    scenario's own checks call the resolver)."""

    batch_size: int
    group_size: int
    steps: int
    max_response_len: int

    def settings_for(self, scheduler: str) -> dict[str, Any]: ...


def parse_knob_value(raw: str) -> Any:
    """`3` -> 3, `1.5` -> 1.5, `true`/`false` -> bool, anything else: the string itself."""
    if raw in ("true", "false"):
        return raw == "true"
    for conv in (int, float):
        try:
            return conv(raw)
        except ValueError:
            continue
    return raw


@dataclass(frozen=True)
class SchedulerSpec:
    """One scheduler as written: `label` names its run in tables, `name` is a registered name or
    `module:Class`, `knobs` the values the spelling sets (over the scenario's)."""

    label: str
    name: str
    knobs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, spec: str) -> SchedulerSpec:
        """``april`` -> (april, {}); ``april@ratio=1.5,x=2`` -> (april, {ratio: 1.5, x: 2})."""
        if not isinstance(spec, str):
            raise ValueError(f"scheduler {spec!r}: expected a name such as 'april'")
        name, _, rest = spec.strip().partition("@")
        knobs: dict[str, Any] = {}
        for part in filter(None, (p.strip() for p in rest.split(","))):
            key, eq, raw = part.partition("=")
            if not eq or not key.strip():
                raise ValueError(f"scheduler {spec!r}: expected NAME@knob=value[,knob=value]")
            knobs[key.strip()] = parse_knob_value(raw.strip())
        if not name.strip():
            raise ValueError(f"scheduler {spec!r}: no name")
        return cls(spec.strip(), name.strip(), knobs)


def parse_scheduler_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``april@ratio=1.5`` -> ("april", {"ratio": 1.5}): the name and the knobs it sets."""
    s = SchedulerSpec.parse(spec)
    return s.name, dict(s.knobs)


def scheduler_settings(scenario: Scenario, spec: str, settings: dict[str, Any] | None = None,
                       ) -> tuple[SchedulerSpec, dict[str, Any]]:
    """The parsed spec and the knob values its scheduler runs with: the scenario's
    `[schedulers.NAME]`, then the spec's `@knob=v`, then `settings` (each over the last)."""
    s = SchedulerSpec.parse(spec)
    return s, {**scenario.settings_for(s.name), **s.knobs, **(settings or {})}


def build_scheduler(scenario: Scenario, scheduler: str | Scheduler,
                    settings: dict[str, Any] | None = None) -> Scheduler:
    """A fresh scheduler for `scheduler` on `scenario` (a spec string), or an instance as is.

    ValueError (one line, naming `schedulers.NAME.knob`) for an unknown scheduler or knob, a value
    of the wrong type, or one past the bounds of what `scenario` can simulate."""
    if not isinstance(scheduler, str):
        if settings:
            raise ValueError("settings apply to a scheduler given by name, not to an instance")
        return scheduler
    from aprilsim.policies.registry import make_scheduler
    from aprilsim.scenario_limits import check_scheduler_limits

    spec, knobs = scheduler_settings(scenario, scheduler, settings)
    policy = make_scheduler(spec.name, knobs)  # unknown knobs and declared types first
    check_scheduler_limits(scenario, spec.name, knobs)
    return policy


def check_schedulers(scenario: Scenario, specs: Iterable[str]) -> list[SchedulerSpec]:
    """Each spec parsed and built once on `scenario` (so a bad one fails before any run), in
    order, duplicates dropped."""
    out = []
    for label in dict.fromkeys(specs):
        build_scheduler(scenario, label)
        out.append(SchedulerSpec.parse(label))
    return out


def run_name(scheduler: str | Scheduler, own: str) -> str:
    """The name a run of `scheduler` goes by in tables: the spec as written when it sets knobs
    (`april@ratio=1.5` beside `april`), else `own` (the scheduler's `name`)."""
    if isinstance(scheduler, str) and SchedulerSpec.parse(scheduler).knobs:
        return scheduler.strip()
    return own
