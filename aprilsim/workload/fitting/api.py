"""`fit_log`: the whole of `aprilsim fit` as one call (read, fit, split, drift), returning a report.

The CLI is a thin shell over this function, so everything it prints, writes or plots is available
from Python: `fit_log(path, max_len=2000).write_model("m.toml")`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from aprilsim.workload.fitting.data import LengthData, check_usable
from aprilsim.workload.fitting.errors import LengthDataError
from aprilsim.workload.fitting.names import ALL_FAMILIES
from aprilsim.workload.fitting.readers import read_lengths
from aprilsim.workload.fitting.skipped import MAX_SKIPPED, check_skipped

if TYPE_CHECKING:
    from aprilsim.workload.fitting.report import FitReport


def _is_curve(data: LengthData) -> bool:
    """One row per step: a mean-length curve, not per-sample lengths."""
    return data.steps is not None and len(np.unique(data.steps)) == len(data.steps)


def fit_log(
    source: str | Path | LengthData,
    *,
    column: str | None = None,
    group_column: str | None = None,
    step_column: str | None = None,
    max_len: int | None = None,
    detect_cap: bool = True,
    families: Sequence[str] = ALL_FAMILIES,
    criterion: str = "bic",
    n_bootstrap: int = 200,
    drift_from: str | Path | None = None,
    drift_column: str | None = None,
    random_state: int | None = 0,
    progress: Callable[[str], None] | None = None,
    max_skipped: float | None = MAX_SKIPPED,
) -> FitReport:
    """Fit a length model to a log file (or to `LengthData`) the way `aprilsim fit` does.

    A file whose step column has one row per step is a mean-length curve: only the drift is
    fitted. `drift_from` adds the drift of such a curve to a per-sample fit. When the per-sample
    data has a step column, the drift is fitted on it and the length model is rescaled to step 0.
    More than `max_skipped` of the rows unusable (None: no limit) raises LengthDataError.
    """
    if isinstance(source, LengthData):
        data = source
    else:
        data = read_lengths(source, column, group_column, step_column)
    check_usable(data)
    check_skipped(data, max_skipped)
    # the fitting modules (and scipy) load only now: a bad file fails without waiting for them
    from aprilsim.workload.fitting.drift_fit import DriftFitter
    from aprilsim.workload.fitting.fitter import LengthFitter
    from aprilsim.workload.fitting.prompt_split import PromptSplit
    from aprilsim.workload.fitting.report import FitReport

    if _is_curve(data):
        assert data.steps is not None and data.lengths is not None
        drift = DriftFitter().fit(data.steps, data.lengths)
        return FitReport(data=data, drift=drift)
    fitter = LengthFitter(
        families=families,
        max_len=max_len,
        detect_cap=detect_cap,
        criterion=criterion,
        n_bootstrap=n_bootstrap,
        random_state=random_state,
        progress=progress,
    ).fit(data)
    model = fitter.model_
    split = None
    if data.groups is not None and data.lengths is not None:
        split = PromptSplit(n_bootstrap=n_bootstrap, random_state=random_state).fit(
            data.lengths, data.groups, fitter.model_, fitter.max_len_
        )
    drift, drift_source = None, None
    if data.steps is not None and data.lengths is not None:
        drift = DriftFitter().fit(data.steps, data.lengths)
        # the pooled fit is the average over steps; move it to step 0, where drift scale is 1
        mean_scale = float(np.mean([drift.scale_at(s) for s in np.unique(data.steps)]))
        if mean_scale > 0 and np.isfinite(mean_scale):
            model = model.scaled(1.0 / mean_scale)  # type: ignore[attr-defined]
        drift_source = "step column"
    if drift_from is not None:
        if drift is not None:
            raise LengthDataError("give either a step column or --drift-from, not both")
        drift, drift_source = (_drift_of_curve(drift_from, drift_column, max_skipped),
                               str(drift_from))
    return FitReport(data=data, fitter=fitter, model=model, prompt_split=split, drift=drift,
                     drift_source=drift_source)


def _drift_of_curve(path: str | Path, column: str | None, max_skipped: float | None) -> Any:
    """The drift fitted on a mean-length curve file (`--drift-from`)."""
    from aprilsim.workload.fitting.drift_fit import DriftFitter

    curve = read_lengths(path, column, "none", None, round_values=True)
    check_skipped(curve, max_skipped)
    if curve.steps is None or curve.lengths is None:
        raise LengthDataError(f"{path}: no step column found; name it with a step column")
    return DriftFitter().fit(curve.steps, curve.lengths)
