"""The length-model file: what `aprilsim fit --out model.toml` writes and a scenario can reference.

Format (TOML)::

    max_len = 2000              # optional: the cap the data was censored at
    prompt_share = 0.25         # optional: share of log-length variance between prompts
    [lengths]                   # required: a LengthModel.to_dict()
    family = "lognormal"
    mu = 5.6
    sigma = 1.1
    [drift]                     # optional: {kind="linear", slope=...} or {kind="table", ...}
    kind = "table"
    steps = [0, 100]
    mean_lengths = [700, 900]
    [fit]                       # optional: provenance and goodness of fit; ignored by the simulator
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aprilsim.workload.drift import Drift, LinearDrift, NoDrift, TableDrift
from aprilsim.workload.lengths import LengthModel, length_model_from_dict

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

KNOWN_KEYS = {"max_len", "prompt_share", "lengths", "drift", "fit"}


@dataclass(frozen=True)
class ModelFile:
    lengths: LengthModel
    max_len: int | None = None
    prompt_share: float | None = None
    drift: Drift | None = None
    fit: dict[str, Any] | None = None


DRIFT_KEYS = {"none": (), "linear": ("slope",), "table": ("steps", "mean_lengths")}


def _numbers(value: Any, key: str) -> tuple[float, ...]:
    """`value` as finite numbers (a list, or one number); ValueError naming `key` otherwise."""
    items = value if isinstance(value, list) else [value]
    if not items or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                            and math.isfinite(v) for v in items):
        raise ValueError(f"{key}: expected finite numbers, got {value!r}")
    return tuple(float(v) for v in items)


def drift_from_dict(d: Any) -> Drift:
    """A drift from its table, strictly: `kind` (none, linear, table) is required, and each kind
    takes its own keys only (`slope`; `steps` and `mean_lengths`), as finite numbers. A table
    without `kind` or with a key of another kind no longer means "no drift" silently."""
    if not isinstance(d, dict):
        raise ValueError(f"expected a table with kind = \"linear\" or \"table\", got {d!r}")
    if "kind" not in d:
        known = {"kind", *(k for keys in DRIFT_KEYS.values() for k in keys)}
        for key, value in d.items():
            if key not in known:
                shown = "table" if isinstance(value, dict) else "key"
                raise ValueError(f"{key}: a drift has no such {shown}; its keys: kind (none, "
                                 "linear, table), slope, steps, mean_lengths")
        raise ValueError("kind: missing; one of none, linear (slope), table (steps, "
                         "mean_lengths)")
    kind = d["kind"]
    if kind not in DRIFT_KEYS:
        raise ValueError(f"kind: unknown drift kind {kind!r} (none, linear, table)")
    takes = DRIFT_KEYS[kind]
    for key, value in d.items():
        if key != "kind" and key not in takes:
            shown = "table" if isinstance(value, dict) else "key"
            raise ValueError(f"{key}: a {kind} drift has no such {shown}; its keys: kind"
                             + "".join(f", {k}" for k in takes))
    missing = [k for k in takes if k not in d]
    if missing:
        raise ValueError(f"{missing[0]}: missing; a {kind} drift needs {', '.join(takes)}")
    if kind == "linear":
        if isinstance(d["slope"], list):
            raise ValueError(f"slope: expected one finite number, got {d['slope']!r}")
        return LinearDrift(_numbers(d["slope"], "slope")[0])
    if kind == "table":
        return TableDrift(_numbers(d["steps"], "steps"), _numbers(d["mean_lengths"],
                                                                  "mean_lengths"))
    return NoDrift()


def drift_to_dict(drift: Drift) -> dict[str, Any]:
    if isinstance(drift, LinearDrift):
        return {"kind": "linear", "slope": drift.slope}
    if isinstance(drift, TableDrift):
        return {"kind": "table", "steps": list(drift.steps),
                "mean_lengths": list(drift.mean_lengths)}
    return {"kind": "none"}


def read_model_file(path: str | Path) -> ModelFile:
    """Parse a model file; raises ValueError with a one-line message on bad content."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"length model file not found: {path}") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: not valid TOML ({e})") from None
    unknown = set(data) - KNOWN_KEYS
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {sorted(unknown)}")
    if "lengths" not in data:
        raise ValueError(f"{path}: missing [lengths] table")
    return ModelFile(
        lengths=length_model_from_dict(data["lengths"]),
        max_len=int(data["max_len"]) if "max_len" in data else None,
        prompt_share=float(data["prompt_share"]) if "prompt_share" in data else None,
        drift=drift_from_dict(data["drift"]) if "drift" in data else None,
        fit=data.get("fit"),
    )


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(float(v)) if isinstance(v, float) else str(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def _table(name: str, d: dict[str, Any]) -> list[str]:
    lines = [f"[{name}]"]
    nested = {k: v for k, v in d.items() if isinstance(v, dict)}
    lines += [f"{k} = {_toml_value(v)}" for k, v in d.items()
              if not isinstance(v, dict) and v is not None]
    for k, v in nested.items():
        lines += [""] + _table(f"{name}.{k}", v)
    return lines


def write_model_file(path: str | Path, mf: ModelFile) -> None:
    """Write `mf` in the format above (a small writer: scalars, lists and nested tables)."""
    lines = ["# aprilsim length model (aprilsim fit --out); reference it from a scenario"]
    if mf.max_len is not None:
        lines.append(f"max_len = {int(mf.max_len)}")
    if mf.prompt_share is not None:
        lines.append(f"prompt_share = {float(mf.prompt_share)!r}")
    lines += [""] + _table("lengths", mf.lengths.to_dict())
    if mf.drift is not None:
        lines += [""] + _table("drift", drift_to_dict(mf.drift))
    if mf.fit:
        lines += [""] + _table("fit", mf.fit)
    Path(path).write_text("\n".join(lines) + "\n")
