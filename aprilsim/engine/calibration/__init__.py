"""Calibrate the engine cost model from measured timings (`aprilsim calibrate`).

Pure fitting: records from a CSV, the bundled engine's iteration log, SGLang's scheduler log or
Vidur-format kernel profiles, fitted to `CostModel` or `TabulatedCost` by relative-error
non-negative least squares, with a per-regime error table and a preset file. Live measurement of
an engine lives in `real/calibrate.py` (this package imports neither torch nor aiohttp).

The names below load on first use (PEP 562), so that `aprilsim calibrate`'s options (loaded by
every `aprilsim` command) do not load numpy and the fitting code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aprilsim.lazy_names import lazy_attributes

if TYPE_CHECKING:
    from .errors import RegimeError as RegimeError
    from .errors import format_error_table as format_error_table
    from .errors import regime_errors as regime_errors
    from .estimator import CostCalibrator as CostCalibrator
    from .fit import choose_knots as choose_knots
    from .fit import fit_cost as fit_cost
    from .fit import fit_linear as fit_linear
    from .fit import fit_prefill as fit_prefill
    from .fit import fit_tables as fit_tables
    from .fit import predict as predict
    from .fit import relative_errors as relative_errors
    from .iteration_log import read_iteration_log as read_iteration_log
    from .iteration_log import records_from_iterations as records_from_iterations
    from .preset import preset_toml as preset_toml
    from .preset import write_preset as write_preset
    from .records import Record as Record
    from .records import read_csv as read_csv
    from .records import write_csv as write_csv
    from .sglang_log import read_sglang_log as read_sglang_log
    from .sglang_log import records_from_sglang_lines as records_from_sglang_lines
    from .vidur import read_vidur as read_vidur

_LAZY = {
    "RegimeError": "errors",
    "format_error_table": "errors",
    "regime_errors": "errors",
    "CostCalibrator": "estimator",
    "choose_knots": "fit",
    "fit_cost": "fit",
    "fit_linear": "fit",
    "fit_prefill": "fit",
    "fit_tables": "fit",
    "predict": "fit",
    "relative_errors": "fit",
    "read_iteration_log": "iteration_log",
    "records_from_iterations": "iteration_log",
    "preset_toml": "preset",
    "write_preset": "preset",
    "Record": "records",
    "read_csv": "records",
    "write_csv": "records",
    "read_sglang_log": "sglang_log",
    "records_from_sglang_lines": "sglang_log",
    "read_vidur": "vidur",
}

__all__ = sorted(_LAZY)


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, globals())
