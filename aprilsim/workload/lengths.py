"""Response-length models as frozen distributions (scipy.stats style).

Every model describes the *uncapped* length of a response; `cap_lengths` turns draws into integer
token counts capped at max_response_len (a point mass of truncated responses). Models are
immutable, serialise to a plain dict (`to_dict`, `length_model_from_dict`) so scenario files and
`aprilsim fit --out` share one format, and all support `ppf`, which the workload uses to draw
correlated lengths through a Gaussian copula.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy as np

# scipy loads on first use, not on import: the CLI and the simulator start without it


@runtime_checkable
class LengthModel(Protocol):
    """What the simulator needs of a length distribution."""

    @property
    def family(self) -> str: ...

    def ppf(self, q: np.ndarray) -> np.ndarray: ...
    def cdf(self, x: np.ndarray) -> np.ndarray: ...
    def sf(self, x: np.ndarray) -> np.ndarray: ...
    def pdf(self, x: np.ndarray) -> np.ndarray: ...
    def mean(self) -> float: ...
    def rvs(self, size: int, random_state: np.random.Generator) -> np.ndarray: ...
    def to_dict(self) -> dict[str, Any]: ...


M = TypeVar("M")


def expect_model(model: LengthModel, kind: type[M]) -> M:
    """`model` as the concrete law `kind` a caller relies on (its params, weights or values), or a
    TypeError naming both: fitting code reads each family's own fields through this."""
    if not isinstance(model, kind):
        raise TypeError(f"expected a {kind.__name__} length model, got {type(model).__name__}")
    return model


def _scipy_dist(family: str, p: dict[str, float]):
    from scipy import stats

    if family == "lognormal":
        return stats.lognorm(s=p["sigma"], scale=float(np.exp(p["mu"])))
    if family == "gamma":
        return stats.gamma(a=p["shape"], scale=p["scale"])
    if family == "weibull":
        return stats.weibull_min(c=p["shape"], scale=p["scale"])
    if family == "loglogistic":
        return stats.fisk(c=p["shape"], scale=p["scale"])
    if family == "gengamma":
        return stats.gengamma(a=p["a"], c=p["c"], scale=p["scale"])
    raise ValueError(f"unknown length family {family!r}")


def _special_cdf_sf(family: str, p: dict[str, float], x) -> tuple[np.ndarray, np.ndarray]:
    """(cdf, sf) of a one-component family from scipy.special alone: a fit evaluates these for
    every family, and scipy.stats (half a second to import) is then needed only for ppf and the
    moments of a parametric winner."""
    from scipy import special

    x = np.maximum(np.asarray(x, float), 0.0)  # NaN stays NaN
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        if family == "lognormal":
            z = (np.log(x) - p["mu"]) / p["sigma"]
            return special.ndtr(z), special.ndtr(-z)
        if family == "loglogistic":
            lt = p["shape"] * (np.log(x) - np.log(p["scale"]))
            return special.expit(lt), special.expit(-lt)
        t = x / p["scale"]
        if family == "gamma":
            return special.gammainc(p["shape"], t), special.gammaincc(p["shape"], t)
        if family == "weibull":
            u = t ** p["shape"]
            return -np.expm1(-u), np.exp(-u)
        u = t ** p["c"]  # gengamma (Stacy): P(a, (x / scale)^c)
        return special.gammainc(p["a"], u), special.gammaincc(p["a"], u)


PARAMETRIC_PARAMS: dict[str, tuple[str, ...]] = {
    "lognormal": ("mu", "sigma"),
    "gamma": ("shape", "scale"),
    "weibull": ("shape", "scale"),
    "loglogistic": ("shape", "scale"),
    "gengamma": ("a", "c", "scale"),
}


@dataclass(frozen=True)
class Parametric:
    """A one-component family from scipy.stats, frozen at `params`."""

    family: str
    params: dict[str, float]
    _frozen: Any = field(init=False, repr=False, compare=False)  # the scipy object, on first use

    def __post_init__(self) -> None:
        expected = PARAMETRIC_PARAMS.get(self.family)
        if expected is None:
            raise ValueError(f"unknown length family {self.family!r}; known: {sorted(FAMILIES)}")
        missing = [k for k in expected if k not in self.params]
        extra = [k for k in self.params if k not in expected]
        if missing or extra:
            raise ValueError(
                f"{self.family} takes parameters {list(expected)}; missing {missing}, "
                f"unknown {extra}"
            )
        for k, v in self.params.items():
            if not np.isfinite(v) or (k != "mu" and v <= 0):
                raise ValueError(f"{self.family}.{k} must be finite and positive, got {v}")
        object.__setattr__(self, "params", {k: float(self.params[k]) for k in expected})
        object.__setattr__(self, "_frozen", None)

    @property
    def _dist(self):
        """The frozen scipy.stats distribution, built on first use (scipy loads then)."""
        if self._frozen is None:
            object.__setattr__(self, "_frozen", _scipy_dist(self.family, self.params))
        return self._frozen

    def pdf(self, x):
        return self._dist.pdf(x)

    def logpdf(self, x):
        return self._dist.logpdf(x)

    def cdf(self, x):
        return _special_cdf_sf(self.family, self.params, x)[0]

    def sf(self, x):
        return _special_cdf_sf(self.family, self.params, x)[1]

    def logsf(self, x):
        return self._dist.logsf(x)

    def ppf(self, q):
        return self._dist.ppf(q)

    def mean(self) -> float:
        return float(self._dist.mean())

    def median(self) -> float:
        return float(self._dist.median())

    def rvs(self, size: int, random_state: np.random.Generator) -> np.ndarray:
        return self.ppf(random_state.random(size))

    def sample(self, size: int,
               random_state: int | np.random.Generator | None = None) -> np.ndarray:
        """`size` uncapped lengths from a seed or Generator (the fitting API's name for `rvs`)."""
        return self.rvs(size, np.random.default_rng(random_state))

    def scaled(self, factor: float) -> Parametric:
        """The same shape with every length multiplied by `factor` (used for drift)."""
        p = dict(self.params)
        if self.family == "lognormal":
            p["mu"] += float(np.log(factor))
        else:
            p["scale"] *= factor
        return Parametric(self.family, p)

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, **self.params}


@dataclass(frozen=True)
class LognormalMixture:
    """A mixture of lognormals: typical of reasoning RL (short answers plus long chains of
    thought)."""

    weights: tuple[float, ...]
    mus: tuple[float, ...]
    sigmas: tuple[float, ...]
    family: str = "lognormal_mixture"

    def __post_init__(self) -> None:
        w = np.asarray(self.weights, float)
        if not (len(w) == len(self.mus) == len(self.sigmas)) or len(w) == 0:
            raise ValueError("lognormal_mixture needs weights, mus and sigmas of one length")
        if np.any(w <= 0) or np.any(np.asarray(self.sigmas) <= 0):
            raise ValueError("lognormal_mixture weights and sigmas must be positive")
        object.__setattr__(self, "weights", tuple(float(x) for x in w / w.sum()))
        object.__setattr__(self, "mus", tuple(float(x) for x in self.mus))
        object.__setattr__(self, "sigmas", tuple(float(x) for x in self.sigmas))

    def _parts(self, x):
        x = np.asarray(x, float)[..., None]
        with np.errstate(divide="ignore"):
            z = (np.log(np.maximum(x, 1e-300)) - np.asarray(self.mus)) / np.asarray(self.sigmas)
        return x, z

    def pdf(self, x):
        xx, z = self._parts(x)
        dens = np.exp(-0.5 * z**2) / (np.asarray(self.sigmas) * np.sqrt(2 * np.pi) * xx)
        return np.where(xx[..., 0] > 0, (dens * self.weights).sum(-1), 0.0)

    def logpdf(self, x):
        with np.errstate(divide="ignore"):
            return np.log(self.pdf(x))

    def cdf(self, x):
        from scipy import special

        _, z = self._parts(x)
        return (special.ndtr(z) * self.weights).sum(-1)

    def sf(self, x):
        from scipy import special

        _, z = self._parts(x)
        return (special.ndtr(-z) * self.weights).sum(-1)

    def logsf(self, x):
        with np.errstate(divide="ignore"):
            return np.log(self.sf(x))

    def ppf(self, q):
        """Inverse CDF: interpolate a cached grid of the CDF in log length, then two Newton
        steps."""
        q = np.asarray(q, float)
        grid_logx, grid_cdf = self._grid()
        logx = np.interp(q, grid_cdf, grid_logx)
        for _ in range(2):
            x = np.exp(logx)
            pdf, cdf = self._pdf_cdf(x)
            dens = pdf * x  # density of log length
            step = (cdf - q) / np.maximum(dens, 1e-300)
            logx = logx - np.clip(step, -1.0, 1.0)
        out = np.exp(logx)
        out = np.where(q <= 0, 0.0, out)
        return np.where(q >= 1, np.inf, out)

    # a sum over this many components or more is pairwise in numpy (not left to right)
    _SEQUENTIAL_SUM = 8

    def _pdf_cdf(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(pdf(x), cdf(x)) in one pass, bit for bit what `pdf` and `cdf` return.

        Newton's step needs both at the same points: they share the log and the standardised
        z, and each component is a contiguous array of x's shape (no (..., K) broadcast and no
        reduction over a short last axis, which numpy iterates slowly). The components are
        added left to right, as numpy's sum over a last axis of fewer than 8 does; with more,
        the two methods themselves (numpy's pairwise order)."""
        from scipy import special

        if len(self.weights) >= self._SEQUENTIAL_SUM:
            return self.pdf(x), self.cdf(x)
        x = np.asarray(x, float)
        with np.errstate(divide="ignore"):
            lx = np.log(np.maximum(x, 1e-300))
        pdf = cdf = None
        for w, m, s, c in self._components():
            z = (lx - m) / s
            d = np.exp(-0.5 * z**2) / (c * x) * w
            p = special.ndtr(z) * w
            pdf = d if pdf is None else pdf + d
            cdf = p if cdf is None else cdf + p
        assert pdf is not None and cdf is not None
        return np.where(x > 0, pdf, 0.0), cdf

    def _components(self) -> tuple[tuple[float, float, float, float], ...]:
        """(weight, mu, sigma, sigma * sqrt(2 pi)) per component, the last as `pdf` computes it
        (cached: a frozen model's parts never change)."""
        cached = self.__dict__.get("_components_cache")
        if cached is None:
            norm = np.asarray(self.sigmas) * np.sqrt(2 * np.pi)
            cached = tuple(zip(self.weights, self.mus, self.sigmas, norm.tolist(), strict=True))
            object.__setattr__(self, "_components_cache", cached)
        return cached

    def _grid(self) -> tuple[np.ndarray, np.ndarray]:
        cached = self.__dict__.get("_grid_cache")
        if cached is None:
            lo = min(self.mus) - 9 * max(self.sigmas)
            hi = max(self.mus) + 9 * max(self.sigmas)
            logx = np.linspace(lo, hi, 4097)
            cdf = self.cdf(np.exp(logx))
            keep = np.concatenate([[True], np.diff(cdf) > 0])
            cached = (logx[keep], cdf[keep])
            object.__setattr__(self, "_grid_cache", cached)
        return cached

    def mean(self) -> float:
        return float(
            sum(w * np.exp(m + s * s / 2) for w, m, s in zip(self.weights, self.mus, self.sigmas))
        )

    def median(self) -> float:
        return float(self.ppf(np.array(0.5)))

    def rvs(self, size: int, random_state: np.random.Generator) -> np.ndarray:
        return self.ppf(random_state.random(size))

    def sample(self, size: int,
               random_state: int | np.random.Generator | None = None) -> np.ndarray:
        """`size` uncapped lengths from a seed or Generator (the fitting API's name for `rvs`)."""
        return self.rvs(size, np.random.default_rng(random_state))

    def scaled(self, factor: float) -> LognormalMixture:
        shift = float(np.log(factor))
        return LognormalMixture(self.weights, tuple(m + shift for m in self.mus), self.sigmas)

    def to_dict(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "weights": list(self.weights),
            "mus": list(self.mus),
            "sigmas": list(self.sigmas),
        }


@dataclass(frozen=True)
class Empirical:
    """The distribution of observed lengths (resampled as observed values, never interpolated)."""

    values: tuple[float, ...]
    family: str = "empirical"

    def __post_init__(self) -> None:
        v = np.sort(np.asarray(self.values, float))
        if v.size == 0 or not np.all(np.isfinite(v)) or v[0] <= 0:
            raise ValueError("empirical lengths must be a non-empty list of positive numbers")
        object.__setattr__(self, "values", tuple(float(x) for x in v))

    @property
    def _v(self) -> np.ndarray:
        return np.asarray(self.values)

    def cdf(self, x):
        return np.searchsorted(self._v, np.asarray(x, float), side="right") / len(self.values)

    def sf(self, x):
        return 1.0 - self.cdf(x)

    def pdf(self, x):
        """A histogram density on 50 log-spaced bins (for plots; the law itself is discrete)."""
        v = self._v
        edges = np.geomspace(v[0] * 0.999, v[-1] * 1.001, 51)
        dens, _ = np.histogram(v, bins=edges, density=True)
        idx = np.clip(np.searchsorted(edges, np.asarray(x, float)) - 1, 0, 49)
        inside = (np.asarray(x) >= edges[0]) & (np.asarray(x) <= edges[-1])
        return np.where(inside, dens[idx], 0.0)

    def ppf(self, q):
        q = np.asarray(q, float)
        idx = np.clip(np.ceil(q * len(self.values)).astype(int) - 1, 0, len(self.values) - 1)
        return self._v[idx]

    def mean(self) -> float:
        return float(np.mean(self._v))

    def median(self) -> float:
        return float(np.median(self._v))

    def rvs(self, size: int, random_state: np.random.Generator) -> np.ndarray:
        return self.ppf(random_state.random(size))

    def sample(self, size: int,
               random_state: int | np.random.Generator | None = None) -> np.ndarray:
        """`size` uncapped lengths from a seed or Generator (the fitting API's name for `rvs`)."""
        return self.rvs(size, np.random.default_rng(random_state))

    def scaled(self, factor: float) -> Empirical:
        return Empirical(tuple(v * factor for v in self.values))

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, "values": list(self.values)}


FAMILIES: tuple[str, ...] = (*PARAMETRIC_PARAMS, "lognormal_mixture", "empirical")


def length_model_from_dict(d: dict[str, Any]) -> LengthModel:
    """Build a model from its `to_dict()` form: {"family": ..., <params>}."""
    d = dict(d)
    family = d.pop("family", None)
    if family is None:
        raise ValueError("a length model needs a 'family' key")
    if family == "lognormal_mixture":
        unknown = set(d) - {"weights", "mus", "sigmas"}
        if unknown:
            raise ValueError(f"lognormal_mixture: unknown keys {sorted(unknown)}")
        return LognormalMixture(tuple(d["weights"]), tuple(d["mus"]), tuple(d["sigmas"]))
    if family == "empirical":
        unknown = set(d) - {"values"}
        if unknown:
            raise ValueError(f"empirical: unknown keys {sorted(unknown)}")
        return Empirical(tuple(d["values"]))
    return Parametric(family, {k: float(v) for k, v in d.items()})


DRAW_QUANTILES = (1e-9, 0.5, 1 - 2.0**-52)  # how far into its tails a uniform draw reaches
DRAW_Z = 8.3  # the standard normal quantile past the largest uniform draw (1 - 2^-53)
MAX_MEDIAN_TOKENS = 1e12  # a median past this is no response length (and e^mu overflows soon after)
_LOG_MAX = math.log(np.finfo(float).max)


def check_drawable(model: LengthModel) -> None:
    """ValueError (one line) when draws from `model` are no token counts: its median overflows
    or lies past 1e12 tokens (`mu = 2^62`), or its largest draws overflow float64
    (`sigma = 1e30`). Checked before a run, so an absurd parameter is refused instead of
    simulated under numpy's overflow warnings; lognormals are checked in closed form (no scipy
    at start-up), other families through their quantiles."""
    params = ", ".join(f"{k}={v:g}" for k, v in model.to_dict().items()
                       if isinstance(v, (int, float)) and not isinstance(v, bool))
    what = f"{model.family}({params})" if params else model.family
    parts = _lognormal_parts(model)
    if parts is not None:
        for mu, sigma in parts:
            _check_median(what, math.exp(mu) if mu < _LOG_MAX else math.inf)
            if mu + DRAW_Z * sigma >= _LOG_MAX:
                raise ValueError(f"{what}: its largest draws overflow float64 (mu + 8.3 sigma = "
                                 f"{mu + DRAW_Z * sigma:.3g} > {_LOG_MAX:.0f}); a response length "
                                 "model needs a finite spread (a lognormal's sigma: a few units)")
        return
    if isinstance(model, Empirical):
        return  # its values were checked when it was built
    _check_quantiles(model, what)


def _lognormal_parts(model: LengthModel) -> list[tuple[float, float]] | None:
    if isinstance(model, Parametric) and model.family == "lognormal":
        return [(model.params["mu"], model.params["sigma"])]
    if isinstance(model, LognormalMixture):
        return list(zip(model.mus, model.sigmas))
    return None


def _check_median(what: str, median: float) -> None:
    if not (0 < median <= MAX_MEDIAN_TOKENS):
        raise ValueError(f"{what}: its median is {median:.3g} tokens; a response length model "
                         f"needs one between 0 and {MAX_MEDIAN_TOKENS:.0e}")


def _check_quantiles(model: LengthModel, what: str) -> None:
    import warnings

    with warnings.catch_warnings(), np.errstate(over="raise", invalid="raise", divide="raise",
                                                under="ignore"):
        warnings.simplefilter("error", RuntimeWarning)
        try:
            q = np.asarray(model.ppf(np.array(DRAW_QUANTILES)), float)
        except (FloatingPointError, ArithmeticError, RuntimeWarning, ValueError):
            q = np.array([math.nan, math.inf, math.inf])
    _check_median(what, float(q[1]) if np.isfinite(q[1]) else math.inf)
    if not np.all(np.isfinite(q)):
        raise ValueError(f"{what}: its largest draws overflow float64; a response length model "
                         "needs a finite spread")


def cap_lengths(x: np.ndarray, max_len: int) -> np.ndarray:
    """Continuous draws -> integer token counts in [1, max_len]; `>= max_len` means truncated."""
    x = np.nan_to_num(np.asarray(x, float), nan=float(max_len), posinf=float(max_len))
    return np.clip(np.ceil(x), 1, max_len).astype(np.int64)
