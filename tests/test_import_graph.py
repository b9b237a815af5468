"""The import graph has no cycle, between packages or between modules.

Every import counts, including those inside functions and under TYPE_CHECKING: a lazy import still
couples two modules both ways. `aprilsim/` also never imports torch, aiohttp or `real/`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _modules(pkg: str) -> dict[str, Path]:
    out = {}
    for p in (ROOT / pkg).rglob("*.py"):
        name = ".".join(p.relative_to(ROOT).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = p
    return out


def _edges(pkg: str, depth: int | None) -> dict[str, set[str]]:
    def unit(m: str) -> str:
        return m if depth is None else ".".join(m.split(".")[:depth])

    mods = _modules(pkg)
    edges: dict[str, set[str]] = {}
    for m, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for t in targets:
                if t in mods and unit(t) != unit(m):
                    edges.setdefault(unit(m), set()).add(unit(t))
    return edges


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(edges.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (found := visit(m)):
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(edges):
        if n not in state and (found := visit(n)):
            return found
    return None


@pytest.mark.parametrize("pkg", ["aprilsim", "real"])
@pytest.mark.parametrize("depth", [2, None], ids=["packages", "modules"])
def test_no_import_cycle(pkg, depth):
    cycle = _cycle(_edges(pkg, depth))
    assert cycle is None, " -> ".join(cycle)


def test_the_cycle_finder_finds_cycles():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}}) is None


def test_core_never_imports_torch_aiohttp_or_real():
    """Only the command line may reach `real/`, and only inside the command that needs it."""
    for m, path in _modules("aprilsim").items():
        tree = ast.parse(path.read_text())
        top = set(map(id, tree.body))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for n in names:
                root = n.split(".")[0]
                lazy_cli = m == "aprilsim.cli" and id(node) not in top
                assert root not in {"torch", "aiohttp"}, (m, n)
                assert root != "real" or lazy_cli, (m, n)
