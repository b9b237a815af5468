"""Speculative decoding in the engine model: draft length, acceptance, and what a token costs.

A speculative engine drafts k tokens per running request, then one verify forward pass checks
them: a request keeps the accepted prefix of its draft plus one token of the target model, so a
verify step emits E(k, p) = (1 - p^(k+1)) / (1 - p) tokens per request on average when each
draft token is accepted with probability p (k + 1 at p = 1). The model here is the *fluid*
one: a request advances by E tokens per verify step, spread evenly, so that one engine step
(what `FastEngine` and `ReferenceEngine` call an iteration) still emits one token per running
request and costs a verify step divided by E. Every rule of the engines that counts tokens (KV
growth, the reserve, retraction, the new-token ratio, the finish heap) stays as it is, and the
closed-form spans stay exact, because the per-token cost keeps the form f(B) + g(B)*K:

    t_token(B, K) = (f(B * (1 + k)) + draft_s * k + overhead_s + g(B) * K) / E(k(B), p)

The verify pass computes B*(1+k) tokens, priced as a decode iteration of that many requests'
fixed part (`a + b*B*(1+k)` for `CostModel`), reads the KV cache once (g(B)*K), and the draft
costs `draft_s` per draft token step plus `overhead_s` per step. The draft length adapts to the
batch: k(B) = clamp(draft_budget // B, k_min, k_max) (a nearly empty engine, the tail, drafts
most; draft_budget 0: k = k_max always).

Acceptance: "constant" (p for every request), or "siblings": p rises linearly from p0 to p_max
as the request's group has 0 .. n-1 finished siblings on its engine (their responses are draft
material: Seer's grouped speculative decoding). A batch of requests with different p steps at
the batch's mean p (the mean of integer 1/Q units, Q = 2^16, so every engine model computes the
same float in any order). What the fluid model gives up: a live engine emits an integer number
of tokens per verify step (1 .. k+1, at random); here a request's finish moves by less than one
verify step, tens of milliseconds in a rollout of minutes. Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aprilsim.engine.request import Request

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


class SpeculativeCost:
    """A cost model whose decode step is one speculative token per request (`per_token`); the
    prefill is the plain model's. One per engine: with "siblings" acceptance the engine sets the
    batch's p (`set_batch`) at each decode plan, and the cost is fixed until the next one."""

    def __init__(self, base: Any, spec: SpeculativeSpec) -> None:
        self.base, self.spec = base, spec
        self.p0, self.p1, self.p2 = base.p0, base.p1, base.p2
        self.pr = getattr(base, "pr", 0.0)
        self.units = spec.p_units(0, 1)
        self._cache: dict[tuple[int, int], tuple[float, float]] = {}
        self.fin: dict[int, int] = {}  # group -> its requests finished on this engine
        self.groups: dict[int, tuple[int, int]] = {}  # rid -> (group, n) of running "siblings"

    def coefficients(self, batch: int) -> tuple[float, float]:
        """(f'(B), g'(B)) at the current acceptance (cached per batch size and p)."""
        key = (batch, self.units)
        got = self._cache.get(key)
        if got is None:
            if len(self._cache) > 8192:
                self._cache.clear()
            k = self.spec.draft_len(batch)
            f = self.base.coefficients(batch * (1 + k))[0]
            g = self.base.coefficients(batch)[1]
            got = self._cache[key] = self.spec.per_token(f, g, batch, self.units / Q)
        return got

    def decode_time(self, batch: int, kv_tokens: float) -> float:
        """Seconds of one engine step (one token per running request)."""
        f, g = self.coefficients(batch)
        return f + g * kv_tokens

    def decode_span(self, n: int, batch: int, kv_tokens: float) -> float:
        """Seconds of n steps from `kv_tokens` (K grows by B each): the plain closed form."""
        f, g = self.coefficients(batch)
        return n * (f + g * kv_tokens) + g * batch * n * (n - 1) / 2

    def iterations_within(self, dt: float, batch: int, kv_tokens: float, n_max: int) -> int:
        """Largest m <= n_max whose m steps end no later than `dt` after they start."""
        from aprilsim.engine.cost import _LinearInK

        return _LinearInK.iterations_within(self, dt, batch, kv_tokens, n_max)  # type: ignore[arg-type]

    def prefill_time(self, tokens: int, tokens_sq: int | None = None, passes: int = 1,
                     requests: int = 0) -> float:
        """The plain model's prefill (speculative decoding drafts only in decode)."""
        return self.base.prefill_time(tokens, tokens_sq, passes, requests)

    # ---- "siblings" acceptance: what the engine tells it
    def submitted(self, reqs: Iterable[Request]) -> None:
        """Requests queued on the engine: remember their groups (n from `Request.group_n`)."""
        if self.spec.by_siblings:
            for r in reqs:
                if r.group >= 0:
                    self.groups[r.rid] = (r.group, r.group_n)

    def finished(self, done: Iterable[Any]) -> None:
        """Completions at one event: the finished ones (not aborted) count for their group."""
        if not self.spec.by_siblings:
            return
        groups, fin = self.groups, self.fin
        for c in done:
            got = groups.pop(c.rid, None)
            if got is not None and c.reason != "abort":
                fin[got[0]] = fin.get(got[0], 0) + 1

    def set_batch(self, running: Iterable[Request]) -> None:
        """A decode plan starts over `running`: the batch's mean acceptance (1/Q units, floored)."""
        spec, groups, fin = self.spec, self.groups, self.fin
        total = n = 0
        for r in running:
            got = groups.get(r.rid)
            total += spec.p_units(fin.get(got[0], 0), got[1]) if got else spec.p_units(0, 1)
            n += 1
        self.units = total // n if n else spec.p_units(0, 1)

    def forget(self, rids: Iterable[int]) -> None:
        """Requests aborted: no longer tracked."""
        for rid in rids:
            self.groups.pop(rid, None)


def engine_cost(spec: Any) -> Any:
    """The cost model an engine of `spec` (an EngineSpec) steps with: its own, or a fresh
    per-engine `SpeculativeCost` when `spec.speculative` is set."""
    sd = getattr(spec, "speculative", None)
    return spec.cost if sd is None else SpeculativeCost(spec.cost, sd)
