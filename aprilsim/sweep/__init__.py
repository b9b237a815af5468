"""Sweeps and tuning over scenario keys (`aprilsim sweep`, `aprilsim tune`, `aprilsim plot sweep`).

`aprilsim.sweep` is this package and is also callable: `aprilsim.sweep(scenario, grid, ...)` is
`aprilsim.sweep.api.sweep`, which returns the tidy results table as a pandas DataFrame. Importing
the package costs nothing extra: pandas (the `sweep` extra) is imported only when a sweep runs.
"""

from __future__ import annotations

import sys
import types
from typing import Any


def sweep(*args: Any, **kwargs: Any):
    """Run a sweep and return the tidy table; see `aprilsim.sweep.api.sweep`."""
    from aprilsim.sweep.api import sweep as _sweep

    return _sweep(*args, **kwargs)


def tune(*args: Any, **kwargs: Any):
    """Tune knobs under constraints; see `aprilsim.sweep.tune.tune`."""
    from aprilsim.sweep.tune import tune as _tune

    return _tune(*args, **kwargs)




class _CallableModule(types.ModuleType):
    """Lets `aprilsim.sweep(...)` call the function although `aprilsim.sweep` is a package."""

    def __call__(self, *args: Any, **kwargs: Any):
        return sweep(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

__all__ = ["sweep", "tune"]
