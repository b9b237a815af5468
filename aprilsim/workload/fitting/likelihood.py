"""The censored likelihood of integer lengths, and its maximisation.

A logged length L is the integer ceil(X) of a continuous X (as `cap_lengths` draws them), so an
exact observation k contributes P(k-1 < X <= k) and a capped one P(X > max_len - 1): the model the
simulator samples from is exactly the one being fitted. Everything runs on the histogram, so one
evaluation costs O(distinct lengths), not O(rows).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import optimize

from aprilsim.workload.fitting.censoring import CensoredHistogram
from aprilsim.workload.fitting.families import Family, clip_theta

TINY = 1e-300


@dataclass(frozen=True)
class Grid:
    """The points where the CDF must be evaluated, and where each observation's terms sit."""

    x: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    cens: int | None

    @classmethod
    def of(cls, data: CensoredHistogram) -> Grid:
        pts = [np.asarray(data.lower, float), data.values.astype(float)]
        if data.max_len is not None:
            pts.append(np.array([data.max_len - 1.0]))
        x, inv = np.unique(np.concatenate(pts), return_inverse=True)
        n = len(data.values)
        cens = int(inv[2 * n]) if data.max_len is not None else None
        return cls(x, inv[:n], inv[n : 2 * n], cens)


def interval_logprob(cdf: np.ndarray, sf: np.ndarray, grid: Grid) -> tuple[np.ndarray, float]:
    """log P(L = k) for each exact value and log P(L >= max_len) (0.0 when uncensored)."""
    flo, fhi, slo, shi = cdf[grid.lo], cdf[grid.hi], sf[grid.lo], sf[grid.hi]
    # subtract on whichever side of the median keeps precision
    p = np.where(flo < 0.5, fhi - flo, slo - shi)
    with np.errstate(divide="ignore", invalid="ignore"):
        lp = np.log(np.maximum(p, TINY))
        lc = float(np.log(max(sf[grid.cens], TINY))) if grid.cens is not None else 0.0
    return lp, lc


def loglik(family: Family, theta: np.ndarray, data: CensoredHistogram, grid: Grid) -> float:
    cdf, sf = family.cdf_sf(theta, grid.x)
    lp, lc = interval_logprob(cdf, sf, grid)
    ll = float(data.counts @ lp) + data.n_censored * lc
    return ll if np.isfinite(ll) else -np.inf


def loglik_and_grad(
    family: Family, theta: np.ndarray, data: CensoredHistogram, grid: Grid
) -> tuple[float, np.ndarray]:
    """The log-likelihood and its gradient in theta (needs `family.cdf_sf_grad`)."""
    assert family.cdf_sf_grad is not None
    cdf, sf, dcdf = family.cdf_sf_grad(theta, grid.x)
    lp, lc = interval_logprob(cdf, sf, grid)
    ll = float(data.counts @ lp) + data.n_censored * lc
    # d log(F(hi) - F(lo)) = (dF(hi) - dF(lo)) / p on both branches of interval_logprob
    # where a probability is clamped at TINY the objective is flat: no gradient there
    p = np.exp(lp)
    weight = np.where(p > TINY, data.counts / np.maximum(p, TINY), 0.0)
    g = weight @ (dcdf[grid.hi] - dcdf[grid.lo])
    if grid.cens is not None and data.n_censored and sf[grid.cens] > TINY:
        g = g - data.n_censored * dcdf[grid.cens] / sf[grid.cens]
    if not np.isfinite(ll) or not np.all(np.isfinite(g)):
        return -np.inf, np.zeros_like(theta)
    return ll, g


def model_loglik(model, data: CensoredHistogram, grid: Grid | None = None) -> float:
    """The same likelihood for any frozen model (e.g. an Empirical one)."""
    grid = grid or Grid.of(data)
    cdf, sf = np.asarray(model.cdf(grid.x), float), np.asarray(model.sf(grid.x), float)
    lp, lc = interval_logprob(cdf, sf, grid)
    return float(data.counts @ lp) + data.n_censored * lc


@dataclass(frozen=True)
class Optimum:
    theta: np.ndarray
    loglik: float
    converged: bool
    n_iter: int = 0  # BFGS iterations of the winning start


def inverse_hessian(
    family: Family, data: CensoredHistogram, theta: np.ndarray, grid: Grid | None = None
) -> np.ndarray | None:
    """The inverse Hessian of the objective `maximise` minimises (-loglik / n) at `theta`, by
    central differences of the analytic gradient, or None when it is not positive definite (e.g.
    at a bound) or the family has no gradient.

    A bootstrap refit starts BFGS with it: the resampled optimum is O(1/sqrt(n)) away from the
    full-data one, where this curvature is nearly exact, so BFGS needs a few steps instead of
    rebuilding the curvature from the identity (tens of steps). The refit is still a full
    maximisation to the same tolerance: only its path changes, not where it ends.
    """
    grid = grid or Grid.of(data)
    n = max(data.n, 1)
    t0 = clip_theta(family, theta)
    lo_b, hi_b = np.array(family.bounds).T
    p = len(t0)
    h = 1e-4 * np.maximum(1.0, np.abs(t0))
    if np.any(t0 - h <= lo_b + 1e-6) or np.any(t0 + h >= hi_b - 1e-6):
        return None
    if family.cdf_sf_grad is None:
        return None  # every built-in family has a gradient; without one, BFGS starts plain
    rows = []
    with np.errstate(all="ignore"):
        for i in range(p):
            e = np.zeros(p)
            e[i] = h[i]
            g_hi = loglik_and_grad(family, t0 + e, data, grid)[1]
            g_lo = loglik_and_grad(family, t0 - e, data, grid)[1]
            rows.append(-(g_hi - g_lo) / (2 * h[i] * n))
    hess = np.array(rows)
    hess = (hess + hess.T) / 2
    if not np.all(np.isfinite(hess)):
        return None
    try:
        vals, vecs = np.linalg.eigh(hess)
    except np.linalg.LinAlgError:
        return None
    if vals.min() <= 1e-12 * max(vals.max(), 1e-300):
        return None
    inv = (vecs / vals) @ vecs.T
    return (inv + inv.T) / 2  # exactly symmetric, as BFGS checks


def maximise(
    family: Family,
    data: CensoredHistogram,
    starts: list[np.ndarray],
    grid: Grid | None = None,
    maxiter: int = 500,
    n_best: int | None = None,
    use_gradient: bool = True,
    hess_inv0: np.ndarray | None = None,
) -> Optimum:
    """Maximise the likelihood from each start, or only from the `n_best` starts with the
    highest likelihood (each run costs tens of evaluations).

    BFGS on the unconstrained parameters, with the bounds enforced by clipping inside the
    objective: unlike L-BFGS-B it does no BLAS calls on tiny vectors, whose thread start-up made
    the optimiser's own overhead dominate on a busy multi-core machine (3x slower). Families
    with an analytic gradient (the mixtures) pass it to BFGS: one evaluation per gradient instead
    of n_params + 1 finite-difference ones, which is most of the cost of a bootstrap.
    `hess_inv0` seeds BFGS's inverse Hessian (see `inverse_hessian`; the bootstrap passes it).
    """
    grid = grid or Grid.of(data)
    n = max(data.n, 1)

    def nll(theta: np.ndarray) -> float:
        ll = loglik(family, clip_theta(family, theta), data, grid)
        return -ll / n if np.isfinite(ll) else 1e10

    jac = None
    if use_gradient and family.cdf_sf_grad is not None:
        lo_b, hi_b = np.array(family.bounds).T

        def nll_grad(theta: np.ndarray) -> tuple[float, np.ndarray]:
            t = clip_theta(family, theta)
            ll, g = loglik_and_grad(family, t, data, grid)
            if not np.isfinite(ll):
                return 1e10, np.zeros_like(theta)
            # the objective is flat where clipping is active
            g = np.where((theta <= lo_b + 1e-6) | (theta >= hi_b - 1e-6), 0.0, g)
            return -ll / n, -g / n

        jac = True

    if n_best is not None and len(starts) > n_best:
        starts = sorted(starts, key=lambda t: nll(clip_theta(family, t)))[:n_best]
    options: dict = {"maxiter": maxiter, "gtol": 1e-7, "xrtol": 1e-9}
    if hess_inv0 is not None:
        options["hess_inv0"] = hess_inv0
    best: Optimum | None = None
    for start in starts:
        x0 = clip_theta(family, start)
        with np.errstate(all="ignore"):
            res = optimize.minimize(
                nll if jac is None else nll_grad,
                x0,
                method="BFGS",
                jac=jac,
                options=options,
            )
        theta = clip_theta(family, res.x)
        ll = loglik(family, theta, data, grid)
        # BFGS reports "precision loss" at a flat optimum; judge convergence by the gradient
        converged = bool(res.success) or "precision" in str(res.message).lower()
        cand = Optimum(theta, ll, converged and np.isfinite(ll), int(res.get("nit", 0)))
        if best is None or cand.loglik > best.loglik:
            best = cand
    assert best is not None
    return best
