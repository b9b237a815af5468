"""Speculative decoding's settings and math (`[cluster] speculative = {...}`): draft length k(B),
tokens per verify step E(k, p), the acceptance models and the per-token cost of a step. What
they mean for the engines: `aprilsim.engine.speculative`; what the drafts know across engines
(the group's and the prompt's responses): `aprilsim.engine.draft_board`. Pure functions, no
I/O; imported by `cost.EngineSpec`, so it imports nothing of the engine.

The acceptance models, and the published figures their defaults come from (mean tokens per
verify step, bonus token included, "accept length"):

* "model": a trained draft model (EAGLE-3, MTP heads, a small LM): one acceptance for every
  request, from `accept_len` at `k_max`; default 2.26, the middle of NeMo-RL's measured 2.05
  (RL-Zero) and 2.47 (RL-Think) for EAGLE-3 drafts during GRPO rollouts of Qwen3-8B
  (arXiv 2604.26779). `staleness` and `retrain_every` model the draft falling behind the policy.
* "group": Seer's adaptive grouped speculative decoding (arXiv 2511.14617): a global draft
  server builds each group's draft from its siblings' tokens wherever they run; p rises from
  p0 (no sibling text yet) to p_max (every sibling has covered this request's position). Default
  accept lengths 1.70 and 2.85: Seer's reported mean accept length without and with the group's
  context (its ablation).
* "history": drafts from the same prompt's responses in earlier epochs (RhymeRL's HistoSpec,
  arXiv 2508.18588; SPEC-RL, arXiv 2509.23232): p_max when the prompt was generated before
  (falling with `staleness` per policy version since), p0 when it was not. No accept length is
  published for either (they report 2.1x and 2-3x rollout speedups); the defaults are Seer's.
* "siblings": the earlier engine-local model (finished siblings on the request's own engine);
  its count depends on the routing (docs/simulator.md). "constant": p for every request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

Q = 1 << 16  # fixed-point units of an acceptance probability
ACCEPTANCE = ("constant", "siblings", "group", "history", "model")
BOARD_MODELS = ("group", "history", "model")  # acceptance read from `draft_board.DraftBoard`

# published accept lengths (tokens per verify step), each with its source: the defaults, and the
# ranges `acceptance_notes` compares a setting with
NEMO_RL_EAGLE3 = (2.05, 2.47)  # arXiv 2604.26779: EAGLE-3 in GRPO rollouts (RL-Zero, RL-Think)
SEER_GROUPED = (1.70, 2.85)  # arXiv 2511.14617: without and with the group's context
PUBLISHED = {
    "model": (NEMO_RL_EAGLE3, "NeMo-RL's EAGLE-3 in RL rollouts, arXiv 2604.26779"),
    "group": (SEER_GROUPED, "Seer's grouped drafts, arXiv 2511.14617"),
    "history": (SEER_GROUPED, "Seer's grouped drafts (none published for history drafts)"),
    "siblings": (SEER_GROUPED, "Seer's grouped drafts, arXiv 2511.14617"),
    "constant": ((NEMO_RL_EAGLE3[0], SEER_GROUPED[1]), "RL rollouts: NeMo-RL 2.05-2.47, Seer "
                                                         "up to 2.85"),
}


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
    p: float = 0.7  # per-draft-token acceptance ("constant", "model")
    p0: float = 0.5  # "siblings", "group", "history": acceptance with nothing to draft from
    p_max: float = 0.9  # ... with all the group's (the prompt's) text there is
    k_max: int = 4  # most draft tokens per request per step
    k_min: int = 1
    draft_budget: int = 0  # draft tokens per step across the batch (0: k = k_max always)
    draft_s: float = 0.0  # seconds per draft token step (a draft model's forward pass)
    overhead_s: float = 0.0  # fixed seconds per verify step (drafting, tree building)
    # the draft falls behind the policy: acceptance x (1 - staleness) per policy version between
    # the draft and the policy ("model": since it was (re)trained; "history": since the
    # prompt's earlier response was generated, the first version free)
    staleness: float = 0.0
    retrain_every: int = 0  # "model": the draft is retrained every R versions (0: never)

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
        if not 0.0 <= self.staleness < 1.0:
            raise ValueError(f"speculative.staleness must lie in [0, 1), got {self.staleness}")
        if self.retrain_every < 0:
            raise ValueError(f"speculative.retrain_every must be >= 0, got {self.retrain_every}")

    @classmethod
    def sourced(cls, **given: object) -> SpeculativeSpec:
        """A spec with the published defaults of its acceptance model for what `given` leaves
        out ("model": `accept_len` 2.26 at k_max, or the `accept_len` given; "group",
        "history": accept lengths 1.70 and 2.85 at k_max); "constant" and "siblings" keep the
        plain defaults. `accept_len` is not a field: it sets p (or p_max)."""
        acc = str(given.get("acceptance", "constant"))
        accept_len = given.pop("accept_len", None)
        k = int(given.get("k_max", cls.k_max))  # type: ignore[call-overload]
        if acc == "model" and "p" not in given:
            given["p"] = fit_acceptance(k, float(accept_len or sum(NEMO_RL_EAGLE3) / 2))
        elif acc in ("group", "history"):
            given.setdefault("p0", fit_acceptance(k, SEER_GROUPED[0]))
            if "p_max" not in given:
                given["p_max"] = fit_acceptance(k, float(accept_len or SEER_GROUPED[1]))
        elif accept_len is not None:
            given["p"] = fit_acceptance(k, float(accept_len))
        names = {f.name for f in fields(cls)}
        return cls(**{k2: v for k2, v in given.items() if k2 in names})  # type: ignore[arg-type]

    @property
    def by_siblings(self) -> bool:
        """True when a request's acceptance is its own (not one for all): the engines track
        their requests ("siblings" counts finished siblings on the engine; the board models
        read `draft_board.DraftBoard`)."""
        return self.acceptance != "constant"

    @property
    def on_board(self) -> bool:
        """True when the acceptance is read from the run's `DraftBoard` (the group's text
        wherever it runs, the prompt's earlier epochs, a draft model's age)."""
        return self.acceptance in BOARD_MODELS

    def range_of(self) -> tuple[float, float]:
        """The accept lengths (tokens per verify step at k_max) this setting spans: lowest and
        highest acceptance it can give, before staleness."""
        lo, hi = (self.p, self.p) if self.acceptance in ("constant", "model") else (
            self.p0, self.p_max)
        return tokens_per_step(self.k_max, lo), tokens_per_step(self.k_max, hi)

    def group_units(self, covered: float) -> int:
        """"group": a request's acceptance in 1/Q units when a share `covered` (0..1) of its
        siblings' text covers its position."""
        c = 0.0 if covered < 0 else 1.0 if covered > 1 else covered
        return round((self.p0 + (self.p_max - self.p0) * c) * Q)

    def aged_units(self, p: float, age: int) -> int:
        """`p` in 1/Q units after `age` policy versions of staleness."""
        return round(p * (1.0 - self.staleness) ** max(age, 0) * Q)

    def draft_len(self, batch: int) -> int:
        """k(B) = clamp(draft_budget // B, k_min, k_max); k_max without a budget."""
        if not self.draft_budget:
            return self.k_max
        k = self.draft_budget // max(batch, 1)
        return self.k_min if k < self.k_min else self.k_max if k > self.k_max else k

    def p_units(self, finished: int, n: int) -> int:
        """A request's acceptance in 1/Q units: `p` ("constant", "model" before the board
        says), or p0 .. p_max as its group of `n` has 0 .. n-1 `finished` siblings."""
        if self.acceptance in ("constant", "model"):
            return round(self.p * Q)
        frac = min(finished, n - 1) / (n - 1) if n > 1 else 0.0
        return round((self.p0 + (self.p_max - self.p0) * frac) * Q)

    def per_token(self, f: float, g: float, batch: int, p: float) -> tuple[float, float]:
        """(f', g') of one engine step (one token per request) from the plain model's verify-pass
        fixed part `f` (at B*(1+k)) and KV term `g` (at B)."""
        k = self.draft_len(batch)
        e = tokens_per_step(k, p)
        return (f + self.draft_s * k + self.overhead_s) / e, g / e


def acceptance_notes(spec: SpeculativeSpec) -> list[str]:
    """A line when the setting's accept lengths lie outside the published ones for its model
    (by more than 5 %): what a user should not take for a measured figure."""
    (lo_pub, hi_pub), source = PUBLISHED[spec.acceptance]
    lo, hi = spec.range_of()
    out = []
    if hi > hi_pub * 1.05:
        out.append(f"speculative: {spec.acceptance} acceptance gives up to {hi:.2f} tokens per "
                   f"verify step (k_max {spec.k_max}), above the published {lo_pub:.2f}-"
                   f"{hi_pub:.2f} ({source}): the speed-up is an assumption, not a measurement")
    if lo < lo_pub * 0.95 and not math.isclose(lo, 1.0):
        out.append(f"speculative: {spec.acceptance} acceptance gives {lo:.2f} tokens per verify "
                   f"step at its lowest, below the published {lo_pub:.2f}-{hi_pub:.2f} "
                   f"({source})")
    return out
