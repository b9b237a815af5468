"""SGLang 0.5.23's scheduling rules: the `sglang` family (and the rules `bundled` and, for now,
`vllm` run with their own parameters).

A prefill batch runs as its own step before decode (no mixed chunks); with chunked prefill each
forward pass is planned on its own (`select_pass`: SGLang's `PrefillAdder` with a chunk budget, the
request a pass left unfinished first). Admission is FCFS within
priority classes under a KV reserve: a candidate needs its input now, one slot per running
request for the decode after the prefill, and SGLang's estimate of future growth must fit (the
running requests' remaining max_new times the new-token ratio, plus the candidate's in full:
`PrefillAdder`), with each remainder clipped at `clip_max_new_tokens`. The ratio decays per decode
step from its initial value to a floor, is re-estimated after a retraction and reset when the
engine empties (`new_token_ratio_tracker.py`); with no decay schedule (`new_token_ratio_decay_steps`
0, a bare `EngineSpec`) it stays constant and a retraction holds admission until a request
finishes instead (an older rule); under SGLang's schedule a refused queue head holds admission
until a running request leaves (`batch_is_full`). When the next decode would overflow the KV cache
the requests with the fewest generated tokens are retracted (then the longest prompt, then the
latest to join: `protocol.victim_order`) and requeued at the head or the tail of their priority
class (`retract_to`; SGLang appends).

KV accounting (both engines): a request in a prefill batch holds its input (prompt + tokens it
carries) in the KV cache (in a chunked prefill, the tokens its passes computed so far); the pass
that ends its prefill emits its next output token, whose KV entry is written by the following
decode iteration. So a running request holds `input_len + gen - 1`
tokens, and each decode iteration needs one new slot per running request.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Container
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from aprilsim.engine.families.protocol import (
    ABORT_AT_ONCE,
    Admitted,
    PassInputs,
    Rules,
    Spec,
    Step,
)
from aprilsim.engine.parts import PREFILL
from aprilsim.engine.waiting import requeue

if TYPE_CHECKING:
    from aprilsim.engine.clipped_reserve import ClippedReserve
    from aprilsim.engine.parts import PrefixCache
    from aprilsim.engine.request import Request


def check_abort_steps(k: object) -> None:
    """A family's `abort_steps` must be a whole number >= -1."""
    if isinstance(k, bool) or not isinstance(k, int) or k < ABORT_AT_ONCE:
        raise ValueError(f"abort_steps {k!r}: must be >= 0, or -1 (the abort lands at once)")


def check_block(b: object) -> None:
    """A family's `prefix_cache_block` must be a whole number of tokens >= 1."""
    if isinstance(b, bool) or not isinstance(b, int) or b < 1:
        raise ValueError(f"prefix_cache_block {b!r}: must be a whole number of tokens >= 1 "
                         "(1: token-level)")


def check_retract_to(where: object) -> None:
    """Where preempted requests re-enter the queue: "head" or "tail"."""
    if where not in ("head", "tail"):
        raise ValueError(f"retract_to {where!r}: must be \"head\" or \"tail\"")


@dataclass(frozen=True)
class SGLangFamily:
    """SGLang's rules with their defaults (SGLang 0.5.23): retracted requests appended to the
    queue (`scheduler._add_request_to_queue`), an abort landing one decode forward pass later
    (`scheduler.abort_request`, "Abort method 3"), a radix cache matching token by token
    (`--page-size 1`, its default) and kept past a request's life. A bare `EngineSpec` runs the
    simpler `SIMPLE` (retract to the head, aborts landing at once)."""

    retract_to: str = "tail"
    abort_steps: int = 1
    cache_block: int = 1

    def __new__(cls, *args: Any, **kwargs: Any) -> SGLangFamily:
        """Check the parameters before `__init__` sets them: a compiled (mypyc) build
        type-checks each field as it is set and would raise a TypeError naming none; this raises
        the same ValueError on both builds (`dataclasses.replace` included)."""
        check_params(cls, args, kwargs)
        return super().__new__(cls)

    @property
    def name(self) -> str:
        """The registered name."""
        return "sglang"

    @property
    def live_prefix_cache(self) -> str:
        """SGLang's radix cache is on by default and keeps prefixes past their requests."""
        return "lru"

    @property
    def live_accept_is_arrival(self) -> bool:
        """SGLang answers as its tokenizer manager takes the request, which hands token-id
        input to the scheduler at once."""
        return True

    def rules(self, spec: Spec) -> Rules:
        """Fresh SGLang rules for one engine of `spec`."""
        return SGLangRules(spec, "sglang", self.retract_to, self.abort_steps, self.cache_block)


def check_params(cls: type, args: tuple, kwargs: dict) -> None:
    """The checks of a family whose parameters are `retract_to`, `abort_steps`, `cache_block`."""
    given = dict(zip((f.name for f in fields(cls)), args))
    given.update(kwargs)
    if "abort_steps" in given:
        check_abort_steps(given["abort_steps"])
    if "cache_block" in given:
        check_block(given["cache_block"])
    if "retract_to" in given:
        check_retract_to(given["retract_to"])


SIMPLE = SGLangFamily(retract_to="head", abort_steps=ABORT_AT_ONCE)  # a bare EngineSpec's


class SGLangRules(Rules):
    """One engine's SGLang rules: the spec's numbers copied once into native attributes (several
    are properties of the spec, a Python call per read), and the new-token ratio's state: `base`
    set at decode iteration `it0` (a reset or a retraction's re-estimate), decaying per step from
    there (`ratio`)."""

    def __init__(self, spec: Spec, family: str, retract_to: str, abort_steps: int,
                 cache_block: int) -> None:
        # typed one by one: `spec` is untyped here, and an untyped number would be boxed (and
        # its arithmetic generic) in the compiled build
        self.family = family
        self.abort_steps = abort_steps
        self.cache_block = cache_block
        self.mixed_steps = False
        self.to_head: bool = retract_to != "tail"
        self.fewest_first = True  # SGLang's `retract_decode` sorts by output tokens
        self.kv_capacity = int(spec.kv_capacity)
        self.max_running = int(spec.max_running)
        self.max_prefill_tokens: int = int(spec.max_prefill_tokens)
        self.chunk: int = int(spec.prefill_chunk)
        self.per_pass = self.chunk > 0  # SGLang plans a chunked prefill pass by pass
        self.clip = int(spec.clip_max_new_tokens)
        self.sglang_ratio: bool = bool(spec.sglang_ratio)
        self.refusal_holds = self.sglang_ratio  # SGLang's `batch_is_full`, with its schedule
        self.new_token_ratio: float = float(spec.new_token_ratio)
        self.decay: float = float(spec.new_token_ratio_decay)
        self.min_ratio: float = float(spec.min_new_token_ratio)
        self.retract_decode_steps: int = int(spec.retract_decode_steps)
        self.base: float = self.new_token_ratio
        self.it0: int = 0

    # ------------------------------------------------------------------ the new-token ratio
    def ratio(self, it: int) -> float:
        """The new-token ratio at decode iteration `it` (`ratio_at`)."""
        return self.ratio_at(self.base, it - self.it0)

    def ratio_at(self, base: float, steps: int) -> float:
        """The ratio `steps` decode steps after it was set to `base`. SGLang subtracts the decay
        once per decode step and floors at the minimum; both engines use this closed form
        instead, so they compute the same float. Constant when the schedule is off."""
        if steps <= 0 or not self.sglang_ratio:
            return base
        r = base - self.decay * steps
        lo = self.min_ratio
        return r if r > lo else lo

    def ratio_after_retraction(self, gen_sum: int, max_new_sum: int, n: int) -> float:
        """SGLang's `estimate_new_token_ratio_after_retract`, over the requests still running: what
        they have generated plus `retract_decode_steps` each, over their max_new_tokens (+1)."""
        return min(1.0, (gen_sum + self.retract_decode_steps * n) / (max_new_sum + 1))

    def reset(self, it: int) -> None:
        """Back to the initial ratio (the engine went idle, or was aborted) at iteration `it`."""
        self.base, self.it0 = self.new_token_ratio, it

    def retracted(self, it: int, gen_sum: int, max_new_sum: int, n: int) -> bool:
        """SGLang re-estimates the ratio over the requests left (the step that retracted does not
        decay it); the older rule holds admission until a request finishes instead."""
        if not self.sglang_ratio:
            return True
        self.base = self.ratio_after_retraction(gen_sum, max_new_sum, n)
        self.it0 = it + 1
        return False

    # ------------------------------------------------------------------ admission
    def reserve_of(self, remaining: int) -> int:
        """A request's remaining max_new_tokens as the admission estimate counts it (SGLang's
        CLIP_MAX_NEW_TOKENS; no clip at 0)."""
        c = self.clip
        return remaining if c == 0 or remaining < c else c

    def admits_head(self, waiting: deque[Request], n_running: int, kv: int, reserve: int,
                    it: int, batch_reserve: int = 0, resident: Container[int] = ()) -> bool:
        """Would the head of the waiting queue be admitted at decode iteration `it`? (FCFS: the
        head blocks the rest.)

        `n_running` counts the running requests and those already chosen for this prefill batch;
        `kv` includes them. `reserve` is the running requests' remaining max_new (clipped), and
        `batch_reserve` what the requests already chosen for this batch reserve. Two conditions:

        * the decode iteration after the prefill fits: the input now, plus one slot for every
          running request (this one included). So a prefill never forces a retraction at the next
          boundary, whatever the ratio (at 0 nothing else would prevent that wasted prefill). A
          request alone always passes, since input_len + max_new <= kv_capacity
          (`check_requests`);
        * SGLang's estimate of future growth must fit in what is free: the ratio at `it` times
          the running requests' remaining max_new, plus the candidate's remaining max_new in
          full with SGLang's schedule (`PrefillAdder`), or times the ratio with the older rule.
          With SGLang's schedule the comparison is SGLang's: `total_tokens < remaining_total`
          (`PrefillAdder.add_one_req`, `PrefillBudget.check_prefill`), a page of one token per
          request, and `batch_reserve` holds, per request already in the batch, its whole
          clipped max_new_tokens and a page (`select_batch`).
        """
        if not waiting or n_running >= self.max_running:
            return False
        r = waiting[0]
        need = r.input_len + r.gen
        if r.shared and r.prefix not in resident:  # it brings its shared prefix (`resident`: held)
            need += r.shared
        if kv + need + n_running + 1 > self.kv_capacity:
            return False
        if n_running == 0:
            return True
        head, c = r.max_new - r.gen, self.clip  # reserve_of(...), inline
        if c and head >= c:
            head = c
        steps = it - self.it0  # self.ratio(it), inline: asked at every plan with a queue
        ratio = self.base
        if steps > 0 and self.sglang_ratio:
            ratio = ratio - self.decay * steps
            if ratio <= self.min_ratio:
                ratio = self.min_ratio
        if self.sglang_ratio:  # total_tokens (+1 page) < remaining_total
            return need + head + 1 < self.kv_capacity - kv - ratio * reserve - batch_reserve
        return need + ratio * head <= self.kv_capacity - kv - ratio * (reserve + batch_reserve)

    def select_batch(self, waiting: deque[Request], n_running: int, kv: int, reserve: int,
                     it: int, resident: Container[int] = ()) -> Admitted:
        """Pop from `waiting` the requests one prefill batch admits (FCFS, KV reserve, token
        budget: at most `max_prefill_tokens` input tokens, at least one request).

        Returns the batch (empty when the head is not admitted: the fast engine's one admission
        test) with what it adds up to, counted in the same pass (its hot path): the input tokens
        it computes, the sum of their squares per request (attention work), its remaining
        max_new (unclipped), the migrated tokens it holds without computing them
        (`Request.migrated`: n computed tokens after m migrated ones cost (m + n)^2 - m^2), and
        whether the token budget ended it (the queue head was admissible but did not fit: no
        hold). Without chunked prefill only (`per_pass`: `select_pass`). With prefix
        sharing, `resident` holds the prefixes already on the engine; a request whose prefix is
        neither there nor brought by an earlier request of the batch brings it
        (`parts.prefill_pieces`).

        Under SGLang's schedule the budgets are asked in `PrefillAdder`'s order: after each
        admission, no KV capacity left ends the batch as a refusal (`budget_state` NO_TOKEN:
        the caller holds admission, `batch_is_full`), then input tokens reaching
        `max_prefill_tokens` end it as the token budget (OTHER); a candidate whose input would
        reach what is left of that budget ends it too (`input_tokens >= rem_input_tokens`).
        """
        batch: list[Request] = []
        tokens = sq = added = held = moved = 0
        limit = self.max_prefill_tokens
        seen: Container[int] = resident
        brought: set[int] | None = None  # the prefixes this batch brings (made at the first)
        sglang = self.sglang_ratio
        ratio = self.ratio(it) if sglang else 0.0
        while True:
            if batch and sglang and waiting:  # `PrefillAdder.budget_state`, after an admission
                if kv + tokens + moved + ratio * reserve + held >= self.kv_capacity:
                    break  # NO_TOKEN: refused
                if tokens >= limit:
                    return batch, tokens, sq, added, moved, True  # OTHER: the budget is spent
            if not self.admits_head(waiting, n_running + len(batch), kv + tokens + moved,
                                    reserve, it, held, seen):
                break
            r = waiting[0]
            need = r.input_len + r.gen
            s = r.shared
            brings = s and r.prefix not in seen  # a shared prefix not held yet: computed here
            if brings:
                need += s
            m = r.migrated  # held with the request, not computed (never with a shared prefix)
            if batch and tokens + need - m + sglang > limit:  # SGLang: input >= rem_input_tokens
                return batch, tokens, sq, added, moved, True
            waiting.popleft()
            batch.append(r)
            tokens += need - m
            sq += _attention_work(need, s if s and not brings else 0, m)
            moved += m
            if brings:
                if brought is None:
                    brought = set()
                    seen = _Union(resident, brought)
                brought.add(r.prefix)
            added += r.max_new - r.gen
            held += self.batch_reserve_of(r)
        return batch, tokens, sq, added, moved, False

    def batch_reserve_of(self, r: Request) -> int:
        """What a request admitted into a prefill batch reserves for the next candidates: with
        SGLang's schedule its whole clipped max_new_tokens and a page
        (`PrefillAdder._update_prefill_budget`), else its clipped remainder."""
        if self.sglang_ratio:
            return self.reserve_of(r.max_new) + 1
        return self.reserve_of(r.max_new - r.gen)

    def select_pass(self, at: PassInputs) -> Step:
        """One forward pass of SGLang's chunked prefill, as `_get_new_batch_prefill_raw` builds
        it with a fresh `PrefillAdder` (`rem_chunk_tokens` = `chunk`, `rem_input_tokens` =
        `max_prefill_tokens`, its reserve offset = the ratio at `at.it` times the running
        requests' clipped remaining tokens, `at.reserve`).

        The request a pass left unfinished continues first (`add_chunked_req`: `_continue`).
        Then queued requests, FCFS, while the pass's budgets last (`budget_state`): at most
        `max_running` requests with the running ones, each admitted as `admits_head` says (its
        whole input), computing what the chunk has left of its prefill and left unfinished when
        that is not all (it reserves no max_new_tokens then: `_update_prefill_budget`); after
        each, no KV left in the estimate ends the pass as a refusal (NO_TOKEN). A refusal with
        requests running holds admission (`batch_is_full`), unless the pass leaves a request
        unfinished (SGLang lifts it at the next step). Returns a PREFILL step (`chunks`,
        `left`), its batch empty when nothing is prefilled."""
        p = _Pass(self.chunk, self.max_prefill_tokens, self.ratio(at.it), at.resident)
        if at.partial is not None:
            self._continue(p, at)
            if p.left:  # unfinished again: nothing else joins (no budget, or no KV, left)
                return Step(PREFILL, p.batch, chunks=p.chunks, left=p.left)
        refused = False
        waiting, sglang = at.waiting, self.sglang_ratio
        while waiting and p.rem > 0 and p.rem_in > 0:
            if at.n_running + len(p.batch) >= self.max_running or not self.admits_head(
                    waiting, at.n_running + len(p.batch), at.kv + p.added, at.reserve, at.it,
                    p.held, p.seen):
                refused = True
                break
            self._admit(p, waiting.popleft(), at.cache)
            if sglang and at.kv + p.added + p.ratio * at.reserve + p.held >= self.kv_capacity:
                refused = True  # NO_TOKEN (`budget_state`, asked before the budgets)
                break
        hold = self.refusal_holds and refused and at.n_running > 0 and not p.left
        return Step(PREFILL, p.batch, hold=hold, chunks=p.chunks, left=p.left)

    def _continue(self, p: _Pass, at: PassInputs) -> None:
        """The unfinished request's piece (`add_chunked_req`): as many tokens as the chunk
        holds, or what is free in the KV estimate when that is less but positive
        (`PrefillBudget.available_chunk_tokens`); it reserves its page, and its whole clipped
        max_new_tokens once this piece ends its prefill."""
        partial = at.partial
        assert partial is not None
        avail = int(self.kv_capacity - at.kv - p.ratio * at.reserve)
        if avail > p.rem:
            avail = p.rem
        if avail <= 0:
            avail = p.rem  # the continuing chunk must make progress to release its KV
        piece = partial.walk - partial.done
        if piece > avail:
            p.left, piece = piece - avail, avail
        p.take(partial.req, piece, self._page() if p.left else self.batch_reserve_of(partial.req))

    def _admit(self, p: _Pass, r: Request, cache: PrefixCache | None) -> None:
        """A queued request joins the pass: what it computes (its input, and its shared prefix
        when it brings it, less what it holds uncomputed: migrated KV, or tokens the retained
        `cache` serves), as much of it as the chunk has left."""
        free_kv = r.migrated + (cache.served(r, p.seen) if cache is not None else 0)
        need = r.input_len + r.gen
        if r.shared and r.prefix not in p.seen:  # it brings its prefix
            need += r.shared
            p.bring(r.prefix)
        walk = need - free_kv
        piece = walk if walk <= p.rem else p.rem
        if piece < walk:
            p.left = walk - piece
        p.added += free_kv
        p.take(r, piece, self._page() if piece < walk else self.batch_reserve_of(r))

    def _page(self) -> int:
        """What an unfinished request reserves beyond its piece: SGLang's page (none under the
        older rule)."""
        return 1 if self.sglang_ratio else 0

    def stretch(self, lo: int, hi: int, n_running: int, kv: int, reserve: int,
                clipped: ClippedReserve | None, it: int, head: Request,
                resident: Container[int]) -> int | None:
        """None: a running batch stays fixed through its span. With SGLang's schedule a head
        refused at a boundary holds admission until a running request leaves (`batch_is_full`,
        `refusal_holds`), whatever the decaying ratio would admit later; with the older
        constant ratio a head refused stays refused while the batch only grows."""
        return None

    # ------------------------------------------------------------------ preemption
    def requeue(self, waiting: deque[Request], victims: list[Request]) -> None:
        """At the head (in reverse eviction order, as SGLang's `extendleft`) or the tail of their
        priority class (`retract_to`)."""
        requeue(waiting, victims, self.to_head)


def _attention_work(need: int, cached: int, migrated: int) -> int:
    """A prefilled request's attention work (sum of squares): `need` tokens computed after
    `cached` prefix tokens attended to, or after `migrated` tokens held without computing."""
    if cached:
        return (cached + need) * (cached + need) - cached * cached
    return need * need - migrated * migrated


class _Pass:
    """One chunked prefill pass as `SGLangRules.select_pass` builds it: its requests and their
    pieces, what its budgets have left (`rem`: the chunk, `rem_in`: the input budget), the KV it
    adds, what it reserves beyond that (pages and max_new_tokens: `held`), what its last request
    still computes after it (`left`), and the prefixes held or brought so far (`seen`)."""

    def __init__(self, chunk: int, budget: int, ratio: float, resident: Container[int]) -> None:
        self.batch: list[Request] = []
        self.chunks: list[int] = []
        self.rem = chunk
        self.rem_in = budget
        self.ratio = ratio
        self.added = 0
        self.held = 0
        self.left = 0
        self.resident = resident
        self.seen: Container[int] = resident
        self.brought: set[int] | None = None

    def take(self, r: Request, piece: int, reserve: int) -> None:
        """`r` computes `piece` tokens in this pass and reserves `reserve` more."""
        self.batch.append(r)
        self.chunks.append(piece)
        self.added += piece
        self.held += reserve
        self.rem -= piece
        self.rem_in -= piece

    def bring(self, prefix: int) -> None:
        """A request of this pass brings shared prefix `prefix` (held from now on)."""
        if self.brought is None:
            self.brought = set()
            self.seen = _Union(self.resident, self.brought)
        self.brought.add(prefix)


class _Union:
    """Membership in either of two containers (the engine's prefixes, the batch's new ones)."""

    __slots__ = ("a", "b")

    def __init__(self, a: Container[int], b: Container[int]) -> None:
        self.a, self.b = a, b

    def __contains__(self, x: object) -> bool:
        return x in self.a or x in self.b
