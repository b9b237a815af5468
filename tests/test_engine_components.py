"""Guards of the per-sample path's shape: FastEngine keeps its state in components (its attribute
count is held here), and every dataclass that writes its own `__init__` (`init=False`, so that
the compiled build compiles it) takes exactly its fields, with their defaults: a field the
written `__init__` forgot once broke `dataclasses.replace`.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import sys
import typing
from enum import Enum
from pathlib import Path
from types import UnionType
from typing import Any

import pytest

import aprilsim
from aprilsim.engine.cost import PRESETS
from aprilsim.engine.fast import FastEngine
from aprilsim.engine.speculative import SpeculativeSpec
from aprilsim.native import MODULES

# FastEngine's own attributes: 53 before issue 23's components, 40 before issue 33's (the
# retraction index and the speculative hooks were flat attributes again); a new piece of state
# goes into the component it belongs to (engine/retraction.py, speculative.SpeculativeHooks,
# parts.PrefillBatch, the family's rules) or raises this on purpose (31: `mixed`, the stepper a
# mixed-step family runs the engine's calls through, vLLM's)
MAX_FAST_ATTRIBUTES = 31


def _attributes(obj: object) -> set[str]:
    """The attributes an object holds: its `__dict__`, or where a compiled (mypyc) class has
    none, the lists mypyc keeps in their place (the class's and its bases')."""
    if hasattr(obj, "__dict__"):
        return set(vars(obj))
    return {a for c in type(obj).__mro__ for a in getattr(c, "__mypyc_attrs__", ())
            if not a.startswith("__")}


@pytest.mark.parametrize("spec", [
    PRESETS["qwen3-4b-h100-tp2"],  # SGLang's rules, the clip, chunked prefill
    dataclasses.replace(PRESETS["qwen3-4b-h100-tp2"], prefix_cache="lru",  # every component
                        speculative=SpeculativeSpec(acceptance="siblings")),
])
def test_fast_engine_keeps_its_state_in_components(spec):
    e = FastEngine(spec)
    names = _attributes(e)
    assert len(names) <= MAX_FAST_ATTRIBUTES, sorted(names)
    assert {"rules", "retraction", "speculative", "pf", "clipped", "prefixes", "cache",
            "stats"} <= names
    assert not names & {"_victims", "_base_sum", "_max_new_sum", "_stale", "plain", "sib",
                        "ratio", "open_room", "_freed"}


def _init_false_dataclasses() -> list[type]:
    """Every dataclass of the compiled path's modules that writes its own `__init__`."""
    out = []
    for name in MODULES:
        mod = importlib.import_module(name)
        for obj in vars(mod).values():
            if (isinstance(obj, type) and obj.__module__ == name and dataclasses.is_dataclass(obj)
                    and not obj.__dataclass_params__.init):  # type: ignore[attr-defined]
                out.append(obj)
    return out


def _hints(cls: type) -> dict[str, Any]:
    """The field types as the .py source writes them (a compiled class keeps `type` where its
    annotation was a union)."""
    mod = sys.modules[cls.__module__]
    package = Path(aprilsim.__file__).resolve().parent  # (a compiled module's __file__ is off)
    tree = ast.parse(package.joinpath(*cls.__module__.split(".")[1:]).with_suffix(".py")
                     .read_text())
    (node,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls.__name__]
    return {a.target.id: eval(ast.unparse(a.annotation), vars(mod))  # noqa: S307 (our source)
            for a in node.body if isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name)}


def _value(tp: Any, i: int) -> Any:
    """A value of type `tp` unlike any default (distinct per field: `i`)."""
    if isinstance(tp, UnionType) or typing.get_origin(tp) is typing.Union:
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    origin = typing.get_origin(tp) or tp
    if origin is bool:
        return True
    if origin is int:
        return 1_000 + i
    if origin is float:
        return 0.5 + i
    if origin is str:
        return f"value {i}"
    if origin is list:
        return []
    if isinstance(origin, type) and issubclass(origin, Enum):
        return list(origin)[-1]
    return object()


def _same(got: Any, given: Any) -> bool:
    """The very object for a list or a bare object; an equal one for a number or a string (the
    compiled build stores them unboxed and boxes them anew)."""
    if isinstance(given, list) or type(given) is object:
        return got is given
    return got == given and type(got) is type(given)


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return f.default


def test_written_inits_take_exactly_their_fields_with_their_defaults():
    classes = _init_false_dataclasses()
    names = {c.__name__ for c in classes}
    assert {"Request", "Completion", "Segment", "Sample", "Group"} <= names, names
    for cls in classes:
        hints, fields = _hints(cls), dataclasses.fields(cls)
        takes = [f for f in fields if f.init]
        try:  # a compiled __init__ keeps no signature (or *args, **kwargs): the calls below
            params = list(inspect.signature(cls.__init__).parameters.values())[1:]  # say it all
        except (TypeError, ValueError):
            params = None
        if params and any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
            params = None
        if params is not None:
            assert [p.name for p in params] == [f.name for f in takes], cls
            for p, f in zip(params, takes):
                if f.default is not dataclasses.MISSING:
                    assert p.default == f.default, (cls, f.name)
                elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
                    assert p.default is None, (cls, f.name)  # None: a fresh one each
                else:
                    assert p.default is inspect.Parameter.empty, (cls, f.name)
        given = {f.name: _value(hints[f.name], i) for i, f in enumerate(takes)}
        obj = cls(**given)
        for f in fields:  # each argument lands in its field, the others hold their default
            got = getattr(obj, f.name)
            assert _same(got, given[f.name]) if f.init else got == _default(f), (cls, f.name)
        required = {f.name: given[f.name] for f in takes
                    if f.default is dataclasses.MISSING
                    and f.default_factory is dataclasses.MISSING}  # type: ignore[misc]
        bare = cls(**required)
        for f in fields:
            if f.name not in required:
                assert getattr(bare, f.name) == _default(f), (cls, f.name)
        copy = dataclasses.replace(obj)
        assert all(getattr(copy, f.name) == getattr(obj, f.name) for f in fields), cls
