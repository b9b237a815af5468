"""The docs site builds with `mkdocs build --strict`, and everything in its API reference has a
docstring (members included).

A docstring is read from the object, or where a compiled (mypyc) build drops it (its classes,
their methods), from the module's .py source, which is where mkdocstrings reads it anyway."""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
API_PAGE = ROOT / "docs" / "api.md"


def _api_objects() -> list[str]:
    return re.findall(r"^::: ([\w.]+)$", API_PAGE.read_text(), flags=re.M)


def _resolve(path: str):
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(path)


def _public_members(obj) -> list[tuple[str, object]]:
    if inspect.ismodule(obj):
        return [(n, m) for n, m in vars(obj).items() if not n.startswith("_")
                and (inspect.isfunction(m) or inspect.isclass(m))
                and getattr(m, "__module__", None) == obj.__name__]
    if inspect.isclass(obj):
        return [(n, m) for n, m in vars(obj).items() if not n.startswith("_")
                and (inspect.isfunction(m) or isinstance(m, (classmethod, staticmethod))
                     or isinstance(m, types.MethodDescriptorType))]  # a compiled class's methods
    return []


def _source_doc(obj) -> str:
    """The docstring the .py source of `obj`'s module writes for it ("" if none): a compiled
    module keeps neither its classes' nor their methods' docstrings, its .py file does."""
    owner = getattr(obj, "__objclass__", obj)  # a compiled method: the class it belongs to
    mod = sys.modules.get(getattr(owner, "__module__", None) or "")
    qualname = getattr(obj, "__qualname__", None)
    if mod is None or not qualname or not getattr(mod, "__file__", None):
        return ""
    source = Path(mod.__file__).with_name(mod.__name__.rpartition(".")[2] + ".py")
    if not source.is_file():
        return ""
    node: ast.AST = ast.parse(source.read_text())
    defs = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    for part in qualname.split("."):
        node = next((n for n in getattr(node, "body", ())
                     if isinstance(n, defs) and n.name == part), None)
        if node is None:
            return ""
    return (ast.get_docstring(node) or "").strip()


def _documented(obj) -> bool:
    doc = (getattr(obj, "__doc__", None) or "").strip() or _source_doc(obj)
    # a dataclass without a docstring gets its signature as __doc__: that is not documentation
    return bool(doc) and not (inspect.isclass(obj) and doc.startswith(f"{obj.__name__}("))


def test_every_api_object_and_member_has_a_docstring():
    missing = []
    objects = _api_objects()
    assert len(objects) > 20
    for path in objects:
        obj = _resolve(path)
        if not _documented(obj):
            missing.append(path)
        todo = _public_members(obj)
        while todo:
            name, member = todo.pop()
            fn = getattr(member, "__func__", member)
            if not _documented(fn):
                missing.append(f"{path}.{name}")
            if inspect.isclass(member):
                todo += [(f"{name}.{n}", m) for n, m in _public_members(member)]
    assert not missing, f"no docstring: {missing}"


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason="needs aprilsim[docs]")
def test_mkdocs_build_strict(tmp_path):
    pytest.importorskip("mkdocstrings")
    pytest.importorskip("material")
    exe = shutil.which("mkdocs") or str(Path(sys.executable).parent / "mkdocs")
    r = subprocess.run([exe, "build", "--strict", "-q", "-d", str(tmp_path / "site")], cwd=ROOT,
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert r.returncode == 0, r.stdout + r.stderr
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    assert "from_slime" in api and "write_timeline" in api
    assert (tmp_path / "site" / "img" / "steps_default.png").exists()


def test_the_api_page_has_what_a_scheduler_author_needs():
    """Issue 36 item 21: api.md lacked Submit's priority/route/keep_kv, MOST_ROOM, SampleCapped
    and the scheduler classes a user writing a length-aware scheduler needs."""
    listed = set(_api_objects())
    need = {f"aprilsim.policies.base.{n}" for n in (
        "Scheduler", "Context", "Submit", "MOST_ROOM", "SampleCapped", "RolloutStarted",
        "GroupFinished", "SamplesReturned", "CloseBatch", "AbortAll", "Discard")}
    need |= {"aprilsim.policies.seer.SeerScheduler", "aprilsim.policies.registry.register",
             "aprilsim.types.Sample", "aprilsim.types.Group"}
    assert need <= listed, sorted(need - listed)
    from aprilsim.policies.base import Submit

    assert all(w in Submit.__doc__ for w in ("priority", "route", "MOST_ROOM", "keep_kv"))
    src = (ROOT / "aprilsim" / "policies" / "base.py").read_text()
    assert re.search(r'^MOST_ROOM = .*\n"""', src, re.M)  # its attribute docstring, rendered
