"""The opt-in compiled build (`APRILSIM_COMPILE=1 pip install -e '.[compiled]'`, native.py).

A plain install runs every module interpreted: the equivalence tests then check the pure-Python
engines, and `aprilsim --version` says so. On a compiled install the last test runs the fast ==
reference equivalence files against the compiled modules and again with `APRILSIM_PURE=1` (the
pure-Python fallback on the same install), and compares whole runs of both byte for byte.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import aprilsim
from aprilsim.cli import main
from aprilsim.engine.fast import FastEngine
from aprilsim.engine.reference import ReferenceEngine
from aprilsim.native import MODULES, build_line, compiled, compiled_modules

ROOT = Path(__file__).resolve().parents[1]
EXT = tuple(importlib.machinery.EXTENSION_SUFFIXES)
EQUIVALENCE = [
    "tests/test_engine_equivalence.py",
    "tests/test_engine_equivalence_placed.py",
    "tests/test_engine_kv_bound.py",
    "tests/test_whole_run_equivalence.py",
]


def _is_extension(module: object) -> bool:
    return str(getattr(module, "__file__", "")).endswith(EXT)


def test_the_build_reported_is_the_one_loaded():
    mods = {name: importlib.import_module(name) for name in MODULES}
    loaded = {name for name, m in mods.items() if _is_extension(m)}
    assert set(compiled_modules()) == loaded
    assert compiled() == bool(loaded)
    version = CliRunner().invoke(main, ["--version"]).output
    assert build_line() in version and ("pure Python" in version) == (not loaded)


def test_the_equivalence_tests_engines_are_pure_python_unless_compiled():
    fast = sys.modules[FastEngine.__module__]
    reference = sys.modules[ReferenceEngine.__module__]
    assert not _is_extension(reference)  # the oracle always runs interpreted
    assert reference.__file__.endswith(".py")
    if compiled():
        assert _is_extension(fast)
    else:
        assert fast.__file__.endswith(".py")
        assert build_line() == "pure Python"


def _run(cmd: list[str], pure: bool) -> subprocess.CompletedProcess:
    env = dict(os.environ, APRILSIM_PURE="1" if pure else "0")
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)


CLUSTER_RUN = (
    "import copy, json, sys; sys.path.insert(0, 'benchmarks'); from sim_speed import TIGHT_CLUSTER;"
    "from aprilsim.config import scenario_from_dict; from aprilsim.sim.run import simulate;"
    "import aprilsim.engine.fast as f; print(f.__file__.endswith('.py'));"
    "s = copy.deepcopy(TIGHT_CLUSTER); s['steps'] = 3; "
    "r = simulate(scenario_from_dict(s), 'april');"
    "print(json.dumps([r.summary(), [x.to_dict() for x in r.steps], r.end_state], sort_keys=True))"
)


@pytest.mark.skipif(not compiled(), reason="the pure-Python build is loaded (the compiled build "
                    "is opt-in: APRILSIM_COMPILE=1 pip install -e '.[compiled]', "
                    "docs/development.md)")
def test_compiled_build_keeps_fast_equal_to_reference_and_to_pure_python():
    package = Path(aprilsim.__file__).resolve().parent  # (a compiled module's __file__ is off)
    for name in compiled_modules():  # a stale extension would run (and test) the old code
        base = package.joinpath(*name.split(".")[1:])
        src = base.with_name(base.name + ".py")
        exts = [e for e in (base.with_name(base.name + s) for s in EXT) if e.exists()]
        assert exts, name
        for ext in exts:
            assert ext.stat().st_mtime >= src.stat().st_mtime, f"{ext} is older than {src}: rebuild"
    for pure in (False, True):
        r = _run([sys.executable, "-m", "pytest", "-n", "0", "-p", "no:cacheprovider",
                  *EQUIVALENCE], pure)
        assert r.returncode == 0, (pure, r.stdout[-3000:], r.stderr[-3000:])
        assert " passed" in r.stdout
    runs = {pure: _run([sys.executable, "-c", CLUSTER_RUN], pure) for pure in (False, True)}
    for pure, r in runs.items():
        assert r.returncode == 0, r.stderr[-3000:]
        assert r.stdout.splitlines()[0] == str(pure)  # the subprocess ran the build asked for
    assert runs[False].stdout.splitlines()[1] == runs[True].stdout.splitlines()[1]
    sims = {pure: _run([sys.executable, "-m", "aprilsim", "simulate", "--json"], pure)
            for pure in (False, True)}
    assert sims[False].returncode == sims[True].returncode == 0
    assert sims[False].stdout == sims[True].stdout


HIDE_RUNTIME = (
    "import sys, warnings; sys.modules['librt'] = None; warnings.simplefilter('always');"
    "import aprilsim; from aprilsim.native import build_line; import aprilsim.engine.fast as f;"
    "from aprilsim.engine.key_heap import new_key_heap;"
    "h = new_key_heap([3, 1, 2]); print(f.__file__.endswith('.py'), build_line(),"
    " [h.pop_min() for _ in range(3)])"
)


def test_a_compiled_install_without_its_runtime_library_runs_pure_python_and_says_so():
    """The compiled key heaps keep their keys in librt's vectors: with librt missing (a compiled
    install without the `compiled` extra) the package warns and imports its .py files instead
    of failing at the first compiled import. A plain install is untouched."""
    env = {k: v for k, v in os.environ.items() if k != "APRILSIM_PURE"}
    r = subprocess.run([sys.executable, "-c", HIDE_RUNTIME], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["True", "pure", "Python", "[1,", "2,", "3]"]
    warned = "librt (mypyc's runtime library) is not" in r.stderr
    assert warned == compiled(), r.stderr  # only a compiled install has anything to fall back from
