"""The import graph has no cycle, between packages or between modules.

Every import counts, including those inside functions and under TYPE_CHECKING: a lazy import still
couples two modules both ways. Relative imports (``from .x import y``, ``from ..a import b``) are
resolved against the importing module's package, as Python does. `aprilsim/` also never imports
torch, aiohttp or `real/`, and no module imports another package's private (``_``) names.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("aprilsim", "real", "tests", "experiments", "benchmarks")


def _modules(pkg: str, root: Path = ROOT) -> dict[str, Path]:
    """{dotted module name: file} of every module under ``root/pkg``."""
    out = {}
    for p in (root / pkg).rglob("*.py"):
        name = ".".join(p.relative_to(root).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = p
    return out


def _package_of(module: str, path: Path) -> str:
    """The package a relative import in ``module`` starts from (itself for an ``__init__``)."""
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _imports(module: str, path: Path,
             tree: ast.AST | None = None) -> list[tuple[str, list[str], ast.AST]]:
    """(absolute module, imported names, node) of every import in ``path``, relative ones
    resolved: ``from . import x`` in package ``p`` is module ``p`` with name ``x``."""
    out = []
    for node in ast.walk(tree or ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = _package_of(module, path).split(".")
                up = node.level - 1
                if up >= len(parts) or not parts[0]:
                    raise ValueError(f"{module}: relative import beyond the top package")
                anchor = ".".join(parts[: len(parts) - up])
                base = f"{anchor}.{base}" if base else anchor
            out.append((base, [a.name for a in node.names], node))
    return out


def _edges(pkg: str, depth: int | None, root: Path = ROOT) -> dict[str, set[str]]:
    """Module (or, with ``depth``, package) import edges inside ``pkg``."""

    def unit(m: str) -> str:
        return m if depth is None else ".".join(m.split(".")[:depth])

    mods = _modules(pkg, root)
    edges: dict[str, set[str]] = {}
    for m, path in mods.items():
        for base, names, _ in _imports(m, path):
            for t in [base] + [f"{base}.{n}" for n in names]:
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


def _lazy_commands() -> dict[str, str]:
    """{command: module} of the commands `aprilsim.cli` imports by name when invoked."""
    from aprilsim.cli import main

    return {name: module for name, (module, _) in type(main).lazy.items()}


def test_aprilsim_and_real_form_no_loop():
    """`aprilsim.cli` reaches `real` (the lazy run/validate commands, `calibrate --local`) and
    `real` imports aprilsim's library: no chain of imports, the lazy command table included, leads
    back. `real` never imports the command group `aprilsim.cli` (it uses `aprilsim.cli_errors`)."""
    mods = {**_modules("aprilsim"), **_modules("real")}
    edges: dict[str, set[str]] = {}
    for m, path in mods.items():
        for base, names, _ in _imports(m, path):
            for t in [base] + [f"{base}.{n}" for n in names]:
                if t in mods and t != m:
                    edges.setdefault(m, set()).add(t)
    lazy = set(_lazy_commands().values()) - {"aprilsim.cli"}
    assert {"real.runner.cli", "real.validate_cli"} <= lazy <= set(mods), lazy
    edges.setdefault("aprilsim.cli", set()).update(lazy)
    cycle = _cycle(edges)
    assert cycle is None, " -> ".join(cycle)
    assert not [m for m in _modules("real") if "aprilsim.cli" in edges.get(m, ())]


def test_the_cycle_finder_finds_cycles():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}}) is None


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def test_the_resolver_reads_relative_imports(tmp_path):
    """On a tiny package: `.x`, `..a`, `from . import m` and an ``__init__``'s own `.` resolve as
    Python resolves them, and a cycle made only of relative imports is found."""
    _write(tmp_path, {
        "pkg/__init__.py": "VERSION = 1\n",
        "pkg/top.py": "import os\n",
        "pkg/sub/__init__.py": "from . import leaf\n",
        "pkg/sub/leaf.py": "from ..top import x\nfrom .sib import y\n",
        "pkg/sub/sib.py": "def f():\n    from .. import top\n    from ...pkg import top as t\n",
    })
    with pytest.raises(ValueError, match="beyond the top package"):
        _edges("pkg", None, tmp_path)
    (tmp_path / "pkg/sub/sib.py").write_text("def f():\n    from .. import top\n")
    assert _edges("pkg", None, tmp_path) == {
        "pkg.sub": {"pkg.sub.leaf"},
        "pkg.sub.leaf": {"pkg.top", "pkg.sub.sib"},
        "pkg.sub.sib": {"pkg", "pkg.top"},
    }
    assert _edges("pkg", 2, tmp_path) == {"pkg.sub": {"pkg", "pkg.top"}}
    assert _cycle(_edges("pkg", None, tmp_path)) is None
    (tmp_path / "pkg/top.py").write_text("from .sub.leaf import z\n")
    assert _cycle(_edges("pkg", None, tmp_path)) == ["pkg.sub.leaf", "pkg.sub.sib", "pkg.top",
                                                     "pkg.sub.leaf"]


def test_relative_imports_are_seen_in_real():
    """The resolver sees real/'s relative imports (the old test skipped every one of them)."""
    mods = _modules("real")
    relative = [n for m, p in mods.items() for _, _, n in _imports(m, p)
                if isinstance(n, ast.ImportFrom) and n.level]
    assert len(relative) > 20
    assert "real.protocol" in _edges("real", None)["real.runner.api"]


def _top_package(module: str) -> str:
    return module.split(".")[0]


def _private_imports(root: Path = ROOT, pkgs: tuple[str, ...] = SCANNED) -> list[str]:
    """``from X import _name`` (or from a private module ``_x``) where X is in another top-level
    package than the importer. A package may share private names within itself (a script's
    sibling modules, imported by bare name, are its own); dunder names are public."""
    found = []
    for pkg in pkgs:
        if not (root / pkg).is_dir():
            continue
        for m, path in _modules(pkg, root).items():
            for base, names, node in _imports(m, path):
                head = _top_package(base)
                sibling = (path.parent / f"{head}.py").exists() or (path.parent / head).is_dir()
                if not isinstance(node, ast.ImportFrom) or head == _top_package(m) or sibling:
                    continue
                for n in names:
                    private_module = any(p.startswith("_") and not p.startswith("__")
                                         for p in base.split("."))
                    if (n.startswith("_") and not n.startswith("__")) or private_module:
                        found.append(f"{m}: from {base} import {n}")
    return found


def test_no_module_imports_another_packages_private_names():
    assert _private_imports() == []


def test_the_private_import_scan_finds_them(tmp_path):
    _write(tmp_path, {
        "a/__init__.py": "", "a/x.py": "_p = 1\n__all__ = []\n", "a/_hidden.py": "q = 1\n",
        "b/__init__.py": "",
        "b/y.py": "from a.x import _p\nfrom a.x import __all__\nfrom a._hidden import q\n",
        "a/z.py": "from a.x import _p\nfrom .x import _p as p2\n",
        "b/w.py": "from y import _q\n",  # a sibling, imported by bare name (sys.path[0])
    })
    assert _private_imports(tmp_path, ("a", "b")) == ["b.y: from a.x import _p",
                                                      "b.y: from a._hidden import q"]


def test_core_never_imports_torch_aiohttp_or_real():
    """Only the command line may reach `real/`, and only inside the command that needs it."""
    for m, path in _modules("aprilsim").items():
        tree = ast.parse(path.read_text())
        top = set(map(id, tree.body))
        for base, _, node in _imports(m, path, tree):
            root = base.split(".")[0]
            assert root not in {"torch", "aiohttp"}, (m, base)
            assert root != "real" or (m == "aprilsim.cli" and id(node) not in top), (m, base)


def _command_module(name: str) -> bool:
    """`aprilsim.cli`, `aprilsim.simulate_cli`, `aprilsim.sweep.cli`...: click commands."""
    last = name.rsplit(".", 1)[-1]
    return name.startswith("aprilsim.") and (last == "cli" or last.endswith("_cli"))


def test_real_never_imports_aprilsim_commands():
    """Arrows point from commands to the library: `real/` uses what the commands use
    (`aprilsim.report.run_output`, `aprilsim.metrics.gain`), never a command module itself
    (`real/runner/cli.py` once imported `aprilsim/simulate_cli.py`)."""
    wrong = [f"{m} -> {t}" for m, path in _modules("real").items()
             for base, names, _ in _imports(m, path)
             for t in [base, *(f"{base}.{n}" for n in names)] if _command_module(t)]
    assert wrong == []
    assert _command_module("aprilsim.simulate_cli") and _command_module("aprilsim.sweep.cli")
    assert not _command_module("aprilsim.cli_errors")


# arrows that once pointed the wrong way (issue 33): module -> what it must not import
FORBIDDEN = {
    "real": ("aprilsim.sim.runtime",),  # the simulator's driver: real shares `aprilsim.engine`'s
    "aprilsim.engine": ("aprilsim.sim",),  # the engines are below the simulator that runs them
}
CHECKS = "aprilsim.conformance"
CHECKS_ADAPTER = "real.runner.live_conformance"  # the one real module that may import the checks


def _forbidden_arrows(root: Path = ROOT) -> list[str]:
    """`importer -> imported` for each import `FORBIDDEN` names (a package counts its
    submodules), and each real module but `CHECKS_ADAPTER` importing the conformance checks."""
    found = []
    mods = {**_modules("aprilsim", root), **_modules("real", root)}
    for m, path in mods.items():
        banned = [b for pkg, bs in FORBIDDEN.items() if m == pkg or m.startswith(pkg + ".")
                  for b in bs]
        if m.startswith("real.") and m != CHECKS_ADAPTER:
            banned.append(CHECKS)
        for base, names, _ in _imports(m, path):
            targets = [base] + [f"{base}.{n}" for n in names]
            if any(t == b or t.startswith(b + ".") for t in targets for b in banned):
                found.append(f"{m} -> {base}")
    return sorted(set(found))


def test_the_wrong_way_arrows_stay_gone():
    """The live driver's virtual-time engines use the simulated engines' own pieces (the request
    builder, the abort rule, the meter: `aprilsim.engine`), not the simulator's driver, and only
    the checks' adapter imports the conformance checks."""
    assert _forbidden_arrows() == []


def test_the_arrow_scan_finds_them(tmp_path):
    _write(tmp_path, {
        "aprilsim/__init__.py": "", "aprilsim/conformance.py": "", "aprilsim/sim/__init__.py": "",
        "aprilsim/sim/runtime.py": "", "aprilsim/engine/__init__.py": "",
        "aprilsim/engine/x.py": "from aprilsim.sim import runtime\n",
        "real/__init__.py": "", "real/runner/__init__.py": "",
        "real/runner/virtual.py": "from aprilsim.conformance import y\n"
                                  "import aprilsim.sim.runtime\n",
        "real/runner/live_conformance.py": "from aprilsim.conformance import y\n",
    })
    assert _forbidden_arrows(tmp_path) == [
        "aprilsim.engine.x -> aprilsim.sim", "real.runner.virtual -> aprilsim.conformance",
        "real.runner.virtual -> aprilsim.sim.runtime"]
