"""Scheduler knobs checked by their declared types, strictly.

A knob is a public dataclass field of a scheduler class; its annotation is its declared type
(`bool`, `int | None`, `float`, `str`, a `Literal[...]`). `registry.make_scheduler` checks every
knob value against it, so the string "false" never acts as true and 4.0 never as an integer,
whether the value comes from a scenario file, `--set`, `-s NAME@knob=v` or Python.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import sys
import types
import typing
from typing import Any


class KnobTypeError(ValueError):
    """A knob value of the wrong type; the message is one line naming `schedulers.NAME.knob`."""


@functools.lru_cache(maxsize=256)
def knob_types(cls: type) -> dict[str, Any]:
    """The declared (evaluated) type of each init field of a scheduler class; unknown: Any.

    Field by field (as `typing.get_type_hints` would, but one annotation that cannot be
    evaluated leaves only that field unchecked), in the namespace of the class's module."""
    module = sys.modules.get(cls.__module__)
    ns = {**vars(typing), **(vars(module) if module else {})}
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        tp: Any = f.type
        if isinstance(tp, str):
            try:
                tp = eval(tp, ns)  # noqa: S307 - the class's own annotation, as typing does
            except Exception:  # an annotation we cannot evaluate: not checked
                tp = Any
        out[f.name] = tp
    return out


def type_words(tp: Any) -> str:
    """A declared type as the user reads it: `true or false`, `an integer or unset`."""
    origin = typing.get_origin(tp)
    if origin is typing.Union or isinstance(tp, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        words = " or ".join(type_words(a) for a in args)
        return words + (" (or unset)" if len(args) < len(typing.get_args(tp)) else "")
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    return {bool: "true or false", int: "an integer", float: "a finite number",
            str: "a string"}.get(tp, getattr(tp, "__name__", str(tp)))


def _fits(value: Any, tp: Any) -> bool | None:
    """Whether `value` has declared type `tp` (None: a type this check does not know)."""
    origin = typing.get_origin(tp)
    if origin is typing.Union or isinstance(tp, types.UnionType):
        if value is None:  # unset, from Python (TOML has no null)
            return type(None) in typing.get_args(tp)
        verdicts = [_fits(value, a) for a in typing.get_args(tp) if a is not type(None)]
        if any(v is True for v in verdicts):
            return True
        return None if any(v is None for v in verdicts) else False
    if origin is typing.Literal:
        return any(value == a and type(value) is type(a) for a in typing.get_args(tp))
    is_bool = isinstance(value, bool) or type(value).__name__ == "bool_"
    if tp is bool:
        return is_bool
    if tp is int:
        return isinstance(value, numbers.Integral) and not is_bool
    if tp is float:
        return (isinstance(value, numbers.Real) and not is_bool
                and math.isfinite(float(value)))
    if tp is str:
        return isinstance(value, str)
    return None


def check_knob_types(cls: type, settings: dict[str, Any], label: str) -> None:
    """KnobTypeError unless every knob value has its declared type, strictly: the string "false"
    is not a boolean, 4.0 is not an integer, nan and inf are not numbers a knob can take."""
    declared = knob_types(cls)
    for key, value in settings.items():
        tp = declared.get(key, Any)
        if _fits(value, tp) is False:
            shown = f"the string {value!r}" if isinstance(value, str) else repr(value)
            raise KnobTypeError(f"schedulers.{label}.{key}: expected {type_words(tp)}, got {shown}")
