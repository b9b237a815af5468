"""Goodness of fit on integer, possibly capped, lengths: KS, Anderson-Darling, AIC, BIC.

Both distances compare the empirical CDF of L = ceil(X) with the model's P(L <= k) = F(k) below the
cap (a capped response is only known to be >= max_len, so the comparison stops there, as in the
censored Anderson-Darling of Pettitt & Stephens). The Anderson-Darling sum over integers is
evaluated in closed form between observed values, so it costs O(distinct lengths). With a million
lengths every family is rejected by any test; the statistics are for comparing families, not
p-values.
"""

from __future__ import annotations

import numpy as np

from aprilsim.workload.fitting.censoring import CensoredHistogram


def aic(loglik: float, k: int) -> float:
    return 2.0 * k - 2.0 * loglik


def bic(loglik: float, k: int, n: int) -> float:
    return k * float(np.log(max(n, 1))) - 2.0 * loglik


def _ecdf(data: CensoredHistogram) -> np.ndarray:
    return np.cumsum(data.counts) / data.n


def ks_statistic(cdf, data: CensoredHistogram) -> float:
    """sup over integers below the cap of |F_n(k) - F(k)| (checked at both ends of every gap)."""
    if len(data.values) == 0:
        return 0.0
    fn = _ecdf(data)
    v = data.values.astype(float)
    at = np.abs(fn - np.asarray(cdf(v), float))
    before = np.abs(
        np.concatenate([[0.0], fn[:-1]]) - np.asarray(cdf(np.asarray(data.lower, float)), float)
    )
    d = max(float(at.max()), float(before.max()))
    if data.max_len is not None and data.n_censored:
        d = max(d, abs(fn[-1] - float(cdf(np.array([data.max_len - 1.0]))[0])))
    return d


def _piece(c: np.ndarray, ua: np.ndarray, ub: np.ndarray, eps: float) -> np.ndarray:
    """Integral of (c - u)^2 / (u (1 - u)) du from ua to ub, for constant c, with u kept in
    [eps, 1 - eps] (eps = 1/(2n), the resolution of the data; a model with no mass where data lie,
    such as a thinned empirical law, would otherwise score infinity)."""
    ua = np.clip(ua, eps, 1 - eps)
    ub = np.clip(ub, eps, 1 - eps)
    ub = np.maximum(ub, ua)
    with np.errstate(divide="ignore", invalid="ignore"):
        t1 = np.where(c > 0, c * c * (np.log(ub) - np.log(ua)), 0.0)
        t2 = np.where(c < 1, (1 - c) ** 2 * (np.log1p(-ub) - np.log1p(-ua)), 0.0)
    return t1 - t2 - (ub - ua)


def ad_statistic(cdf, data: CensoredHistogram) -> float:
    """Anderson-Darling A^2 = n * integral of (F_n - F)^2 / (F (1 - F)) dF, up to the cap."""
    if len(data.values) == 0:
        return 0.0
    fn = _ecdf(data)
    f_before = np.asarray(
        cdf(np.asarray(data.lower, float)), float
    )  # model P(L < v_i): where the i-th step starts
    end = float(cdf(np.array([data.max_len - 1.0]))[0]) if data.n_censored else 1.0
    f_next = np.concatenate([f_before[1:], [end]])
    eps = 0.5 / data.n
    first = _piece(np.array([0.0]), np.array([0.0]), f_before[:1], eps)
    total = float(first.sum() + _piece(fn, f_before, f_next, eps).sum())
    return float(data.n * total) if np.isfinite(total) else float("inf")
