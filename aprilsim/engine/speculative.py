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

Acceptance: "constant" (p for every request); "siblings": p rises linearly from p0 to p_max
as the request's group has 0 .. n-1 finished siblings on its engine; "group", "history",
"model": read from the run's `draft_board.DraftBoard` (the group's text wherever it runs, the
prompt's earlier epochs, a draft model's age; `speculative_spec` has the sources). A batch of
requests with different p steps at the batch's mean p (the mean of integer 1/Q units, Q = 2^16,
so every engine model computes the same float in any order). What the fluid model gives up: a live
engine emits an integer number
of tokens per verify step (1 .. k+1, at random); here a request's finish moves by less than one
verify step, tens of milliseconds in a rollout of minutes. No I/O; the settings and their math
live in `speculative_spec` (which `cost.EngineSpec` imports).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from aprilsim.engine.cost import _LinearInK
from aprilsim.engine.speculative_spec import (
    ACCEPTANCE,
    Q,
    SpeculativeSpec,
    fit_acceptance,
    tokens_per_step,
)

if TYPE_CHECKING:
    from aprilsim.engine.request import Request

__all__ = ["ACCEPTANCE", "Q", "SpeculativeCost", "SpeculativeHooks", "SpeculativeSpec",
           "attach_board", "engine_cost", "fit_acceptance", "speculative_hooks",
           "tokens_per_step"]


class SpeculativeCost(_LinearInK):
    """A cost model whose decode step is one speculative token per request (`per_token`): still
    f(B) + g(B)*K, so the closed forms of `cost._LinearInK` (spans, their inversion) hold; the
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
        # the board models: the run's DraftBoard (`attach_board`) and each request's acceptance
        # as last read from it (re-read at this engine's arrivals and departures)
        self.board: Any = None
        self.own: dict[int, int] = {}

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

    def prefill_time(self, tokens: int, tokens_sq: float | None = None, passes: int = 1,
                     requests: int = 0) -> float:
        """The plain model's prefill (speculative decoding drafts only in decode)."""
        return self.base.prefill_time(tokens, tokens_sq, passes, requests)

    # ---- "siblings" acceptance: what the engine tells it
    def submitted(self, reqs: Iterable[Request]) -> None:
        """Requests queued on the engine: remember their groups (n from `Request.group_n`), or
        read their acceptance from the board."""
        board = self.board
        if board is not None:
            for r in reqs:
                self.own[r.rid] = board.units(r.rid)
        elif self.spec.by_siblings:
            for r in reqs:
                if r.group >= 0:
                    self.groups[r.rid] = (r.group, r.group_n)

    def finished(self, done: Iterable[Any]) -> None:
        """Completions at one event: the finished ones (not aborted) count for their group; with
        a board, each reports what it generated and the others' acceptance is read again."""
        board = self.board
        if board is not None:
            own = self.own
            for c in done:
                board.report(c.rid, c.tokens, c.reason)
                own.pop(c.rid, None)
            if self.spec.acceptance == "group":  # the only board model that moves with others
                for rid in own:
                    own[rid] = board.units(rid)
            return
        if not self.spec.by_siblings:
            return
        groups, fin = self.groups, self.fin
        for c in done:
            got = groups.pop(c.rid, None)
            if got is not None and c.reason != "abort":
                fin[got[0]] = fin.get(got[0], 0) + 1

    def set_batch(self, running: Iterable[Request]) -> None:
        """A decode plan starts over `running`: the batch's mean acceptance (1/Q units, floored)."""
        spec, groups, fin, own = self.spec, self.groups, self.fin, self.own
        total = n = 0
        if self.board is not None:
            for r in running:
                total += own[r.rid]
                n += 1
        else:
            for r in running:
                got = groups.get(r.rid)
                total += spec.p_units(fin.get(got[0], 0), got[1]) if got else spec.p_units(0, 1)
                n += 1
        self.units = total // n if n else spec.p_units(0, 1)


class SpeculativeHooks:
    """What an engine with speculative decoding tells and asks besides its cost model: `plain`,
    the cost without it (the saving's counterfactual), and with "siblings" acceptance `sib`, the
    engine's `SpeculativeCost`, told of submissions and finishes and given each decode plan's
    batch (None otherwise)."""

    __slots__ = ("cost", "plain", "sib")

    def __init__(self, cost: _LinearInK, plain: _LinearInK) -> None:
        self.cost = cost
        self.plain = plain
        self.sib: SpeculativeCost | None = (
            cost if isinstance(cost, SpeculativeCost) and cost.spec.by_siblings else None)

    def saving(self, m: int, b: int, kv: int) -> float:
        """Seconds speculative decoding adds to m decode steps of `b` requests from `kv` KV
        tokens (negative: what it saves)."""
        return self.cost.decode_span(m, b, kv) - self.plain.decode_span(m, b, kv)

    def submitted(self, reqs: list[Request]) -> None:
        """Requests queued on the engine."""
        if self.sib is not None:
            self.sib.submitted(reqs)

    def finished(self, done: list[Any]) -> None:
        """Completions at one event."""
        if self.sib is not None:
            self.sib.finished(done)

    def set_batch(self, running: Iterable[Request]) -> None:
        """A decode plan starts over `running`."""
        if self.sib is not None:
            self.sib.set_batch(running)


def speculative_hooks(spec: Any, cost: _LinearInK) -> SpeculativeHooks | None:
    """The hooks of an engine of `spec` stepping with `cost` (`engine_cost`), None when
    speculative decoding is off."""
    return SpeculativeHooks(cost, spec.cost) if spec.speculative is not None else None


def attach_board(engines: Iterable[Any], board: Any) -> None:
    """Give each engine's per-request acceptance (its speculative hooks' `sib`, a
    `SpeculativeCost`) the run's `DraftBoard` (the runtime creates one per run for the board
    models)."""
    for e in engines:
        hooks = getattr(e, "speculative", None)
        sib = getattr(hooks, "sib", None)
        if isinstance(sib, SpeculativeCost):
            sib.board = board


def engine_cost(spec: Any) -> _LinearInK:
    """The cost model an engine of `spec` (an EngineSpec) steps with: its own, or a fresh
    per-engine `SpeculativeCost` when `spec.speculative` is set."""
    sd = getattr(spec, "speculative", None)
    return spec.cost if sd is None else SpeculativeCost(spec.cost, sd)
