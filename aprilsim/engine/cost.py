"""The engine cost model and presets.

A decode iteration with B running requests holding K KV tokens at its start takes
t(B, K) = f(B) + g(B)*K: linear in K while B is fixed. Two forms of f and g exist:

* `CostModel`: f(B) = a + b*B, g(B) = c (three coefficients, what the presets use);
* `TabulatedCost`: f and g piecewise linear over tables of batch sizes (a calibration that the
  three-coefficient form fits badly, e.g. at small B).

Because K grows by B per iteration while B is fixed, n iterations from K0 take
n*(f + g*K0) + g*B*n*(n-1)/2 whatever f and g are: closed form and invertible, which is all the
event-jumping engine needs (`decode_span`, `iterations_within`). A prefill batch of requests with
n_i input tokens takes p0 + p1*sum(n_i) + p2*sum(n_i^2) + pr*(requests): attention is quadratic
in each sequence, not in the batch's token total, and a CPU engine (or a GPU one's Python
scheduler) spends a fixed time per sequence that no token count expresses (`pr`, fitted by
`aprilsim calibrate`; 0 in the presets). With chunked prefill (SGLang's `chunked_prefill_size`) a
batch runs as forward passes of at most `chunk` tokens; each pass pays p0 once and the quadratic
terms telescope, so the batch takes passes*p0 + p1*sum(n_i) + p2*sum(n_i^2) (`prefill_passes`,
`chunked_prefill_time`). Presets are roofline *estimates*, each with the arithmetic behind it, to
be replaced by a calibration.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from aprilsim.engine.cost_protocol import DecodeCost
from aprilsim.engine.families.protocol import Family
from aprilsim.engine.families.sglang import SIMPLE, SGLangFamily
from aprilsim.engine.kv_transfer import KvTransferSpec
from aprilsim.engine.speculative_spec import SpeculativeSpec


class _LinearInK:
    """The closed forms shared by every t(B, K) = f(B) + g(B)*K (subclasses define
    `coefficients` and the prefill coefficients p0, p1, p2, pr)."""

    p0: float
    p1: float
    p2: float
    pr: float

    def coefficients(self, batch: int) -> tuple[float, float]:
        """(f(B), g(B)): fixed seconds per iteration and seconds per KV token read."""
        raise NotImplementedError

    def decode_time(self, batch: int, kv_tokens: float) -> float:
        """Seconds of one decode iteration with `batch` requests holding `kv_tokens`."""
        f, g = self.coefficients(batch)
        return f + g * kv_tokens

    def decode_span(self, n: int, batch: int, kv_tokens: float) -> float:
        """Seconds of n iterations from `kv_tokens` with `batch` requests (K grows by B each)."""
        f, g = self.coefficients(batch)
        return n * (f + g * kv_tokens) + g * batch * n * (n - 1) / 2

    def iterations_within(self, dt: float, batch: int, kv_tokens: float, n_max: int) -> int:
        """Largest m <= n_max whose m iterations end no later than `dt` after they start: the
        root of a quadratic, then corrected by at most a step either way for float rounding."""
        if dt <= 0 or n_max <= 0:
            return 0
        f, g = self.coefficients(batch)
        half = g * batch / 2  # span(m) = half*m^2 + lin*m
        lin = f + g * kv_tokens - half
        if half > 0:
            m = int((-lin + math.sqrt(lin * lin + 4 * half * dt)) / (2 * half))
        else:
            m = int(dt / lin)
        m = min(max(m, 0), n_max)
        span = self.decode_span  # the float estimate may be off by one either way
        while m < n_max and span(m + 1, batch, kv_tokens) <= dt:
            m += 1
        while m > 0 and span(m, batch, kv_tokens) > dt:
            m -= 1
        return m

    def prefill_time(self, tokens: int, tokens_sq: float | None = None, passes: int = 1,
                     requests: int = 0) -> float:
        """passes*p0 + p1*sum(n_i) + p2*sum(n_i^2) + pr*requests; `tokens_sq` defaults to one
        request's tokens^2, `passes` to one forward pass (no chunking), `requests` to 0 (callers
        that do not count the batch's requests get no per-request term)."""
        if tokens_sq is None:
            tokens_sq = tokens * tokens  # one request
        p0 = self.p0 if passes == 1 else passes * self.p0
        t = p0 + self.p1 * tokens + self.p2 * tokens_sq
        return t + self.pr * requests if requests else t


def _check_prefill(p0: float, p1: float, p2: float, pr: float = 0.0) -> None:
    for k, v in (("p0", p0), ("p1", p1), ("p2", p2), ("pr", pr)):
        if v < 0:
            raise ValueError(f"cost coefficient {k} must be >= 0")


# the public name of the base every cost model an engine steps with derives from (a compiled
# engine calls it natively where its type is known)
LinearInK = _LinearInK


@dataclass(frozen=True)
class CostModel(_LinearInK):
    """t(B, K) = a + b*B + c*K per decode iteration; prefill p0 + p1*sum(n_i) + p2*sum(n_i^2)
    + pr*(requests)."""

    a: float
    b: float
    c: float
    p0: float
    p1: float
    p2: float = 0.0
    pr: float = 0.0  # seconds per request of a prefill batch

    def __post_init__(self) -> None:
        for k in ("a", "b", "c"):
            if getattr(self, k) < 0:
                raise ValueError(f"cost coefficient {k} must be >= 0")
        _check_prefill(self.p0, self.p1, self.p2, self.pr)
        if self.a <= 0 and self.b <= 0:
            raise ValueError("cost coefficients a and b cannot both be zero (iterations take time)")

    def coefficients(self, batch: int) -> tuple[float, float]:
        """(f(B), g(B)) = (a + b*B, c)."""
        return self.a + self.b * batch, self.c

    # the two hot-path methods, inlined (the fast engine calls them once per event)
    def decode_time(self, batch: int, kv_tokens: float) -> float:
        """Seconds of one decode iteration with `batch` running requests holding `kv_tokens`."""
        return self.a + self.b * batch + self.c * kv_tokens

    def decode_span(self, n: int, batch: int, kv_tokens: float) -> float:
        """Time of n iterations from KV `kv_tokens` with `batch` requests (K grows by B each)."""
        return n * (self.a + self.b * batch + self.c * kv_tokens) + self.c * batch * n * (n - 1) / 2


@dataclass(frozen=True)
class TabulatedCost(_LinearInK):
    """t(B, K) = f(B) + g(B)*K with f, g piecewise linear over `table_b` (strictly increasing
    batch sizes >= 1); below the first and above the last point they keep their end values, so
    tables should span 1..max_running. Prefill as in `CostModel`."""

    table_b: tuple[int, ...]
    table_f: tuple[float, ...]
    table_g: tuple[float, ...]
    p0: float
    p1: float
    p2: float = 0.0
    pr: float = 0.0  # seconds per request of a prefill batch
    _fg: tuple[tuple[float, float], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        bs, fs, gs = self.table_b, self.table_f, self.table_g
        if not bs or not len(bs) == len(fs) == len(gs):
            raise ValueError("table_b, table_f and table_g must be non-empty and of equal length")
        if bs[0] < 1 or any(x >= y for x, y in zip(bs, bs[1:])):
            raise ValueError("table_b must be strictly increasing batch sizes >= 1")
        if any(v <= 0 for v in fs) or any(v < 0 for v in gs):
            raise ValueError("table_f must be > 0 (iterations take time) and table_g >= 0")
        _check_prefill(self.p0, self.p1, self.p2, self.pr)
        # f and g at every B up to the last tabulated one, computed once (the engine's hot path)
        fg = tuple((self._interp(fs, b), self._interp(gs, b)) for b in range(bs[-1] + 1))
        object.__setattr__(self, "_fg", fg)

    def _interp(self, values: tuple[float, ...], batch: int) -> float:
        bs = self.table_b
        if batch <= bs[0]:
            return float(values[0])
        if batch >= bs[-1]:
            return float(values[-1])
        i = bisect_right(bs, batch)  # bs[i-1] <= batch < bs[i]
        w = (batch - bs[i - 1]) / (bs[i] - bs[i - 1])
        return values[i - 1] + w * (values[i] - values[i - 1])

    def coefficients(self, batch: int) -> tuple[float, float]:
        """(f(B), g(B)) interpolated in the tables (precomputed for every B up to the last)."""
        fg = self._fg
        return fg[batch] if batch < len(fg) else fg[-1]


def slowed(spec: EngineSpec, factor: float) -> EngineSpec:
    """`spec` on an engine whose every step takes `factor` times as long (a straggler, a slower
    device, a shared core): each cost coefficient scaled, the rules unchanged."""
    if not factor > 0 or not math.isfinite(factor):
        raise ValueError(f"an engine's slowdown must be a positive number, got {factor!r}")
    if factor == 1:
        return spec
    c = spec.cost
    pre = {k: factor * getattr(c, k) for k in ("p0", "p1", "p2", "pr")}
    if isinstance(c, CostModel):
        cost: CostModel | TabulatedCost = replace(c, a=factor * c.a, b=factor * c.b, c=factor * c.c,
                                                  **pre)
    else:
        cost = TabulatedCost(table_b=c.table_b, table_f=tuple(factor * f for f in c.table_f),
                             table_g=tuple(factor * g for g in c.table_g), **pre)
    return replace(spec, cost=cost)


def prefill_passes(tokens: int, chunk: int, room: int = 0) -> tuple[int, int]:
    """(forward passes a prefill batch of `tokens` input tokens starts, tokens still free in its
    last pass) when a pass holds at most `chunk` tokens (0: no chunking, one pass) and the first
    `room` tokens join the pass the previous batch left open (whose p0 is paid already)."""
    if chunk <= 0:
        return 1, 0
    if tokens <= room:
        return 0, room - tokens
    rest = tokens - room
    return -(-rest // chunk), -rest % chunk


def chunked_prefill_time(
    cost: DecodeCost, input_lens: Sequence[int], chunk: int, room: int = 0,
    cached: Sequence[int] = (),
) -> tuple[float, int, int]:
    """(seconds, forward passes started, tokens still free in the last pass) of a prefill batch
    (its requests' input lengths, in batch order) run as SGLang's chunked prefill, pass by pass.

    The batch's tokens, concatenated, fill forward passes of `chunk` tokens (0: one pass, no
    chunking); the first `room` of them join the pass the previous batch left open. A pass costs
    p0 (when it starts in this batch) + p1*(its tokens) + p2*(the sum over its pieces of
    (prefix+l)^2 - prefix^2), a piece being l tokens of one request whose first `prefix` tokens
    earlier passes prefilled (its attention reads them too). The quadratic terms telescope to
    sum(n_i^2): the total is `cost.prefill_time(sum(n_i), sum(n_i^2), passes)` with
    `prefill_passes` up to float rounding (the fast engine's closed form), and exactly that with
    a single pass. This walk is the definition, and what the reference engine computes.
    `cached[i]` (prefix sharing): tokens of request i's prefix already held, which its pieces
    attend to but do not compute (its quadratic terms then telescope to (s+n)^2 - s^2).
    """
    pre = list(cached) or [0] * len(input_lens)
    if chunk <= 0:
        sq = sum((s + n) * (s + n) - s * s for n, s in zip(input_lens, pre))
        return cost.prefill_time(sum(input_lens), sq, requests=len(input_lens)), 1, 0
    ends, passes, left = _walk_passes(cost, input_lens, chunk, room, pre)
    return (ends[-1] if ends else 0.0), passes, left


def pass_ends(cost: DecodeCost, input_lens: Sequence[int], chunk: int, room: int = 0,
              cached: Sequence[int] = ()) -> list[float]:
    """Seconds from the start of a chunked prefill batch to the end of each pass it runs (the
    open pass it joins first included), as `chunked_prefill_time` sums them: where an abort that
    waits for the pass in flight lands."""
    return _walk_passes(cost, input_lens, chunk, room, list(cached) or [0] * len(input_lens))[0]


def _walk_passes(
    cost: DecodeCost, input_lens: Sequence[int], chunk: int, room: int, cached: Sequence[int]
) -> tuple[list[float], int, int]:
    """(the running total at each pass's end, passes started, room left): the walk both
    `chunked_prefill_time` and `pass_ends` report (chunk >= 1)."""
    ends: list[float] = []
    total = 0.0
    passes = 0
    left = room  # tokens still free in the current pass
    opened = False  # the current pass started in this batch (it pays p0)
    tok = sq = reqs = 0  # the current pass's tokens, quadratic term, requests starting in it
    for n, held in zip(input_lens, cached):
        first = True  # a request's per-request prefill cost lands in the pass of its first piece
        done = held  # tokens of this request already in the cache (its shared prefix)
        n += held
        while done < n:
            if left == 0:
                if tok:
                    total += cost.prefill_time(tok, sq, 1 if opened else 0, reqs)
                    ends.append(total)
                left, opened, tok, sq, reqs = chunk, True, 0, 0, 0
                passes += 1
            piece = min(left, n - done)
            reqs += first
            first = False
            tok += piece
            sq += (done + piece) ** 2 - done**2
            done += piece
            left -= piece
    if tok:
        total += cost.prefill_time(tok, sq, 1 if opened else 0, reqs)
        ends.append(total)
    return ends, passes, left


PREFIX_CACHES = ("none", "group", "lru")


def _check_migration(kv_bytes: float, kv_transfer: object) -> None:
    """`EngineSpec.kv_bytes_per_token` and `kv_transfer` (a `KvTransferSpec`)."""
    if not isinstance(kv_transfer, KvTransferSpec):
        raise ValueError("kv_transfer must be a KvTransferSpec")
    if not 0 <= kv_bytes < 1e9:
        raise ValueError("kv_bytes_per_token must lie in [0, 1e9)")


@dataclass(frozen=True)
class EngineSpec:
    """One engine = one SGLang server (a DP replica with tensor parallelism `tp`)."""

    cost: CostModel | TabulatedCost
    kv_capacity: int = 800_000
    max_running: int = 256
    new_token_ratio: float = 0.1  # the initial ratio (SGLANG_INIT_NEW_TOKEN_RATIO: 0.7)
    max_prefill_tokens: int = 16_384
    tp: int = 2
    label: str = "custom"
    source: str = ""
    # SGLang's ratio schedule (`new_token_ratio_tracker.py`): it decays linearly per decode step
    # from `new_token_ratio` to new_token_ratio * min_new_token_ratio_factor over
    # `new_token_ratio_decay_steps` steps, is re-estimated after a retraction and reset when the
    # engine is idle. 0 steps: the older rule, a constant ratio and no admission after a
    # retraction until a request finishes.
    new_token_ratio_decay_steps: int = 0  # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS: 600
    min_new_token_ratio_factor: float = 0.14  # SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
    retract_decode_steps: int = 20  # SGLANG_RETRACT_DECODE_STEPS
    # remaining max_new_tokens counted in the admission estimate at most this many (0: no clip)
    clip_max_new_tokens: int = 0  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION: 4096
    # SGLang's radix cache within a group: a group's samples on one engine prefill and hold its
    # prompt once (all but its last token, which SGLang always recomputes). Pair it with the
    # group_affinity router.
    prefix_sharing: bool = False
    # The prefix cache (`prefix_cache`): "none"; "group", the within-group sharing above (the
    # same as prefix_sharing = True); "lru", that and SGLang's radix cache past a request's life:
    # a prompt and each sample's tokens stay in free KV after their last request left, evicted
    # oldest first when live requests need the KV, so a resubmitted sample (recycled, partial,
    # retracted) and a prompt already seen cost no prefill while kept (`parts.PrefixCache`).
    # `prefix_cache_flush`: a weight update empties it (SGLang's flush_cache, vLLM's
    # reset_prefix_cache); False for a live setting whose engines keep their weights.
    prefix_cache: str = "none"
    prefix_cache_flush: bool = True
    # Seconds from a client's submission to the engine seeing the request (HTTP, tokenising,
    # the client's own loop): the simulated driver delivers each request this late
    # (`aprilsim calibrate` fits it from live timings; 0 in the presets).
    client_overhead_s: float = 0.0
    # Seconds the client takes to send one request (its loop and the server's front end take
    # them one at a time): the k-th request of a send reaches its engine k x this after the
    # first, and a send waits for the one before (`aprilsim validate` measures it; 0: all at once).
    client_send_s: float = 0.0
    # Seconds from a client's abort to its hearing that the engines have stopped (closing the
    # streams or POST /abort_request, then asking until nothing runs): an abort lands no earlier
    # than this after it is sent, whatever the family's rule (`aprilsim validate` measures it on
    # the live runs; 0 in the presets).
    abort_latency_s: float = 0.0
    # Seconds from a client's abort until it reaches the engine (SGLang's and the bundled
    # server's POST /abort_request, handled between two steps): the engine steps on until then
    # and the family's rule (the step in flight, `abort_steps` more) runs from there. 0 where the
    # client cuts its streams itself (vLLM: it keeps what it had received). Needs a family whose
    # aborts wait for a step (`abort_steps` >= 0).
    abort_delivery_s: float = 0.0
    # SGLang's chunked prefill: a prefill batch runs as forward passes of at most this many input
    # tokens, each paying p0 (`prefill_passes`); 0 or -1 (SGLang's "off"): one pass per batch.
    chunked_prefill_size: int = 0  # SGLang on H100/H200: 8192
    # Speculative decoding (`aprilsim.engine.speculative`): None, off; else draft length k(B),
    # acceptance and draft cost. An engine step then emits one token per request and costs a
    # verify step over E(k, p) (`SpeculativeCost`).
    speculative: SpeculativeSpec | None = None
    # The engine family whose rules it runs (`aprilsim.engine.families`: SGLang's, vLLM's, the
    # bundled engine's): where preempted requests re-queue, when an abort lands (`abort_steps`),
    # the retained prefix cache's grain (whole blocks of `family.cache_block` tokens), and the
    # rules each engine asks (`family.rules(spec)`). A bare spec runs SGLang's with the simpler
    # settings (`families.SIMPLE`: retract to the head, aborts landing at once); the presets
    # SGLang 0.5.23's own.
    family: Family = SIMPLE
    # KV migration between engines (`Submit.keep_kv`, Seer's global KV pool): bytes of KV one GPU
    # holds per token (0: unknown, estimated from c) and what a migrated piece's transfer costs
    # (`aprilsim.engine.kv_transfer`: a Mooncake-style pool by default)
    kv_bytes_per_token: float = 0.0
    kv_transfer: KvTransferSpec = KvTransferSpec()

    def __post_init__(self) -> None:
        if self.kv_capacity < 1 or self.max_running < 1 or self.max_prefill_tokens < 1:
            raise ValueError("kv_capacity, max_running and max_prefill_tokens must be >= 1")
        if not 0.0 <= self.new_token_ratio <= 1.0:
            raise ValueError("new_token_ratio must lie in [0, 1]")
        if not 0.0 <= self.min_new_token_ratio_factor <= 1.0:
            raise ValueError("min_new_token_ratio_factor must lie in [0, 1]")
        if self.new_token_ratio_decay_steps < 0 or self.clip_max_new_tokens < 0:
            raise ValueError("new_token_ratio_decay_steps and clip_max_new_tokens must be >= 0")
        if self.retract_decode_steps < 0:
            raise ValueError("retract_decode_steps must be >= 0")
        if self.chunked_prefill_size < -1:
            raise ValueError("chunked_prefill_size must be >= 1, or 0 or -1 (off)")
        for name in ("client_overhead_s", "client_send_s", "abort_latency_s", "abort_delivery_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0")
        if self.abort_delivery_s > 0 and self.family.abort_steps < 0:
            raise ValueError("abort_delivery_s needs a family whose aborts wait for a step "
                             "(abort_steps >= 0; this one lands them at once)")
        self._check_parts()

    def _check_parts(self) -> None:
        """The prefix cache, the family and speculative decoding are what they claim to be."""
        if self.prefix_cache not in PREFIX_CACHES:
            raise ValueError(f"prefix_cache must be one of {', '.join(PREFIX_CACHES)}")
        if not callable(getattr(self.family, "rules", None)):
            raise ValueError(f"family {self.family!r}: must be an engine family "
                             "(aprilsim.engine.families.make_family)")
        if self.speculative is not None and not isinstance(self.speculative, SpeculativeSpec):
            raise ValueError("speculative must be a SpeculativeSpec or None")
        _check_migration(self.kv_bytes_per_token, self.kv_transfer)
        check = getattr(self.family, "check_spec", None)  # what the family's rules need of it
        if check is not None:
            check(self)

    @property
    def shares_prefixes(self) -> bool:
        """True when a group's prompt is held once per engine (prefix cache "group" or "lru")."""
        return self.prefix_sharing or self.prefix_cache != "none"

    @property
    def hashes_tokens(self) -> bool:
        """True when the family's engines hash token ids (vLLM's prefix cache): requests carry
        their content's keys (`RequestBuilder`)."""
        return bool(getattr(self.family, "hashes_tokens", False))

    @property
    def retains_prefixes(self) -> bool:
        """True when token runs outlive their requests (prefix cache "lru")."""
        return self.prefix_cache == "lru"

    @property
    def abort_steps(self) -> int:
        """When an abort lands (the family's rule): -1 (`ABORT_AT_ONCE`) the moment it is sent;
        k >= 0: the step in flight when it arrives completes, then running requests decode k
        more steps."""
        return self.family.abort_steps

    @property
    def aborts_at_once(self) -> bool:
        """True when an abort lands the moment it is sent (``abort_steps`` -1)."""
        return self.family.abort_steps < 0

    @property
    def prefill_chunk(self) -> int:
        """Most input tokens per prefill forward pass; 0 when chunked prefill is off."""
        return self.chunked_prefill_size if self.chunked_prefill_size > 0 else 0

    @property
    def sglang_ratio(self) -> bool:
        """True when the new-token ratio follows SGLang's schedule (decays, re-estimated after a
        retraction); False for the older constant ratio with admission held after a retraction."""
        return self.new_token_ratio_decay_steps > 0

    @property
    def min_new_token_ratio(self) -> float:
        """The floor of the decaying ratio."""
        return self.new_token_ratio * self.min_new_token_ratio_factor

    @property
    def new_token_ratio_decay(self) -> float:
        """How much the ratio drops per decode step (0 with the constant ratio)."""
        if not self.sglang_ratio:
            return 0.0
        return (self.new_token_ratio - self.min_new_token_ratio) / self.new_token_ratio_decay_steps


# Cross-check (issue 11): decode coefficients fitted to a published per-iteration simulator driven
# by measured kernel profiles (Vidur, Llama-2-7B, TP 1, MIT licence). The 3-term form fits them with
# 2-4 % median error but is off by 15-25 % at B <= 8 (use `TabulatedCost` there). The profiles read
# weights at ~70 % of HBM bandwidth and KV at ~96 % at large batch, and carry no scheduler or
# sampling overhead, so their `a` is a lower bound. The presets below are roofline estimates, not
# fits: they assume a per-request b of ~20 us (4B, TP 2) and ~45 us (8B), weights at 80 % and KV
# at 70 % of bandwidth. Their numbers are kept as they are (the default scenario is derived from
# them); these figures stand beside them for scale. Compare c per KV byte: Llama-2-7B (MHA) stores
# 2 x 32 layers x 32 heads x 128 x 2 B = 512 KiB per token, so its c reads KV at ~1.9 TB/s (A100)
# and ~3.3 TB/s (H100); Qwen3-4B at TP 2 stores 72 KiB per token per GPU.
CROSS_CHECK: dict[str, dict[str, float]] = {
    "llama2-7b-a100-tp1 (Vidur fit)": {"a": 9.9e-3, "b": 38e-6, "c": 2.7e-7},
    "llama2-7b-h100-tp1 (Vidur fit)": {"a": 6.1e-3, "b": 15e-6, "c": 1.6e-7},
}
_CROSS_CHECK_TEXT = (
    "; cross-check, Vidur-fitted Llama-2-7B TP1 decode (measured kernel profiles): "
    "A100 a 9.9 ms, b 38 us, c 2.7e-7 s/token; H100 a 6.1 ms, b 15 us, c 1.6e-7 s/token"
)


# SGLang 0.5.23's scheduling defaults (sglang/srt/environ.py, server_args: schedule_conservativeness
# 1.0): the presets run them (see PRESETS); a bare EngineSpec keeps the simpler rules, and each
# is a `[cluster]` key (`replace(spec, **SGLANG_RULES)` in Python). `family`: SGLang's own rules
# (`families.SGLangFamily`: retracted requests appended, aborts one decode pass late).
SGLANG_RULES: dict = {
    "new_token_ratio": 0.7,  # SGLANG_INIT_NEW_TOKEN_RATIO x schedule_conservativeness
    "new_token_ratio_decay_steps": 600,  # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
    "min_new_token_ratio_factor": 0.14,  # SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
    "retract_decode_steps": 20,  # SGLANG_RETRACT_DECODE_STEPS
    "clip_max_new_tokens": 4096,  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
    # sglang/srt/arg_groups/memory_hook.py:139 and :153 (80-160 GB GPUs: H100, H200) set 8192 when
    # unset (2048-4096 below, 16384 on B200/MI300); enable_mixed_chunk is False
    # (arg_groups/fields/schedule.py:208), so a chunked prefill's passes run back to back
    "chunked_prefill_size": 8192,
    "family": SGLangFamily(),
}


def _qwen3_4b_h100_tp2() -> EngineSpec:
    # Qwen3-4B: 36 layers, hidden 2560, 8 KV heads x 128, ~4.0e9 params (bf16: 8.0 GB).
    # H100 SXM: 3.35 TB/s HBM, 989 TFLOP/s bf16 dense. TP=2: each GPU holds half of it all.
    hbm, flops = 3.35e12, 989e12
    weights_per_gpu = 8.0e9 / 2
    a = weights_per_gpu / (0.8 * hbm) + 3.0e-3  # weight read + launch/all-reduce/sampling overhead
    b = (2 * 4.0e9 / 2) / (0.5 * flops) + 1.2e-5  # matmul FLOPs per token + per-request overhead
    kv_bytes = 2 * 36 * (8 // 2) * 128 * 2  # K and V, 36 layers, 4 KV heads per GPU, bf16
    c = kv_bytes / (0.7 * hbm)  # attention reads the whole KV once per iteration
    p1 = (2 * 4.0e9 / 2) / (0.6 * flops)
    p2 = (2 * 2 * 36 * 4096 / 2) / (0.5 * flops) / 2  # causal attention, per token pair
    kv_capacity = int((80e9 * 0.85 - weights_per_gpu - 6e9) / kv_bytes)
    return EngineSpec(
        cost=CostModel(a=a, b=b, c=c, p0=0.01, p1=p1, p2=p2),
        kv_capacity=kv_capacity,
        max_running=256,
        new_token_ratio=0.1,
        tp=2,
        label="qwen3-4b-h100-tp2",
        kv_bytes_per_token=kv_bytes,
        source=(
            "roofline estimate, not a measurement: Qwen3-4B (bf16) on 2x H100 SXM with TP=2; "
            "decode reads weights at 80% and KV at 70% of 3.35 TB/s, matmuls at 50% of "
            "989 TFLOP/s, "
            "3 ms fixed overhead per iteration; KV pool 85% of 80 GB minus weights and 6 GB; "
            "gives a 4.5 ms, b 20 us, c 3.1e-8 s/token" + _CROSS_CHECK_TEXT
        ),
    )


def _qwen3_8b_h100_tp1() -> EngineSpec:
    hbm, flops = 3.35e12, 989e12
    weights = 16.4e9
    kv_bytes = 2 * 36 * 8 * 128 * 2
    return EngineSpec(
        cost=CostModel(
            a=weights / (0.8 * hbm) + 2.5e-3,
            b=(2 * 8.2e9) / (0.5 * flops) + 1.2e-5,
            c=kv_bytes / (0.7 * hbm),
            p0=0.01,
            p1=(2 * 8.2e9) / (0.6 * flops),
            p2=(2 * 2 * 36 * 4096) / (0.5 * flops) / 2,
        ),
        kv_capacity=int((80e9 * 0.85 - weights - 6e9) / kv_bytes),
        max_running=256,
        new_token_ratio=0.1,
        tp=1,
        label="qwen3-8b-h100-tp1",
        kv_bytes_per_token=kv_bytes,
        source=(
            "roofline estimate, not a measurement: Qwen3-8B (bf16) on one H100 SXM, same rules; "
            "gives a 8.6 ms, b 45 us, c 6.3e-8 s/token" + _CROSS_CHECK_TEXT
        ),
    )


# The presets run SGLang's rules (a bare EngineSpec keeps the simple ones: constant ratio 0.1, no
# clip, retractions at the head, aborts landing at once, no chunking), so scenarios do by default.
PRESETS: dict[str, EngineSpec] = {
    "qwen3-4b-h100-tp2": replace(_qwen3_4b_h100_tp2(), **SGLANG_RULES),
    "qwen3-8b-h100-tp1": replace(_qwen3_8b_h100_tp1(), **SGLANG_RULES),
}

DEFAULT_PRESET = "qwen3-4b-h100-tp2"


# ---- the APRIL paper's setups (MI300X and H100 twins): aprilsim/engine/paper_presets.py --------
from aprilsim.engine.paper_presets import paper_presets as _paper_presets  # noqa: E402
from aprilsim.engine.paper_presets import sglang_overrides as _overrides  # noqa: E402

# ---- the Seer paper's setups (H800; MoE costs tabulated): aprilsim/engine/seer_presets.py ----
from aprilsim.engine.seer_presets import seer_presets as _seer_presets  # noqa: E402


def _preset_cost(c: dict[str, Any]) -> CostModel | TabulatedCost:
    if "table_b" in c:
        return TabulatedCost(tuple(c["table_b"]), tuple(c["table_f"]), tuple(c["table_g"]),
                             c["p0"], c["p1"], c.get("p2", 0.0))
    return CostModel(**c)


for _name, _fields in {**_paper_presets(), **_seer_presets()}.items():
    _spec = EngineSpec(**{**_fields, "cost": _preset_cost(_fields["cost"])})
    PRESETS.setdefault(_name, replace(_spec, **{**SGLANG_RULES, **_overrides(_name)}))
