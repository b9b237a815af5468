"""Which build of the simulator's per-sample path is loaded: pure Python or the opt-in mypyc one.

`APRILSIM_COMPILE=1 pip install -e '.[compiled]'` compiles `MODULES` with mypyc (`setup.py`;
needs mypy and a C compiler; the extra brings librt, mypyc's runtime library); a plain install
leaves every module interpreted, the default and the fallback.
Both give byte-identical results. `APRILSIM_PURE=1` makes a compiled install import the
pure-Python modules instead (how the tests run both on one install). docs/development.md.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from importlib.machinery import ModuleSpec

# the per-sample path: the engine, the runtime loop, the rollout core and ledger, the nouns
MODULES = (
    "aprilsim.engine.clipped_reserve",
    "aprilsim.engine.cost",
    "aprilsim.engine.families.protocol",
    "aprilsim.engine.families.sglang",
    "aprilsim.engine.fast",
    "aprilsim.engine.key_heap",
    "aprilsim.engine.parts",
    "aprilsim.engine.request",
    "aprilsim.engine.retraction",
    "aprilsim.engine.router",
    "aprilsim.engine.speculative",
    "aprilsim.engine.waiting",
    "aprilsim.rollout.core",
    "aprilsim.rollout.ledger",
    "aprilsim.sim.engine_clock",
    "aprilsim.sim.runtime",
    "aprilsim.types",
)

_PACKAGE = os.path.dirname(os.path.abspath(__file__))

try:  # mypyc's class options; a no-op without mypy_extensions (a plain install never needs it)
    from mypy_extensions import mypyc_attr
except ImportError:

    def mypyc_attr(*_args: object, **_kwargs: object):  # type: ignore[no-redef]
        """Leave the class as it is (pure Python)."""
        return lambda cls: cls


def pure_forced() -> bool:
    """True when `APRILSIM_PURE=1` asks for the pure-Python modules."""
    return os.environ.get("APRILSIM_PURE") == "1"


def compiled_modules() -> tuple[str, ...]:
    """The modules of `MODULES` that are (or, not yet imported, will be) compiled extensions."""
    out = []
    for name in MODULES:
        mod = sys.modules.get(name)
        if mod is not None:
            path = getattr(mod, "__file__", None) or ""
            if path.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
                out.append(name)
        elif not pure_forced():
            base = os.path.join(_PACKAGE, *name.split(".")[1:])
            if any(os.path.isfile(base + s) for s in importlib.machinery.EXTENSION_SUFFIXES):
                out.append(name)
    return tuple(out)


def compiled() -> bool:
    """True when the per-sample path runs compiled (the opt-in mypyc build)."""
    return bool(compiled_modules())


def build_line() -> str:
    """One line for `aprilsim --version`: which build is loaded."""
    n = len(compiled_modules())
    return f"compiled with mypyc: {n} of {len(MODULES)} modules" if n else "pure Python"


# mypyc's runtime library: the compiled key heaps (`engine/key_heap.py`) keep their keys in its
# unboxed vectors, so a compiled install needs it at run time (the `compiled` extra)
RUNTIME = "librt"


def runtime_missing() -> bool:
    """True when compiled extensions sit beside the modules but mypyc's runtime library is not
    importable: importing them would fail, so the package falls back to its .py files."""
    if pure_forced() or importlib.util.find_spec(RUNTIME) is not None:
        return False
    base = os.path.join(_PACKAGE, "engine", "key_heap")
    return any(os.path.isfile(base + s) for s in importlib.machinery.EXTENSION_SUFFIXES)


def fall_back_without_runtime() -> bool:
    """Run as pure Python (with a warning) when `runtime_missing()`; True if it did."""
    if not runtime_missing():
        return False
    import warnings

    warnings.warn(
        f"aprilsim's compiled build is installed but {RUNTIME} (mypyc's runtime library) is "
        f"not: running pure Python (2-3x slower); pip install {RUNTIME}, or reinstall with "
        "APRILSIM_COMPILE=1 pip install -e '.[compiled]'", RuntimeWarning, stacklevel=3)
    os.environ["APRILSIM_PURE"] = "1"  # what compiled_modules() and subprocesses then see
    prefer_source()
    return True


class _SourceFirst:
    """A meta-path finder that imports `MODULES` from their .py files (`APRILSIM_PURE=1`)."""

    def find_spec(self, name: str, path=None, target=None) -> ModuleSpec | None:
        if name not in MODULES or not path:
            return None
        leaf = name.rpartition(".")[2] + ".py"
        for d in path:
            f = os.path.join(d, leaf)
            if os.path.isfile(f):
                return importlib.util.spec_from_file_location(name, f)
        return None


def prefer_source() -> None:
    """Import the pure-Python `MODULES` from now on, even where compiled ones sit beside them."""
    if not any(isinstance(f, _SourceFirst) for f in sys.meta_path):
        sys.meta_path.insert(0, _SourceFirst())
