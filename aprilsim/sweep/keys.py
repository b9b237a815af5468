"""Dotted scenario keys: parsing `--grid`/`--range`/`--knob` specs and applying values to a
scenario.

A KEY is a dotted path into the scenario as a dict (`schedulers.april.ratio`, `cluster.engines`,
`lengths.mus.1` for the second list element). Values are applied to
`scenario.model_dump(mode="json", exclude_none=True)` and the result is validated by
`scenario_from_dict`, so a bad key or value fails exactly like a bad scenario file: a
`ScenarioError` with one line naming the key. Several keys joined by `+` take the same value
(`schedulers.april.ratio+schedulers.april_ds.ratio=1,2`): a linked axis.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from aprilsim.config import Scenario, ScenarioError, scenario_from_dict

Axis = tuple[tuple[str, ...], list[Any]]  # linked keys, their common values


def scenario_dict(sc: Scenario) -> dict[str, Any]:
    """The scenario as a plain dict, the form keys apply to (base_dir kept aside by callers)."""
    d = sc.model_dump(mode="json", exclude_none=True)
    d.pop("base_dir", None)
    return d


def scheduler_reads(scheduler: str, key: str) -> bool:
    """Whether a run of `scheduler` depends on dotted `key`: `schedulers.X.*` is read by X alone
    (sync's runs are the same at every `schedulers.april.ratio`); every other key by all."""
    from aprilsim.scheduler_spec import SchedulerSpec

    parts = key.split(".")
    name = SchedulerSpec.parse(scheduler).name
    return not (len(parts) >= 2 and parts[0] == "schedulers" and parts[1] != name)


def parse_value(text: str) -> Any:
    """A command-line value: JSON when it parses (numbers, true/false, lists, quoted strings),
    else a string."""
    t = text.strip()
    try:
        return json.loads(t)
    except ValueError:
        low = t.lower()
        if low in ("true", "false"):
            return low == "true"
        return t


def split_values(text: str) -> list[str]:
    """Split on commas that are not inside brackets: `1,2,[3,4]` -> ['1', '2', '[3,4]']."""
    out, depth, cur = [], 0, []
    for ch in text:
        if ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return [x for x in (s.strip() for s in out) if x]


def _split_spec(spec: str, flag: str) -> tuple[tuple[str, ...], str]:
    key, sep, rest = spec.partition("=")
    keys = tuple(k.strip() for k in key.split("+"))
    if not sep or not all(keys) or not rest.strip():
        raise ScenarioError(f"{flag} {spec!r}: expected KEY=VALUES")
    if "seed" in keys:
        raise ScenarioError(f"{flag} {spec!r}: the seed is not a swept key; give --seeds N (the "
                            "scenario's seed and the N-1 after it; set the first with `seed` "
                            "in the scenario)")
    return keys, rest


def parse_grid(spec: str) -> Axis:
    """`KEY=V1,V2,...` (or `K1+K2=V1,...`) -> an axis."""
    keys, rest = _split_spec(spec, "--grid")
    values = [parse_value(v) for v in split_values(rest)]
    if not values:
        raise ScenarioError(f"--grid {spec!r}: no values")
    return keys, values


def _number(text: str, what: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise ScenarioError(f"{what}: {text!r} is not a number") from None
    if not math.isfinite(v):
        raise ScenarioError(f"{what}: {text!r} is not finite")
    return v


def is_integer_key(base: dict[str, Any], key: str) -> bool | None:
    """Whether the scenario (or the scheduler's knob default) holds an integer at `key`.

    None when neither says: the key is unset and is no scheduler knob.
    """
    cur: Any = base
    for part in key.split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif (isinstance(cur, list) and part.lstrip("-").isdigit()
              and -len(cur) <= int(part) < len(cur)):
            cur = cur[int(part)]
        else:
            cur = None
            break
    if cur is None:
        parts = key.split(".")
        if len(parts) == 3 and parts[0] == "schedulers":
            from aprilsim.policies.registry import knobs, resolve

            try:
                defaults = {k.name: k for k in knobs(resolve(parts[1]))}
            except ValueError:
                return None
            k = defaults.get(parts[2])
            if k is None:
                return None
            if k.default is None:
                return "int" in k.type and "float" not in k.type
            cur = k.default
        else:
            return None
    return isinstance(cur, int) and not isinstance(cur, bool)


def integer_axis(base: dict[str, Any], keys: tuple[str, ...], literal_ints: bool) -> bool:
    """An axis is integer when LO and HI are written as integers and the key holds integers."""
    if not literal_ints:
        return False
    known = [is_integer_key(base, k) for k in keys]
    return all(k is not False for k in known)


def parse_range(spec: str, base: dict[str, Any] | None = None) -> Axis:
    """`KEY=LO:HI:N` -> N evenly spaced values (integers when LO and HI are integers and the
    scenario holds an integer at KEY)."""
    keys, rest = _split_spec(spec, "--range")
    parts = rest.split(":")
    if len(parts) != 3:
        raise ScenarioError(f"--range {spec!r}: expected KEY=LO:HI:N")
    lo, hi = (_number(p, f"--range {keys[0]}") for p in parts[:2])
    try:
        n = int(parts[2])
    except ValueError:
        raise ScenarioError(f"--range {keys[0]}: N {parts[2]!r} is not an integer") from None
    if n < 1:
        raise ScenarioError(f"--range {keys[0]}: N must be >= 1")
    literal = _is_int(parts[0]) and _is_int(parts[1])
    integer = integer_axis(base, keys, literal) if base is not None else literal
    return keys, linspace(lo, hi, n, integer=integer)


def parse_knob(spec: str, base: dict[str, Any] | None = None
               ) -> tuple[tuple[str, ...], float, float, bool]:
    """`KEY=LO:HI` for `aprilsim tune` -> (keys, lo, hi, integer), integer as for `parse_range`."""
    keys, rest = _split_spec(spec, "--knob")
    parts = rest.split(":")
    if len(parts) != 2:
        raise ScenarioError(f"--knob {spec!r}: expected KEY=LO:HI")
    lo, hi = (_number(p, f"--knob {keys[0]}") for p in parts)
    if hi < lo:
        raise ScenarioError(f"--knob {keys[0]}: HI {hi:g} is below LO {lo:g}")
    literal = _is_int(parts[0]) and _is_int(parts[1])
    return keys, lo, hi, integer_axis(base, keys, literal) if base is not None else literal


def _is_int(text: str) -> bool:
    try:
        int(text.strip())
        return True
    except ValueError:
        return False


def linspace(lo: float, hi: float, n: int, *, integer: bool = False) -> list[Any]:
    """n values from lo to hi; integer axes are rounded and de-duplicated, floats rounded to 6
    digits."""
    xs = np.linspace(lo, hi, n) if n > 1 else np.array([lo])
    if integer:
        return list(dict.fromkeys(int(round(x)) for x in xs))
    return [float(round(x, 6)) for x in xs]


def set_path(d: dict[str, Any], key: str, value: Any) -> None:
    """Set dotted `key` in the nested dict `d` in place, creating tables on the way."""
    parts = key.split(".")
    cur: Any = d
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        where = ".".join(parts[: i + 1])
        if isinstance(cur, list):
            try:
                idx = int(part)
            except ValueError:
                raise ScenarioError(f"{where}: {parts[i - 1]} is a list; "
                                    "index it by number") from None
            if not -len(cur) <= idx < len(cur):
                raise ScenarioError(f"{where}: index out of range (the list has {len(cur)} items)")
            if last:
                cur[idx] = value
            else:
                cur = cur[idx]
        elif isinstance(cur, dict):
            if last:
                cur[part] = value
            else:
                if cur.get(part) is None:
                    cur[part] = {}
                cur = cur[part]
        else:
            raise ScenarioError(f"{where}: {'.'.join(parts[:i])} is a value, not a table")


def apply(base: dict[str, Any], overrides: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    """A deep copy of `base` with each (dotted key, value) set."""
    d = copy.deepcopy(base)
    for key, value in overrides:
        set_path(d, key, value)
    return d


def validated(base: dict[str, Any], overrides: Sequence[tuple[str, Any]],
              base_dir: str) -> Scenario:
    """Apply overrides and validate like a scenario file (ScenarioError naming the key)."""
    return scenario_from_dict(apply(base, overrides), base_dir)


def parse_set_value(key: str, raw: str) -> Any:
    """The VALUE of `--set KEY=VALUE` as a TOML value: numbers, booleans, quoted strings, arrays,
    inline tables (`{family="lognormal", mu=7}`); JSON too (`{"a": 1}`, `NaN`); a bare word that
    is neither (`fifo`, a preset name) is a string. Bracketed or quoted text that parses as
    neither is a ScenarioError of one line, never a string that fails later for another reason."""
    import datetime
    import json
    import re

    from aprilsim.scenario_limits import LimitError, parse_toml

    t = raw.strip()
    shown = t.replace("\n", "\\n")  # one line, whatever the value holds
    try:
        doc = parse_toml(f"v = {t}", f"--set {key}")
        if list(doc) == ["v"]:
            value = doc["v"]
            if isinstance(value, (datetime.date, datetime.time)):
                raise ScenarioError(f"--set {key}={shown}: a date is no scenario value; quote "
                                    "it for a string")
            return value
        why = "a second key followed the value"
    except LimitError as e:
        if "nested" in str(e):
            raise ScenarioError(str(e)) from None
        why = re.sub(r"^.*not valid TOML \((.*?)(?: \(at [^()]*\))?\)$", r"\1", str(e)).lower()
    try:
        return json.loads(t)
    except ValueError:
        pass
    if t.lower() in ("true", "false"):
        return t.lower() == "true"
    if t[:1] in "[{\"'" and t or "\n" in t:
        raise ScenarioError(f"--set {key}={shown}: not a TOML value ({why}); e.g. 1.5, true, "
                            '"text", [1, 2] or {family = "lognormal", mu = 7.0, sigma = 1.0}')
    return t


def apply_sets(sc: Any, sets: tuple[str, ...] | list[str]) -> Any:
    """The scenario with each `KEY=VALUE` applied and the whole validated again (ScenarioError).

    A table value (`lengths={family="lognormal", mu=7, sigma=1}`) replaces the whole table, as
    the same line in a scenario file would."""
    if not sets:
        return sc
    pairs = []
    for item in sets:
        key, eq, raw = item.partition("=")
        if not eq or not key.strip():
            raise ScenarioError(f"--set {item!r}: expected KEY=VALUE (a dotted scenario key)")
        pairs.append((key.strip(), parse_set_value(key.strip(), raw)))
    return scenario_from_dict(apply(scenario_dict(sc), pairs), sc.base_dir)
