"""`CostCalibrator`: the fitting routine as a small estimator (fit, then read attributes)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from aprilsim.engine.cost import CostModel, TabulatedCost

from .errors import DEFAULT_BOUNDS, RegimeError, regime_errors
from .fit import FORMS, bin_records, fit_cost, relative_errors
from .records import Record


class CostCalibrator:
    """Fit a cost model to timing records.

    ``CostCalibrator(form="tables").fit(records)`` returns the calibrator; the learned attributes
    end in ``_``: ``cost_`` (a `CostModel` or `TabulatedCost`), ``errors_`` (the per-regime
    `RegimeError` rows, over bin medians when ``robust``), ``raw_errors_`` (the same over every
    record: per-step scatter included), ``residuals_`` (relative error per record),
    ``n_decode_``, ``n_prefill_``.

    ``robust=True`` (the default) fits the medians of steps of the same shape (`bin_records`)
    weighted by their counts instead of every step: measured step times on a shared machine have a
    long upper tail that would otherwise pull the fit low.
    """

    def __init__(self, form: str = "linear", max_knots: int = 12,
                 bounds: Sequence[int] = DEFAULT_BOUNDS, robust: bool = True) -> None:
        if form not in FORMS:
            raise ValueError(f"form must be one of {', '.join(FORMS)}, got {form!r}")
        self.form = form
        self.max_knots = max_knots
        self.bounds = tuple(bounds)
        self.robust = robust

    def fit(self, records: Sequence[Record]) -> CostCalibrator:
        """Fit decode and prefill coefficients; needs at least one decode record."""
        records = list(records)
        self.n_decode_ = sum(r.phase == "decode" for r in records)
        self.n_prefill_ = len(records) - self.n_decode_
        if self.n_decode_ == 0:
            raise ValueError("no decode records: a calibration needs decode iterations")
        if self.robust:
            binned = bin_records(records)
            fit_on, weights = [r for r, _ in binned], [float(n) for _, n in binned]
        else:
            fit_on, weights = records, None
        self.cost_: CostModel | TabulatedCost = fit_cost(fit_on, self.form, self.max_knots, weights)
        self.records_ = records
        self.residuals_: np.ndarray = relative_errors(self.cost_, records)
        self.raw_errors_: list[RegimeError] = regime_errors(self.cost_, records, self.bounds)
        self.errors_: list[RegimeError] = (regime_errors(self.cost_, fit_on, self.bounds, weights)
                                           if self.robust else self.raw_errors_)
        return self

    def predict(self, records: Sequence[Record]) -> np.ndarray:
        """Predicted seconds per record."""
        from .fit import predict

        return np.array([predict(self.cost_, r) for r in records])
