"""Speculative decoding's settings and math (`[cluster] speculative = {...}`): draft length k(B),
tokens per verify step E(k, p), the acceptance models and the per-token cost of a step. What
they mean for the engines: `aprilsim.engine.speculative`. Pure functions, no I/O; imported by
`cost.EngineSpec`, so it imports nothing of the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

Q = 1 << 16  # fixed-point units of an acceptance probability
ACCEPTANCE = ("constant", "siblings")


def tokens_per_step(k: int, p: float) -> float:
    """E(k, p): tokens a verify step emits per request (accepted draft prefix + the bonus one)."""
    if p >= 1.0:
        return float(k + 1)
    return (1.0 - p ** (k + 1)) / (1.0 - p)


def fit_acceptance(k: int, accept_len: float) -> float:
    """The per-token acceptance p with E(k, p) == accept_len (mean tokens per verify step,
    bonus token included, as SGLang's `accept len` and vLLM's 1 + accepted/drafts report it):
    E is increasing in p, so bisection; clamped to [0, 1] at the ends (1 .. k+1)."""
    if k < 1:
        raise ValueError(f"draft length k must be >= 1, got {k}")
    if accept_len <= 1.0:
        return 0.0
    if accept_len >= k + 1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if tokens_per_step(k, mid) < accept_len:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass(frozen=True)
class SpeculativeSpec:
    """`[cluster] speculative = {...}`: draft length k(B), acceptance model, draft cost."""

    acceptance: str = "constant"
    p: float = 0.7  # per-draft-token acceptance ("constant")
    p0: float = 0.5  # "siblings": acceptance with no sibling finished
    p_max: float = 0.9  # "siblings": with all n-1 siblings finished
    k_max: int = 4  # most draft tokens per request per step
    k_min: int = 1
    draft_budget: int = 0  # draft tokens per step across the batch (0: k = k_max always)
    draft_s: float = 0.0  # seconds per draft token step (a draft model's forward pass)
    overhead_s: float = 0.0  # fixed seconds per verify step (drafting, tree building)

    def __post_init__(self) -> None:
        if self.acceptance not in ACCEPTANCE:
            raise ValueError(f"speculative.acceptance must be one of {', '.join(ACCEPTANCE)}, "
                             f"got {self.acceptance!r}")
        for name in ("p", "p0", "p_max"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"speculative.{name} must lie in [0, 1], got {v}")
        if self.p_max < self.p0:
            raise ValueError(f"speculative.p_max ({self.p_max}) must be >= p0 ({self.p0})")
        if not 1 <= self.k_min <= self.k_max:
            raise ValueError(f"speculative needs 1 <= k_min <= k_max, got k_min {self.k_min}, "
                             f"k_max {self.k_max}")
        if self.draft_budget < 0:
            raise ValueError(f"speculative.draft_budget must be >= 0, got {self.draft_budget}")
        if self.draft_s < 0 or self.overhead_s < 0:
            raise ValueError("speculative.draft_s and overhead_s must be >= 0")

    @property
    def by_siblings(self) -> bool:
        """True when a request's acceptance depends on its group's finished siblings."""
        return self.acceptance == "siblings"

    def draft_len(self, batch: int) -> int:
        """k(B) = clamp(draft_budget // B, k_min, k_max); k_max without a budget."""
        if not self.draft_budget:
            return self.k_max
        k = self.draft_budget // max(batch, 1)
        return self.k_min if k < self.k_min else self.k_max if k > self.k_max else k

    def p_units(self, finished: int, n: int) -> int:
        """A request's acceptance in 1/Q units: `p` ("constant"), or p0 .. p_max as its group of
        `n` has 0 .. n-1 `finished` siblings ("siblings")."""
        if not self.by_siblings:
            return round(self.p * Q)
        frac = min(finished, n - 1) / (n - 1) if n > 1 else 0.0
        return round((self.p0 + (self.p_max - self.p0) * frac) * Q)

    def per_token(self, f: float, g: float, batch: int, p: float) -> tuple[float, float]:
        """(f', g') of one engine step (one token per request) from the plain model's verify-pass
        fixed part `f` (at B*(1+k)) and KV term `g` (at B)."""
        k = self.draft_len(batch)
        e = tokens_per_step(k, p)
        return (f + self.draft_s * k + self.overhead_s) / e, g / e
