"""The candidate families as (unconstrained parameters) -> (cdf, sf) maps, fast enough to optimise.

Each family knows how to start from simple data summaries, how to map an unconstrained vector
`theta` to its natural parameters (logs of positive ones, softmax for mixture weights), and how to
evaluate its CDF and survival function with scipy.special directly (no frozen scipy object per
evaluation). `to_model` returns the frozen `aprilsim.workload.lengths` model the simulator uses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import special

from aprilsim.workload.fitting.names import ALL_FAMILIES as ALL_FAMILIES  # re-exported
from aprilsim.workload.fitting.names import PARAMETRIC_FAMILIES
from aprilsim.workload.lengths import LengthModel, LognormalMixture, Parametric, expect_model

Array = np.ndarray


@dataclass(frozen=True)
class Summary:
    """Weighted summaries of log lengths used for starting values."""

    mean_log: float
    sd_log: float
    mean: float
    var: float
    median: float
    log_values: Array
    weights: Array


def summarise(x: Array, counts: Array) -> Summary:
    """Summaries of stand-in values `x` (bin midpoints: for ceil(X) = k, k - 1/2) with counts."""
    x = np.maximum(np.asarray(x, float), 0.5)
    w = counts / counts.sum()
    lx = np.log(x)
    m = float(w @ lx)
    sd = float(np.sqrt(max(w @ (lx - m) ** 2, 1e-4)))
    mean = float(w @ x)
    var = float(max(w @ (x - mean) ** 2, 1e-6 * mean * mean + 1e-6))
    med = float(x[np.searchsorted(np.cumsum(w), 0.5)])
    return Summary(m, sd, mean, var, med, lx, w)


@dataclass(frozen=True)
class Family:
    """One candidate family: parameter maps, CDF/SF, starting points, frozen model."""

    name: str
    n_params: int
    natural: Callable[[Array], dict[str, float]]
    cdf_sf: Callable[[Array, Array], tuple[Array, Array]]
    starts: Callable[[Summary], list[Array]]
    build: Callable[[dict[str, float]], LengthModel]
    bounds: tuple[tuple[float, float], ...]
    unconstrain: Callable[[LengthModel], Array]
    # optional analytic derivative: theta, x -> (cdf, sf, dcdf/dtheta of shape (len(x), n_params));
    # with it the optimiser needs one evaluation per gradient instead of n_params + 1
    cdf_sf_grad: Callable[[Array, Array], tuple[Array, Array, Array]] | None = None

    def to_model(self, theta: Array) -> LengthModel:
        return self.build(self.natural(theta))


_LOG = (-9.0, 9.0)
_INV_SQRT2PI = 1.0 / np.sqrt(2.0 * np.pi)
_MU = (-10.0, 25.0)


def _lognormal_cdf_sf(theta: Array, x: Array) -> tuple[Array, Array]:
    mu, s = theta[0], np.exp(theta[1])
    with np.errstate(divide="ignore"):
        z = (np.log(x) - mu) / s
    return special.ndtr(z), special.ndtr(-z)


def _gamma_cdf_sf(theta: Array, x: Array) -> tuple[Array, Array]:
    a, sc = np.exp(theta[0]), np.exp(theta[1])
    t = x / sc
    return special.gammainc(a, t), special.gammaincc(a, t)


def _weibull_cdf_sf(theta: Array, x: Array) -> tuple[Array, Array]:
    c, sc = np.exp(theta[0]), np.exp(theta[1])
    t = (x / sc) ** c
    return -np.expm1(-t), np.exp(-t)


def _loglogistic_cdf_sf(theta: Array, x: Array) -> tuple[Array, Array]:
    c, sc = np.exp(theta[0]), np.exp(theta[1])
    with np.errstate(divide="ignore"):
        lt = c * (np.log(x) - np.log(sc))
    return special.expit(lt), special.expit(-lt)


def _gengamma_cdf_sf(theta: Array, x: Array) -> tuple[Array, Array]:
    a, c, sc = np.exp(theta[0]), np.exp(theta[1]), np.exp(theta[2])
    with np.errstate(over="ignore"):
        t = (x / sc) ** c
    return special.gammainc(a, t), special.gammaincc(a, t)


_GAMMA_DA = 1e-5  # step in log a of the central difference for dP/dlog a

# Analytic gradients (theta, x -> cdf, sf, dcdf/dtheta): with them BFGS needs one evaluation per
# gradient instead of n_params + 1, and its line searches no longer fail on finite-difference
# noise near the optimum (which made a bootstrap refit of the gamma take 20+ steps). Where a
# term is 0 * inf (x = 0, the lower edge of the first bin) it is 0: F is flat there.


def _finite(a: Array) -> Array:
    return np.where(np.isfinite(a), a, 0.0)


def _lognormal_cdf_sf_grad(theta: Array, x: Array) -> tuple[Array, Array, Array]:
    # z = (log x - mu) / s: dF/dmu = -phi(z) / s, dF/dlog s = -phi(z) z
    s = np.exp(theta[1])
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (np.log(x) - theta[0]) / s
        phi = np.exp(-0.5 * z * z) * _INV_SQRT2PI
        dz = _finite(-phi * z)
    return special.ndtr(z), special.ndtr(-z), np.column_stack([-phi / s, dz])


def _gamma_terms(a: float, t: Array, log_t: Array, cdf: Array) -> tuple[Array, Array]:
    """g = t^a e^-t / Gamma(a) (= t dP/dt) and dP/dlog a for P(a, t). dP/da has no closed form
    in scipy: a central difference in log a, on P below the median and on Q = 1 - P above it, so
    the tail bins keep their relative precision."""
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        g = _finite(np.where(t > 0, np.exp(a * log_t - t - special.gammaln(a)), 0.0))
        hi, lo = a * np.exp(_GAMMA_DA), a * np.exp(-_GAMMA_DA)
        below = cdf < 0.5
        da = np.empty_like(cdf)
        tb, ta = t[below], t[~below]
        da[below] = special.gammainc(hi, tb) - special.gammainc(lo, tb)
        da[~below] = special.gammaincc(lo, ta) - special.gammaincc(hi, ta)
        da /= 2 * _GAMMA_DA
    return g, _finite(da)


def _gamma_cdf_sf_grad(theta: Array, x: Array) -> tuple[Array, Array, Array]:
    # F = P(a, x / scale): dF/dlog scale = -g
    a, sc = np.exp(theta[0]), np.exp(theta[1])
    t = x / sc
    cdf, sf = special.gammainc(a, t), special.gammaincc(a, t)
    with np.errstate(divide="ignore"):
        g, da = _gamma_terms(a, t, np.log(t), cdf)
    return cdf, sf, np.column_stack([da, -g])


def _weibull_cdf_sf_grad(theta: Array, x: Array) -> tuple[Array, Array, Array]:
    # F = 1 - exp(-t), t = (x / scale)^c: dF/dt = exp(-t), dt/dlog c = t log t, dt/dlog scale = -c t
    c, sc = np.exp(theta[0]), np.exp(theta[1])
    t = (x / sc) ** c
    cdf, sf = -np.expm1(-t), np.exp(-t)
    with np.errstate(divide="ignore", invalid="ignore"):
        dc = _finite(np.where(t > 0, sf * t * np.log(t), 0.0))
    return cdf, sf, np.column_stack([dc, -c * sf * t])


def _loglogistic_cdf_sf_grad(theta: Array, x: Array) -> tuple[Array, Array, Array]:
    # F = expit(l), l = c (log x - log scale): dF/dl = F (1 - F), dl/dlog c = l, dl/dlog scale = -c
    c, sc = np.exp(theta[0]), np.exp(theta[1])
    with np.errstate(divide="ignore", invalid="ignore"):
        lt = c * (np.log(x) - np.log(sc))
        cdf, sf = special.expit(lt), special.expit(-lt)
        dens = cdf * sf
        dc = _finite(dens * lt)
    return cdf, sf, np.column_stack([dc, -c * dens])


def _gengamma_cdf_sf_grad(theta: Array, x: Array) -> tuple[Array, Array, Array]:
    # F = P(a, t), t = (x / scale)^c, theta = log(a, c, scale). With u = log t:
    # dF/dlog c = g u, dF/dlog scale = -c g (g and dP/dlog a from `_gamma_terms`)
    a, c = np.exp(theta[0]), np.exp(theta[1])
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        u = c * (np.log(x) - theta[2])
        t = np.exp(u)
        cdf, sf = special.gammainc(a, t), special.gammaincc(a, t)
        g, da = _gamma_terms(a, t, u, cdf)
        gu = np.where(g > 0, g * u, 0.0)
    return cdf, sf, np.column_stack([da, gu, -c * g])


def _gamma_start(s: Summary) -> list[Array]:
    shape = s.mean**2 / s.var
    return [np.log([shape, s.mean / shape])]


def _weibull_start(s: Summary) -> list[Array]:
    c = 1.2 / max(s.sd_log, 0.05)  # sd of log Weibull = pi / (c sqrt 6)
    return [np.array([np.log(c), s.mean_log + 0.5772 / c])]


def _loglogistic_start(s: Summary) -> list[Array]:
    c = np.pi / np.sqrt(3) / max(s.sd_log, 0.05)
    return [np.array([np.log(c), np.log(s.median)])]


def _gengamma_starts(s: Summary) -> list[Array]:
    g = _gamma_start(s)[0]
    w = _weibull_start(s)[0]
    # near-lognormal corner: large a, small c with matching log mean and variance
    a = 20.0
    c = np.sqrt(special.polygamma(1, a)) / max(s.sd_log, 0.05)
    scale = np.exp(s.mean_log - special.digamma(a) / c)
    return [
        np.array([g[0], 0.0, g[1]]),
        np.array([0.0, w[0], w[1]]),
        np.log([a, c, scale]),
    ]


def _clip_theta(theta: Array, bounds) -> Array:
    lo, hi = np.array(bounds).T
    return np.clip(theta, lo + 1e-6, hi - 1e-6)


def _parametric(
    name: str,
    keys: tuple[str, ...],
    log_keys: tuple[bool, ...],
    cdf_sf,
    starts,
    bounds,
    cdf_sf_grad=None,
):
    def natural(theta: Array) -> dict[str, float]:
        return {
            k: float(np.exp(t) if is_log else t)
            for k, t, is_log in zip(keys, theta, log_keys, strict=True)
        }

    def unconstrain(model: LengthModel) -> Array:
        p = expect_model(model, Parametric).params
        return np.array(
            [np.log(p[k]) if is_log else p[k] for k, is_log in zip(keys, log_keys, strict=True)]
        )

    return Family(
        name,
        len(keys),
        natural,
        cdf_sf,
        starts,
        lambda p: Parametric(name, p),
        bounds,
        unconstrain,
        cdf_sf_grad,
    )


def mixture_family(k: int) -> Family:
    """A mixture of k lognormals: theta = (k-1 weight logits, k mus, k log sigmas)."""

    def split(theta: Array) -> tuple[Array, Array, Array]:
        logits = np.concatenate([[0.0], theta[: k - 1]])
        w = special.softmax(logits)
        return w, theta[k - 1 : 2 * k - 1], np.exp(theta[2 * k - 1 :])

    def natural(theta: Array) -> dict[str, float]:
        w, mu, s = split(theta)
        out: dict[str, float] = {}
        for i in range(k):
            out[f"w{i}"], out[f"mu{i}"], out[f"sigma{i}"] = float(w[i]), float(mu[i]), float(s[i])
        return out

    def cdf_sf(theta: Array, x: Array) -> tuple[Array, Array]:
        w, mu, s = split(theta)
        with np.errstate(divide="ignore"):
            z = (np.log(x)[:, None] - mu) / s
        return special.ndtr(z) @ w, special.ndtr(-z) @ w

    def cdf_sf_grad(theta: Array, x: Array) -> tuple[Array, Array, Array]:
        # F = sum_j w_j Phi(z_j), z_j = (log x - mu_j) / sigma_j, w = softmax(0, logits):
        # dF/dlogit_m = w_m (Phi_m - F), dF/dmu_j = -w_j phi_j / sigma_j,
        # dF/dlog sigma_j = -w_j phi_j z_j
        w, mu, s = split(theta)
        with np.errstate(divide="ignore", invalid="ignore"):
            z = (np.log(x)[:, None] - mu) / s
            cdf_j = special.ndtr(z)
            cdf = cdf_j @ w
            sf = special.ndtr(-z) @ w
            phi = np.exp(-0.5 * z * z) * _INV_SQRT2PI
            phi_z = np.where(np.isfinite(z), phi * z, 0.0)
        grad = np.empty((len(x), 3 * k - 1))
        grad[:, : k - 1] = w[1:] * (cdf_j[:, 1:] - cdf[:, None])
        grad[:, k - 1 : 2 * k - 1] = -(w / s) * phi
        grad[:, 2 * k - 1 :] = -w * phi_z
        return cdf, sf, grad

    def build(p: dict[str, float]) -> LengthModel:
        order = sorted(range(k), key=lambda i: p[f"mu{i}"])
        return LognormalMixture(
            tuple(p[f"w{i}"] for i in order),
            tuple(p[f"mu{i}"] for i in order),
            tuple(p[f"sigma{i}"] for i in order),
        )

    def unconstrain(model: LengthModel) -> Array:
        mix = expect_model(model, LognormalMixture)
        w = np.asarray(mix.weights)
        logits = np.log(np.maximum(w[1:], 1e-12) / max(w[0], 1e-12))
        return np.concatenate([logits, mix.mus, np.log(mix.sigmas)])

    def starts(s: Summary) -> list[Array]:
        # equal-weight slices of the sorted log lengths (refined by EM before optimisation)
        cum = np.cumsum(s.weights)
        mus, sds = [], []
        for i in range(k):
            sel = (cum > i / k) & (cum <= (i + 1) / k + 1e-12)
            lx, ww = s.log_values[sel], s.weights[sel]
            if ww.sum() <= 0:
                lx, ww = s.log_values, s.weights
            m = float(ww @ lx / ww.sum())
            mus.append(m)
            sds.append(max(float(np.sqrt(ww @ (lx - m) ** 2 / ww.sum())), s.sd_log / (2 * k), 0.05))
        return [np.concatenate([np.zeros(k - 1), mus, np.log(sds)])]

    bounds = ((-12.0, 12.0),) * (k - 1) + (_MU,) * k + ((-5.0, 3.0),) * k
    return Family(f"lognormal_mixture{k}", 3 * k - 1, natural, cdf_sf, starts, build, bounds,
                  unconstrain, cdf_sf_grad)


FAMILY_SPECS: dict[str, Family] = {
    "lognormal": _parametric(
        "lognormal",
        ("mu", "sigma"),
        (False, True),
        _lognormal_cdf_sf,
        lambda s: [np.array([s.mean_log, np.log(s.sd_log)])],
        (_MU, (-5.0, 3.0)),
        _lognormal_cdf_sf_grad,
    ),
    "gamma": _parametric(
        "gamma",
        ("shape", "scale"),
        (True, True),
        _gamma_cdf_sf,
        _gamma_start,
        (_LOG, (-9.0, 25.0)),
        _gamma_cdf_sf_grad,
    ),
    "weibull": _parametric(
        "weibull",
        ("shape", "scale"),
        (True, True),
        _weibull_cdf_sf,
        _weibull_start,
        (_LOG, (-9.0, 25.0)),
        _weibull_cdf_sf_grad,
    ),
    "loglogistic": _parametric(
        "loglogistic",
        ("shape", "scale"),
        (True, True),
        _loglogistic_cdf_sf,
        _loglogistic_start,
        (_LOG, (-9.0, 25.0)),
        _loglogistic_cdf_sf_grad,
    ),
    "gengamma": _parametric(
        "gengamma",
        ("a", "c", "scale"),
        (True, True, True),
        _gengamma_cdf_sf,
        _gengamma_starts,
        ((-7.0, 8.0), (-7.0, 4.0), (-700.0, 50.0)),
        _gengamma_cdf_sf_grad,
    ),
    "lognormal_mixture2": mixture_family(2),
    "lognormal_mixture3": mixture_family(3),
}
assert tuple(FAMILY_SPECS) == PARAMETRIC_FAMILIES, "names.py lists the families in this order"


def clip_theta(family: Family, theta: Array) -> Array:
    return _clip_theta(np.asarray(theta, float), family.bounds)
