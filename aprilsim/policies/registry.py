"""The scheduler registry: names -> classes, their knobs, and loading a user's own scheduler.

A scheduler class is a dataclass; its public fields are its knobs (set from a scenario's
`[schedulers.NAME]` table), and the first line of its docstring is its description. A class may
declare `variants`, knob settings worth running besides its defaults: `variants()` lists every
registered scheduler with each of them (what the test suites run). A user's class loads from a
module path: `--scheduler my_pkg.my_mod:MyScheduler`.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Any

from aprilsim.policies.april import AprilDSScheduler, AprilScheduler
from aprilsim.policies.async_april import AsyncAprilScheduler
from aprilsim.policies.async_one_step import AsyncOneStepScheduler
from aprilsim.policies.base import Scheduler
from aprilsim.policies.dynamic_sampling import DynamicSamplingScheduler
from aprilsim.policies.env_async import EnvAsyncScheduler
from aprilsim.policies.fully_async import FullyAsyncScheduler
from aprilsim.policies.seer import SeerHistoryScheduler, SeerScheduler
from aprilsim.policies.slime_dapo import SlimeDapoScheduler
from aprilsim.policies.sync import SyncScheduler, SyncTurnsScheduler
from aprilsim.policies.tail_batching import TailBatchingScheduler

REGISTRY: dict[str, type] = {}


def register(cls: type) -> type:
    """Add a scheduler class under its `name` (usable as a decorator)."""
    if not dataclasses.is_dataclass(cls) or not isinstance(getattr(cls, "name", None), str):
        raise TypeError(f"{cls!r}: a scheduler is a dataclass with a class attribute `name`")
    REGISTRY[cls.name] = cls
    return cls


for _cls in (
    SyncScheduler,
    SyncTurnsScheduler,
    AprilScheduler,
    AprilDSScheduler,
    AsyncOneStepScheduler,
    AsyncAprilScheduler,
    FullyAsyncScheduler,
    EnvAsyncScheduler,
    DynamicSamplingScheduler,
    SlimeDapoScheduler,
    TailBatchingScheduler,
    SeerScheduler,
    SeerHistoryScheduler,
):
    register(_cls)


@dataclass(frozen=True)
class Knob:
    name: str
    default: Any
    type: str


def knobs(cls: type) -> list[Knob]:
    """The public dataclass fields of a scheduler class: what a scenario may set."""
    out = []
    for f in dataclasses.fields(cls):
        if f.name.startswith("_") or not f.init:
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            continue  # state, not a knob (e.g. buffers)
        else:
            default = None
        out.append(Knob(f.name, default, str(f.type)))
    return out


def declared_variants(cls: type) -> tuple[dict[str, Any], ...]:
    """The knob settings `cls` itself declares in `variants` (a subclass states its own: the
    parent's are not inherited, its knobs may mean other things there)."""
    out = tuple(vars(cls).get("variants", ()))
    allowed = {k.name for k in knobs(cls)}
    for v in out:
        if not isinstance(v, dict) or not v or set(v) - allowed:
            raise TypeError(f"{cls.__name__}.variants: {v!r} must set some of its knobs "
                            f"{sorted(allowed)}")
    return out


def variants(*extra: str) -> list[tuple[str, dict[str, Any]]]:
    """Every registered scheduler by name, then each `extra` one (`module:Class`): its defaults
    (`{}`) followed by every variant its class declares. One list for the conformance, engine
    equivalence and live suites, so a new scheduler or variant reaches all of them."""
    out: list[tuple[str, dict[str, Any]]] = []
    for name in [*sorted(REGISTRY), *extra]:
        out.append((name, {}))
        out.extend((name, dict(v)) for v in declared_variants(resolve(name)))
    return out


def description(cls: type) -> str:
    """The first paragraph of the class docstring, on one line (a docstring wraps at 100
    columns; the listing wants the whole sentence)."""
    first = (cls.__doc__ or "").strip().split("\n\n", 1)[0]
    return " ".join(line.strip() for line in first.splitlines())


def resolve(name: str) -> type:
    """A registered name, or `module.path:ClassName` for a user's scheduler."""
    if name in REGISTRY:
        return REGISTRY[name]
    if ":" in name:
        mod_name, _, attr = name.partition(":")
        try:
            mod = importlib.import_module(mod_name)
        except ImportError as e:
            raise ValueError(f"cannot import scheduler module {mod_name!r}: {e}") from None
        cls = getattr(mod, attr, None)
        if cls is None:
            raise ValueError(f"module {mod_name!r} has no attribute {attr!r}")
        if not dataclasses.is_dataclass(cls) or not hasattr(cls, "handle"):
            raise ValueError(f"{name}: a scheduler is a dataclass with a handle(event, ctx) method")
        return cls
    from aprilsim.suggest import did_you_mean

    raise ValueError(f"unknown scheduler {name!r}{did_you_mean(name, REGISTRY)}; "
                     f"known: {', '.join(sorted(REGISTRY))}")


def make_scheduler(name: str, settings: dict[str, Any] | None = None) -> Scheduler:
    """Instantiate scheduler `name` with knob values from `settings` (unknown knobs: an error)."""
    cls = resolve(name)
    settings = dict(settings or {})
    allowed = {k.name for k in knobs(cls)}
    unknown = set(settings) - allowed
    if unknown:
        from aprilsim.suggest import did_you_mean

        first = sorted(unknown)[0]
        raise ValueError(
            f"schedulers.{name}: unknown knob(s) {sorted(unknown)}{did_you_mean(first, allowed)}; "
            f"known: {sorted(allowed)}"
        )
    from aprilsim.knob_types import check_knob_types  # strict types: "false" is no bool

    check_knob_types(cls, settings, name)
    return cls(**settings)


def describe(name: str) -> dict[str, Any]:
    """What `aprilsim schedulers` prints for one scheduler: name, mode, description, knobs."""
    cls = resolve(name)
    return {
        "name": name,
        "mode": getattr(cls, "mode", "colocated"),
        "description": description(cls),
        "knobs": [{"name": k.name, "default": k.default, "type": k.type} for k in knobs(cls)],
    }
