"""Fit response-length models to real logs (`aprilsim fit`).

The Python API mirrors the CLI::

    from aprilsim.workload.fitting import read_lengths, LengthFitter
    fitter = LengthFitter(max_len=2000).fit(read_lengths("trace.jsonl"))
    fitter.best_.family, fitter.model_          # the frozen model the simulator uses
"""

from aprilsim.workload.fitting.censoring import CapInfo, detect_cap
from aprilsim.workload.fitting.data import Histogram, LengthData
from aprilsim.workload.fitting.errors import LengthDataError
from aprilsim.workload.fitting.families import ALL_FAMILIES
from aprilsim.workload.fitting.fitter import FamilyFit, LengthFitter
from aprilsim.workload.fitting.readers import read_lengths

__all__ = [
    "ALL_FAMILIES",
    "CapInfo",
    "FamilyFit",
    "Histogram",
    "LengthData",
    "LengthDataError",
    "LengthFitter",
    "detect_cap",
    "read_lengths",
]
