"""Packaging metadata lives in pyproject.toml; this adds the opt-in compiled build.

A plain `pip install -e .` installs pure Python (the default, no compiler needed). With
`APRILSIM_COMPILE=1` mypyc compiles the per-sample path (`aprilsim/native.py`'s MODULES) to C
extensions beside the .py files; mypy comes in as a build requirement, a C compiler and the
Python headers must be there. docs/development.md ("Compiled build") says what it gives.
"""

import os
import runpy

from setuptools import setup

COMPILE = os.environ.get("APRILSIM_COMPILE") == "1"
ext_modules = []
try:
    from mypyc.build import mypycify
except ImportError:  # pip asks for the build requirements first (mypy is one), then builds
    mypycify = None
if COMPILE and mypycify is not None:
    modules = runpy.run_path(os.path.join("aprilsim", "native.py"))["MODULES"]
    paths = [m.replace(".", "/") + ".py" for m in modules]
    # only the compiled modules must type-check (the rest is followed silently); packages
    # without stubs (scipy), or absent from the build environment, are typed Any
    flags = ["--ignore-missing-imports", "--follow-imports=silent"]
    ext_modules = mypycify([*flags, *paths], group_name="aprilsim._native")

setup(ext_modules=ext_modules, setup_requires=["mypy>=1.10"] if COMPILE else [])
