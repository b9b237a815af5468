"""Calibrate the engine cost model from measured timings (`aprilsim calibrate`).

Pure fitting: records from a CSV, the bundled engine's iteration log, SGLang's scheduler log or
Vidur-format kernel profiles, fitted to `CostModel` or `TabulatedCost` by relative-error
non-negative least squares, with a per-regime error table and a preset file. Live measurement of
an engine lives in `real/calibrate.py` (this package imports neither torch nor aiohttp).
"""

from __future__ import annotations

from .errors import RegimeError, format_error_table, regime_errors
from .estimator import CostCalibrator
from .fit import (
    choose_knots,
    fit_cost,
    fit_linear,
    fit_prefill,
    fit_tables,
    predict,
    relative_errors,
)
from .iteration_log import read_iteration_log, records_from_iterations
from .preset import preset_toml, write_preset
from .records import Record, read_csv, write_csv
from .sglang_log import read_sglang_log, records_from_sglang_lines
from .vidur import read_vidur

__all__ = [
    "CostCalibrator",
    "Record",
    "RegimeError",
    "choose_knots",
    "fit_cost",
    "fit_linear",
    "fit_prefill",
    "fit_tables",
    "format_error_table",
    "predict",
    "preset_toml",
    "read_csv",
    "read_iteration_log",
    "read_sglang_log",
    "read_vidur",
    "records_from_iterations",
    "records_from_sglang_lines",
    "regime_errors",
    "relative_errors",
    "write_csv",
    "write_preset",
]
