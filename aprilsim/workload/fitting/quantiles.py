"""Quantiles and capped share of what the simulator would draw: min(ceil(X), max_len)."""

from __future__ import annotations

import numpy as np

from aprilsim.workload.lengths import LengthModel

QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.99)


def capped_quantiles(model: LengthModel, max_len: int | None, qs=QUANTILES) -> dict[str, float]:
    """p50/p90/p99 of integer lengths drawn from `model` and capped at `max_len`."""
    x = np.asarray(model.ppf(np.asarray(qs, float)), float)
    x = np.maximum(np.ceil(np.nan_to_num(x, nan=np.inf)), 1.0)
    if max_len is not None:
        x = np.minimum(x, max_len)
    return {f"p{round(q * 100)}": float(v) for q, v in zip(qs, x, strict=True)}


def capped_share(model: LengthModel, max_len: int | None) -> float:
    """P(length >= max_len) = P(X > max_len - 1): the share of responses that would be cut."""
    if max_len is None:
        return 0.0
    return float(np.asarray(model.sf(np.array([max_len - 1.0])))[0])
