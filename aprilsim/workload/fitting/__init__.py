"""Fit response-length models to real logs (`aprilsim fit`).

The Python API mirrors the CLI::

    from aprilsim.workload.fitting import read_lengths, LengthFitter
    fitter = LengthFitter(max_len=2000).fit(read_lengths("trace.jsonl"))
    fitter.best_.family, fitter.model_          # the frozen model the simulator uses

The names below load on first use (PEP 562), so importing a light module of this package (the
CLI's options, the errors) does not load scipy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aprilsim.lazy_names import lazy_attributes
from aprilsim.workload.fitting.names import ALL_FAMILIES

if TYPE_CHECKING:
    from aprilsim.workload.fitting.censoring import CapInfo as CapInfo
    from aprilsim.workload.fitting.censoring import detect_cap as detect_cap
    from aprilsim.workload.fitting.data import Histogram as Histogram
    from aprilsim.workload.fitting.data import LengthData as LengthData
    from aprilsim.workload.fitting.errors import LengthDataError as LengthDataError
    from aprilsim.workload.fitting.fitter import FamilyFit as FamilyFit
    from aprilsim.workload.fitting.fitter import LengthFitter as LengthFitter
    from aprilsim.workload.fitting.readers import read_lengths as read_lengths

_LAZY = {
    "CapInfo": "censoring",
    "detect_cap": "censoring",
    "Histogram": "data",
    "LengthData": "data",
    "LengthDataError": "errors",
    "FamilyFit": "fitter",
    "LengthFitter": "fitter",
    "read_lengths": "readers",
}

__all__ = ["ALL_FAMILIES", *_LAZY]


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, globals())
