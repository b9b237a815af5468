"""`LengthFitter`: fit every candidate family to (censored) lengths, rank them, bootstrap the best.

scikit-learn style: configure in the constructor, `fit(lengths)` returns the fitted object, and
what was learned ends in `_` (`results_` ranked best first, `best_`, `model_` the frozen length
model the simulator uses, `cap_`, `bootstrap_`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import special

from aprilsim.workload.fitting.bootstrap import bootstrap_ci
from aprilsim.workload.fitting.censoring import (
    CapInfo,
    CensoredHistogram,
    censor,
    coarsen,
    resolve_cap,
)
from aprilsim.workload.fitting.data import Histogram, LengthData, check_usable
from aprilsim.workload.fitting.errors import LengthDataError
from aprilsim.workload.fitting.families import ALL_FAMILIES, FAMILY_SPECS, summarise
from aprilsim.workload.fitting.goodness import ad_statistic, aic, bic, ks_statistic
from aprilsim.workload.fitting.likelihood import Grid, inverse_hessian, maximise, model_loglik
from aprilsim.workload.fitting.mixture_em import em_lognormal_mixture
from aprilsim.workload.fitting.quantiles import capped_quantiles, capped_share
from aprilsim.workload.lengths import (
    Empirical,
    LengthModel,
    LognormalMixture,
    Parametric,
    cap_lengths,
    expect_model,
)

CRITERIA = ("aic", "bic")


@dataclass(frozen=True)
class FamilyFit:
    """One family fitted to the data, with its goodness of fit (lower AIC/BIC/KS/AD is better)."""

    family: str
    model: LengthModel
    n_params: int
    loglik: float
    aic: float
    bic: float
    ks: float
    ad: float
    converged: bool
    theta: np.ndarray | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "n_params": self.n_params,
            "loglik": self.loglik,
            "aic": self.aic,
            "bic": self.bic,
            "ks": self.ks,
            "ad": self.ad,
            "converged": self.converged,
            "model": self.model.to_dict()
            if self.family != "empirical"
            else {"family": "empirical"},
        }


def _as_histogram(X: Any, counts: Any) -> tuple[Histogram, LengthData | None]:
    if isinstance(X, LengthData):
        check_usable(X)
        return X.histogram, X
    if isinstance(X, Histogram):
        data = LengthData(X)
    elif counts is not None:
        data = LengthData(Histogram(np.asarray(X), np.asarray(counts)))
        if np.any(data.histogram.values <= 0):
            raise LengthDataError("lengths must be positive integers")
    else:
        data = LengthData.from_array(X)
    check_usable(data)
    return data.histogram, data


class LengthFitter:
    """Fit candidate length families by censored maximum likelihood and rank them.

    Parameters
    ----------
    families: which of `ALL_FAMILIES` to try (lognormal, gamma, weibull, loglogistic, gengamma,
        lognormal_mixture2, lognormal_mixture3, empirical).
    max_len: the cap; lengths >= max_len are right-censored. None: detect a spike at the maximum
        (if `detect_cap`), else treat every length as exact.
    criterion: "bic" (default) or "aic", the ranking. BIC is the default because with 10^5-10^6
        lengths AIC rewards the empirical law's hundreds of atoms for every lump in a histogram.
    n_bootstrap: replicates for the confidence intervals of p50/p90/p99 and capped share (0: none).
    empirical_points: the empirical model keeps this many quantiles (not every row).
    max_bins: with more distinct lengths than this, neighbouring long lengths are merged into
        geometric bins (interval-censored, still an exact likelihood of the binned data); this is
        what keeps a fit of 10^6 lengths to seconds. Every family sees the same bins.
    progress: optional callable receiving a short status line as the fit goes (family being
        fitted, bootstrap resamples done); the CLI shows it on a terminal.
    warm_hessian: start each bootstrap refit's BFGS with the inverse Hessian at the full-data
        optimum (same refit, far fewer steps); False gives the plain identity start.
    """

    def __init__(
        self,
        families: Sequence[str] = ALL_FAMILIES,
        max_len: int | None = None,
        detect_cap: bool = True,
        criterion: str = "bic",
        n_bootstrap: int = 200,
        confidence: float = 0.95,
        empirical_points: int = 2000,
        max_bins: int = 2048,
        random_state: int | None = 0,
        progress: Callable[[str], None] | None = None,
        warm_hessian: bool = True,
    ) -> None:
        self.families = tuple(families)
        self.max_len = max_len
        self.detect_cap = detect_cap
        self.criterion = criterion
        self.n_bootstrap = n_bootstrap
        self.confidence = confidence
        self.empirical_points = empirical_points
        self.max_bins = max_bins
        self.random_state = random_state
        self.progress = progress
        self.warm_hessian = warm_hessian

    def _say(self, message: str) -> None:
        if self.progress is not None:
            self.progress(message)

    def _check_params(self) -> None:
        unknown = [f for f in self.families if f not in ALL_FAMILIES]
        if unknown or not self.families:
            raise ValueError(f"unknown families {unknown}; choose from {', '.join(ALL_FAMILIES)}")
        if self.criterion not in CRITERIA:
            raise ValueError(f"criterion must be one of {CRITERIA}, got {self.criterion!r}")
        if self.max_len is not None and self.max_len < 2:
            raise ValueError("max_len must be >= 2")

    # ------------------------------------------------------------------ fitting
    def fit(self, X: Any, counts: Any = None) -> LengthFitter:
        """Fit every family to lengths `X` (array of positive integers, a `Histogram`, a
        `LengthData`, or distinct values with `counts`); returns self."""
        self._check_params()
        hist, source = _as_histogram(X, counts)
        self.histogram_ = hist
        self.source_ = source
        self.cap_: CapInfo = resolve_cap(hist, self.max_len, self.detect_cap)
        self.max_len_ = self.cap_.max_len
        data = coarsen(censor(hist, self.max_len_), self.max_bins)
        if len(data.values) < 2:
            raise LengthDataError(
                f"fewer than 2 distinct lengths below the cap ({self.max_len_}); nothing to fit"
            )
        self.data_ = data
        self.n_samples_ = data.n
        grid = Grid.of(data)
        self.failed_: dict[str, str] = {}
        fits: dict[str, FamilyFit] = {}
        order = [f for f in ALL_FAMILIES if f in self.families]
        for k, name in enumerate(order):
            self._say(f"fitting {name} ({k + 1}/{len(order)})")
            try:
                fits[name] = self._fit_one(name, data, grid, fits)
            except (ValueError, FloatingPointError, np.linalg.LinAlgError) as e:
                self.failed_[name] = str(e).splitlines()[0]
        if not fits:
            raise LengthDataError(f"no family could be fitted: {self.failed_}")
        key = (lambda f: f.aic) if self.criterion == "aic" else (lambda f: f.bic)
        self.results_: list[FamilyFit] = sorted(fits.values(), key=key)
        self.best_ = self.results_[0]
        self.model_ = self.best_.model
        self.quantiles_ = capped_quantiles(self.model_, self.max_len_)
        self.empirical_quantiles_ = {
            f"p{round(q * 100)}": float(hist.quantile(q)) for q in (0.5, 0.9, 0.99)
        }
        self.bootstrap_ = self._bootstrap(data) if self.n_bootstrap > 0 else {}
        return self

    def _fit_one(
        self, name: str, data: CensoredHistogram, grid: Grid, done: dict[str, FamilyFit]
    ) -> FamilyFit:
        if name == "empirical":
            return self._fit_empirical(data, grid)
        fam = FAMILY_SPECS[name]
        starts = self._starts(name, data, done)
        # gengamma near its lognormal limit (huge a) is slow and flat: cap its iterations
        maxiter = 150 if name == "gengamma" else 500
        opt = maximise(fam, data, starts, grid, maxiter=maxiter, n_best=2)
        model = fam.to_model(opt.theta)
        return self._scored(name, model, fam.n_params, opt.loglik, data, opt.converged, opt.theta)

    def _starts(self, name: str, data: CensoredHistogram, done: dict[str, FamilyFit]):
        fam = FAMILY_SPECS[name]
        summ = summarise(
            np.append(data.midpoints, [data.max_len] if data.n_censored else []),
            np.append(data.counts, [data.n_censored] if data.n_censored else []).astype(float),
        )
        starts = list(fam.starts(summ))
        if name == "gengamma":
            # gamma (c = 1) and Weibull (a = 1) are nested: starting there guarantees gengamma
            # is at least as likely as both (fitted here if they were not asked for)
            done = dict(done)
            for nested in ("gamma", "weibull", "lognormal"):
                if nested not in done:
                    done[nested] = self._fit_one(nested, data, Grid.of(data), done)
            if "gamma" in done:
                p = expect_model(done["gamma"].model, Parametric).params
                starts.append(np.log([p["shape"], 1.0, p["scale"]]))
            if "weibull" in done:
                p = expect_model(done["weibull"].model, Parametric).params
                starts.append(np.log([1.0, p["shape"], p["scale"]]))
            if "lognormal" in done:
                # the lognormal is the limit a -> inf, c -> 0; start far along that path
                p = expect_model(done["lognormal"].model, Parametric).params
                a = 500.0
                c = float(np.sqrt(special.polygamma(1, a))) / p["sigma"]
                starts.append(np.array([np.log(a), np.log(c), p["mu"] - special.digamma(a) / c]))
        if name.startswith("lognormal_mixture"):
            k = int(name[-1])
            inits = [self._split_start(s, k) for s in starts]
            prev = done.get(f"lognormal_mixture{k - 1}") or done.get("lognormal")
            if prev is not None:
                inits.append(self._grow(prev.model, k, summ))
            starts = []
            for w, mu, s in inits:
                w2, mu2, s2 = em_lognormal_mixture(data, w, mu, s)
                starts.append(fam.unconstrain(LognormalMixture(tuple(w2), tuple(mu2), tuple(s2))))
        return starts

    @staticmethod
    def _split_start(theta: np.ndarray, k: int):
        logits = np.concatenate([[0.0], theta[: k - 1]])
        w = np.exp(logits) / np.exp(logits).sum()
        return w, theta[k - 1 : 2 * k - 1], np.exp(theta[2 * k - 1 :])

    @staticmethod
    def _grow(model: LengthModel, k: int, summ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A k-component start from a (k-1)-component fit plus a component in the upper tail."""
        d = model.to_dict()
        if d["family"] == "lognormal":
            w, mu, s = [1.0], [d["mu"]], [d["sigma"]]
        else:
            w, mu, s = list(d["weights"]), list(d["mus"]), list(d["sigmas"])
        w = [x * 0.8 for x in w] + [0.2]
        mu = mu + [summ.mean_log + 1.5 * summ.sd_log]
        s = s + [max(summ.sd_log / 2, 0.05)]
        return np.array(w), np.array(mu), np.array(s)

    def _fit_empirical(self, data: CensoredHistogram, grid: Grid) -> FamilyFit:
        h = self.histogram_
        m = int(min(self.empirical_points, h.n))
        q = (np.arange(m) + 0.5) / m
        values = h.quantile(q).astype(float)
        if self.max_len_ is not None:
            values = np.minimum(values, self.max_len_)
        model = Empirical(tuple(values))
        # the likelihood of the observed histogram itself (the nonparametric MLE)
        p = np.append(data.counts, data.n_censored).astype(float)
        p = p[p > 0]
        ll = float(p @ np.log(p / p.sum()))
        return self._scored("empirical", model, len(p) - 1, ll, data, True, None)

    def _scored(self, name, model, k, ll, data, converged, theta) -> FamilyFit:
        if name != "empirical":
            # report the likelihood of the frozen model (what gets written), not the optimiser's
            ll = model_loglik(model, data, Grid.of(data))
        return FamilyFit(
            family=name,
            model=model,
            n_params=int(k),
            loglik=float(ll),
            aic=aic(ll, k),
            bic=bic(ll, k, data.n),
            ks=ks_statistic(model.cdf, data),
            ad=ad_statistic(model.cdf, data),
            converged=bool(converged),
            theta=theta,
        )

    def _bootstrap(self, data: CensoredHistogram) -> dict[str, dict[str, float]]:
        best = self.best_
        max_len = self.max_len_
        rng = np.random.default_rng(self.random_state)

        def stats(model: LengthModel) -> dict[str, float]:
            out = capped_quantiles(model, max_len)
            out["capped_share"] = capped_share(model, max_len)
            return out

        if best.family == "empirical":

            def refit(d: CensoredHistogram) -> LengthModel:
                vals = np.append(d.values, [max_len] if d.n_censored else []).astype(float)
                cnt = np.append(d.counts, [d.n_censored] if d.n_censored else [])
                h = Histogram(vals, cnt)
                m = int(min(self.empirical_points, h.n))
                return Empirical(tuple(h.quantile((np.arange(m) + 0.5) / m).astype(float)))

            def stats(model: LengthModel) -> dict[str, float]:  # noqa: F811 - discrete law
                out = capped_quantiles(model, max_len)
                v = np.asarray(expect_model(model, Empirical).values)
                out["capped_share"] = float(np.mean(v >= max_len)) if max_len else 0.0
                return out

            point = stats(best.model)
        else:
            fam = FAMILY_SPECS[best.family]
            theta = best.theta
            # every refit starts at the full-data optimum with its curvature (see
            # `inverse_hessian`): the same maximisation, in a few BFGS steps instead of tens
            h_inv = inverse_hessian(fam, data, theta) if self.warm_hessian else None

            def refit(d: CensoredHistogram) -> LengthModel:
                opt = maximise(fam, d, [theta], maxiter=40, hess_inv0=h_inv)
                return fam.to_model(opt.theta)

            point = stats(best.model)

        def tick(done: int, total: int) -> None:
            self._say(f"bootstrap of {best.family}: {done}/{total} resamples")

        return bootstrap_ci(
            data, refit, stats, point, self.n_bootstrap, rng, self.confidence, on_progress=tick
        )

    # ------------------------------------------------------------------ using the fit
    def _check_fitted(self) -> None:
        if not hasattr(self, "model_"):
            raise RuntimeError("this LengthFitter is not fitted yet; call fit() first")

    def sample(self, n: int, random_state: int | np.random.Generator | None = None) -> np.ndarray:
        """Draw `n` integer lengths from the chosen model, capped at the cap (as the simulator)."""
        self._check_fitted()
        rng = np.random.default_rng(random_state)
        x = self.model_.rvs(n, rng)
        return cap_lengths(x, self.max_len_) if self.max_len_ else cap_lengths(x, 2**62)

    def result(self, family: str) -> FamilyFit:
        self._check_fitted()
        for r in self.results_:
            if r.family == family:
                return r
        raise KeyError(f"{family} was not fitted (failed: {self.failed_.get(family, 'not asked')})")

    def to_dict(self) -> dict[str, Any]:
        """Everything learned, JSON-ready (the `--json` output of `aprilsim fit`)."""
        self._check_fitted()
        best = self.results_[0]
        key = self.criterion
        return {
            "n": self.n_samples_,
            "distinct_lengths": int(len(self.histogram_.values)),
            "cap": self.cap_.to_dict(),
            "criterion": key,
            "best": best.family,
            "model": self.model_.to_dict()
            if best.family != "empirical"
            else {"family": "empirical",
                  "points": len(expect_model(self.model_, Empirical).values)},
            "ranking": [
                {**r.to_dict(), f"delta_{key}": getattr(r, key) - getattr(best, key)}
                for r in self.results_
            ],
            "failed": dict(self.failed_),
            "quantiles": self.quantiles_,
            "empirical_quantiles": self.empirical_quantiles_,
            "bootstrap": self.bootstrap_,
        }
