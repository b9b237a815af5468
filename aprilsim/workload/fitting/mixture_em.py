"""EM for a mixture of lognormals with right-censored observations (starting values for the MLE).

Works on log lengths: each exact length k stands at log(k - 1/2) (the middle of the interval it
encodes) with its count as weight; each capped response is only known to exceed log(max_len - 1).
The E-step gives capped responses responsibilities from the components' survival functions, and
the M-step uses the first two moments of each normal truncated below at the cap (standard EM for
censored normal mixtures). The result seeds the exact interval-censored maximisation.
"""

from __future__ import annotations

import numpy as np
from scipy import special

from aprilsim.workload.fitting.censoring import CensoredHistogram

_SQRT2PI = np.sqrt(2 * np.pi)


def em_lognormal_mixture(
    data: CensoredHistogram,
    weights: np.ndarray,
    mus: np.ndarray,
    sigmas: np.ndarray,
    max_iter: int = 300,
    tol: float = 1e-9,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Run EM from the given start; returns (weights, mus, sigmas)."""
    y = np.log(data.midpoints)
    n = data.counts.astype(float)
    nc = float(data.n_censored)
    c = np.log(data.max_len - 1.0) if data.max_len is not None and nc > 0 else None
    w, mu, s = (np.asarray(a, float).copy() for a in (weights, mus, sigmas))
    floor = 1e-3
    prev = -np.inf
    for _ in range(max_iter):
        z = (y[:, None] - mu) / s
        dens = w * np.exp(-0.5 * z * z) / (s * _SQRT2PI)
        tot = dens.sum(1, keepdims=True)
        ll = float(n @ np.log(np.maximum(tot[:, 0], 1e-300)))
        r = dens / np.maximum(tot, 1e-300)
        nk = n @ r
        sum1 = (n[:, None] * r * y[:, None]).sum(0)
        sum2 = (n[:, None] * r * y[:, None] ** 2).sum(0)
        if c is not None:
            a = (c - mu) / s
            surv = np.maximum(special.ndtr(-a), 1e-300)
            rc = w * surv / max((w * surv).sum(), 1e-300)
            ll += nc * float(np.log(max((w * surv).sum(), 1e-300)))
            lam = np.exp(-0.5 * a * a) / _SQRT2PI / surv
            m1 = mu + s * lam
            var = s * s * (1 + a * lam - lam * lam)
            m2 = var + m1 * m1
            nk = nk + nc * rc
            sum1 = sum1 + nc * rc * m1
            sum2 = sum2 + nc * rc * m2
        nk = np.maximum(nk, 1e-9)
        w = nk / nk.sum()
        mu = sum1 / nk
        s = np.sqrt(np.maximum(sum2 / nk - mu * mu, floor * floor))
        if abs(ll - prev) <= tol * max(abs(ll), 1.0):
            break
        prev = ll
    w = np.maximum(w, 1e-6)
    return w / w.sum(), mu, s
