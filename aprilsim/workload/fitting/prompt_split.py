"""How much of the length variance is between prompts: the simulator's `prompt_share`.

GRPO samples of one prompt share its difficulty, so their lengths are correlated. The workload
draws lengths through a Gaussian copula, z = sqrt(rho) u_prompt + sqrt(1 - rho) u_sample, so the
parameter to estimate is the intraclass correlation of the normal scores z = Phi^-1(F(L)) under the
fitted marginal model. It is estimated by one-way random-effects ANOVA (method of moments, valid for
unequal group sizes). For a lognormal this equals the between-prompt share of log-length variance,
which is reported as well. Capped responses get the mean normal score above the cap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import special

from aprilsim.workload.fitting.errors import LengthDataError
from aprilsim.workload.lengths import LengthModel


@dataclass(frozen=True)
class VarianceSplit:
    between: float
    within: float

    @property
    def share(self) -> float:
        tot = self.between + self.within
        return float(self.between / tot) if tot > 0 else 0.0


def _group_stats(y: np.ndarray, g: np.ndarray, n_groups: int) -> np.ndarray:
    """Per group: (n, sum, sum of squares)."""
    return np.stack(
        [
            np.bincount(g, minlength=n_groups).astype(float),
            np.bincount(g, weights=y, minlength=n_groups),
            np.bincount(g, weights=y * y, minlength=n_groups),
        ],
        axis=1,
    )


def anova_split(stats: np.ndarray) -> VarianceSplit:
    """Between/within variance components from per-group (n, sum, sumsq) rows."""
    n_i, s_i, q_i = stats[:, 0], stats[:, 1], stats[:, 2]
    keep = n_i > 0
    n_i, s_i, q_i = n_i[keep], s_i[keep], q_i[keep]
    n, g = n_i.sum(), len(n_i)
    if g < 2 or n <= g:
        raise LengthDataError(
            "the prompt split needs at least 2 prompts and a prompt with 2+ samples"
        )
    mean_i = s_i / n_i
    grand = s_i.sum() / n
    ssw = float((q_i - s_i * mean_i).sum())
    ssb = float((n_i * (mean_i - grand) ** 2).sum())
    msw = max(ssw / (n - g), 0.0)
    msb = ssb / (g - 1)
    n0 = (n - (n_i**2).sum() / n) / (g - 1)
    return VarianceSplit(max((msb - msw) / n0, 0.0), msw)


def normal_scores(lengths: np.ndarray, model: LengthModel, max_len: int | None) -> np.ndarray:
    """z = Phi^-1 of the mid-interval CDF of each integer length; E[z | z > z_cap] if capped."""
    x = np.asarray(lengths, float)
    u = 0.5 * (np.asarray(model.cdf(x - 1.0)) + np.asarray(model.cdf(x)))
    z = special.ndtri(np.clip(u, 1e-12, 1 - 1e-12))
    if max_len is not None:
        zc = float(
            special.ndtri(np.clip(model.cdf(np.array([max_len - 1.0]))[0], 1e-12, 1 - 1e-12))
        )
        tail = float(np.exp(-0.5 * zc * zc) / np.sqrt(2 * np.pi) / max(special.ndtr(-zc), 1e-300))
        z = np.where(x >= max_len, tail, z)
    return z


class PromptSplit:
    """Split length variance into between-prompt and within-prompt parts.

    `fit(lengths, groups, model=None, max_len=None)`; learned: `share_` (normal-score intraclass
    correlation: the simulator's prompt_share; equals `log_share_` when `model` is None),
    `log_share_`, `between_var_`, `within_var_` (of log length), `n_groups_`, `ci_` (bootstrap
    over prompts), `mean_group_size_`.
    """

    def __init__(
        self, n_bootstrap: int = 200, confidence: float = 0.95, random_state: int | None = 0
    ):
        self.n_bootstrap = n_bootstrap
        self.confidence = confidence
        self.random_state = random_state

    def fit(
        self,
        lengths: np.ndarray,
        groups: np.ndarray,
        model: LengthModel | None = None,
        max_len: int | None = None,
    ) -> PromptSplit:
        x = np.asarray(lengths, float)
        _, g = np.unique(np.asarray(groups), return_inverse=True)
        if x.shape != g.shape:
            raise ValueError("lengths and groups must have one entry per row")
        n_groups = int(g.max()) + 1 if g.size else 0
        logs = _group_stats(np.log(x), g, n_groups)
        split = anova_split(logs)
        self.between_var_, self.within_var_ = float(split.between), float(split.within)
        self.log_share_ = split.share
        z_stats = (
            logs if model is None else _group_stats(normal_scores(x, model, max_len), g, n_groups)
        )
        self.share_ = anova_split(z_stats).share
        self.n_groups_ = n_groups
        self.mean_group_size_ = float(x.size / max(n_groups, 1))
        self.ci_ = self._bootstrap(z_stats)
        return self

    def _bootstrap(self, stats: np.ndarray) -> tuple[float, float]:
        if self.n_bootstrap <= 0:
            return (float("nan"), float("nan"))
        rng = np.random.default_rng(self.random_state)
        k = len(stats)
        shares = []
        for _ in range(self.n_bootstrap):
            try:
                shares.append(anova_split(stats[rng.integers(0, k, k)]).share)
            except LengthDataError:
                continue
        a = (1 - self.confidence) / 2
        lo, hi = np.quantile(shares, [a, 1 - a]) if shares else (np.nan, np.nan)
        return float(lo), float(hi)

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_share": self.share_,
            "prompt_share_ci": list(self.ci_),
            "log_share": self.log_share_,
            "between_var_log": self.between_var_,
            "within_var_log": self.within_var_,
            "n_groups": self.n_groups_,
            "mean_group_size": self.mean_group_size_,
        }
