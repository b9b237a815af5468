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
    `RegimeError` rows over every record, as the residual plot shows them; ``raw_errors_`` is
    the same), ``residuals_`` (relative error per record),
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
        check_enough(records, self.form)
        if self.robust:
            binned = bin_records(records)
            fit_on, weights = [r for r, _ in binned], [float(n) for _, n in binned]
        else:
            fit_on, weights = records, None
        self.cost_: CostModel | TabulatedCost = fit_cost(fit_on, self.form, self.max_knots, weights)
        self.records_ = records
        self.residuals_: np.ndarray = relative_errors(self.cost_, records)
        self.raw_errors_: list[RegimeError] = regime_errors(self.cost_, records, self.bounds)
        # one error definition for the table, the preset and the plot: every record's
        # (predicted - measured) / measured (``robust`` changes what is fitted, not what is shown)
        self.errors_: list[RegimeError] = self.raw_errors_
        return self

    def predict(self, records: Sequence[Record]) -> np.ndarray:
        """Predicted seconds per record."""
        from .fit import predict

        return np.array([predict(self.cost_, r) for r in records])


def check_enough(records: Sequence[Record], form: str) -> None:
    """Refuse records that cannot tell the coefficients apart (a fit through them would be
    exact and its 0 % error meaningless): more distinct decode shapes (B, K) than the form has
    coefficients, and, where prefill records are given, at least three distinct prefill sizes
    (p0, p1, p2)."""
    shapes = {(r.batch_size, round(r.kv_tokens, 6)) for r in records if r.phase == "decode"}
    batches = {b for b, _ in shapes}
    need = 3 if form == "linear" else 2 * len(batches)
    if len(shapes) <= need or len(batches) < 2:
        raise ValueError(f"{len(shapes)} distinct decode shape(s) (B, K) over {len(batches)} batch "
                         f"size(s) cannot fit the {form} form's {need} coefficients with an error "
                         f"estimate: need more than {need}, over at least 2 batch sizes")
    sizes = {(r.prefill_tokens, r.batch_size) for r in records if r.phase == "prefill"}
    if 0 < len(sizes) < 3:
        raise ValueError(f"{len(sizes)} distinct prefill shape(s) cannot fit p0, p1, p2: need at "
                         "least 3 (or no prefill records: prefill costs then stay 0)")
