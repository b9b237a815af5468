"""The docs site builds with `mkdocs build --strict`, and everything in its API reference has a
docstring (members included)."""

from __future__ import annotations

import importlib
import inspect
import os
import re
import shutil
import subprocess
import sys
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
                and (inspect.isfunction(m) or isinstance(m, (classmethod, staticmethod)))]
    return []


def _documented(obj) -> bool:
    doc = (getattr(obj, "__doc__", None) or "").strip()
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
