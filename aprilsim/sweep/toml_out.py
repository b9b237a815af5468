"""Write a scenario dict as TOML (the tuned scenario of `aprilsim tune`).

The scenario's own shape only: scalars, lists of scalars, nested tables. Tables are written after
the plain keys of their parent, as TOML requires.
"""

from __future__ import annotations

import json
import math
from typing import Any


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"cannot write {v} to TOML")
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):  # a table inside a list: inline
        return "{ " + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + " }"
    raise ValueError(f"cannot write {type(v).__name__} to TOML")


def _key(k: str) -> str:
    ok = k and all(c.isalnum() or c in "_-" for c in k)
    return k if ok else json.dumps(k)


def dumps(data: dict[str, Any], header: str = "") -> str:
    """TOML text for `data` (None values are left out)."""
    out: list[str] = [f"# {line}" for line in header.splitlines()]

    def table(d: dict[str, Any], path: list[str]) -> None:
        plain = {k: v for k, v in d.items() if not isinstance(v, dict) and v is not None}
        subs = {k: v for k, v in d.items() if isinstance(v, dict)}
        if path and (plain or not subs):
            out.append("")
            out.append("[" + ".".join(_key(p) for p in path) + "]")
        for k, v in plain.items():
            out.append(f"{_key(k)} = {_value(v)}")
        for k, v in subs.items():
            table(v, [*path, k])

    table(data, [])
    return "\n".join(out).lstrip("\n") + "\n"
