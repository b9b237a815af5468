"""Write a scenario dict as TOML (the subset scenarios use: tables, scalars, flat lists).

The core dependencies can read TOML (tomllib) but not write it; a scenario is small and regular
enough that a dedicated writer is shorter than a new dependency.
"""

from __future__ import annotations

import json
import math
from typing import Any


def _scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            raise ValueError(f"TOML cannot hold {v}")
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_scalar(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")


def dumps(data: dict[str, Any], header: str = "") -> str:
    """TOML text for `data`; keys whose value is None are left out (TOML has no null)."""
    lines: list[str] = [f"# {h}" if h else "#" for h in header.splitlines()]
    _table(data, [], lines)
    return "\n".join(lines).strip("\n") + "\n"


def _table(d: dict[str, Any], path: list[str], lines: list[str]) -> None:
    subs = {k: v for k, v in d.items() if isinstance(v, dict)}
    plain = {k: v for k, v in d.items() if not isinstance(v, dict) and v is not None}
    if path and (plain or not subs):
        lines += ["", "[" + ".".join(_key(p) for p in path) + "]"]
    lines += [f"{_key(k)} = {_scalar(v)}" for k, v in plain.items()]
    for k, v in subs.items():
        _table(v, [*path, k], lines)


def _key(k: str) -> str:
    return k if k.replace("_", "").replace("-", "").isalnum() else json.dumps(k)
