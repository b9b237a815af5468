"""What every importer returns, and the scenario it starts from."""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass, field
from typing import Any

from aprilsim.config import Scenario, default_scenario_text, scenario_from_dict
from aprilsim.metrics.warmup import scaled_warmup

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class UnmappedFlagsWarning(UserWarning):
    """Some launch settings have no aprilsim counterpart; the message lists every one of them."""


@dataclass
class ImportResult:
    """A scenario dict built from a launch config, and what could not be carried over.

    `data` validates with `aprilsim.config.scenario_from_dict`; `mapped` holds the source settings
    that were read, with their values as written; `unmapped` names every setting that was not
    (flags, or dotted YAML keys), so nothing is dropped silently; `notes` say where a mapping is
    an approximation; `warnings` say where the scenario had to borrow another setup's numbers
    (no preset for the launch's model, GPU or TP).
    """

    data: dict[str, Any]
    mapped: dict[str, Any] = field(default_factory=dict)
    unmapped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def warning(self, what: str) -> str | None:
        """The single warning line listing every unmapped setting, or None when all mapped."""
        if not self.unmapped:
            return None
        return (f"{len(self.unmapped)} {what} with no aprilsim counterpart (not simulated, not "
                f"exported): {', '.join(self.unmapped)}")

    def scenario(self, what: str = "settings") -> Scenario:
        """Validate `data`; warn once (UnmappedFlagsWarning) with every unmapped setting."""
        msg = self.warning(what)
        if msg:
            warnings.warn(msg, UnmappedFlagsWarning, stacklevel=2)
        return scenario_from_dict(self.data)


def fit_warmup(res: ImportResult) -> None:
    """The warm-up of an import that sets its own number of steps: the default's share of its
    steps when they are fewer (`scaled_warmup`, as `--steps` does), at least one step kept."""
    data = res.data
    field = Scenario.model_fields.get("warmup_steps")
    default = field.default if field is not None else 0
    steps, warmup = int(data.get("steps", 1)), int(data.get("warmup_steps", default))
    if field is None:
        return
    fitted = scaled_warmup(warmup, int(base_scenario().get("steps", steps)), steps)
    if fitted < warmup:
        data["warmup_steps"] = fitted
        res.notes.append(f"warmup_steps: {warmup} -> {data['warmup_steps']} for a run of "
                         f"{steps} steps (the same share left out as the default's)")


def base_scenario() -> dict[str, Any]:
    """The default scenario as a plain dict: what an import starts from and overrides.

    Lengths, prompt lengths, rewards, the engine cost preset and the trainer model are not in any
    launch config; they keep the default's values (see `aprilsim scenario`).
    """
    return tomllib.loads(default_scenario_text())
