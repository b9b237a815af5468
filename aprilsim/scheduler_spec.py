"""`NAME@knob=value,...`: one scheduler at given knob settings, on any command's `-s`.

Shared by `aprilsim simulate` and `aprilsim validate`, so that `-s april@ratio=1.5` means the same
everywhere; the values are checked against the knobs' declared types when the scheduler is built.
"""

from __future__ import annotations

from typing import Any


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


def parse_scheduler_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``april`` -> ("april", {}); ``april@ratio=1.5,x=2`` -> ("april", {"ratio": 1.5, "x": 2}).

    Lets one run compare a scheduler at several settings (APRIL at two ratios).
    """
    name, _, rest = spec.partition("@")
    knobs: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, raw = part.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"scheduler {spec!r}: expected NAME@knob=value[,knob=value]")
        knobs[key.strip()] = parse_knob_value(raw.strip())
    if not name:
        raise ValueError(f"scheduler {spec!r}: no name")
    return name, knobs
