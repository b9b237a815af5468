"""SGLang-like admission rules, shared by every engine model.

These are policy (which request goes in), kept apart from the time arithmetic so the fast engine
and the per-iteration reference engine apply literally the same rules.

KV accounting (both engines): a request in a prefill batch holds its input (prompt + tokens it
carries) in the KV cache; the prefill forward pass emits its next output token, whose KV entry is
written by the following decode iteration. So a running request holds `input_len + gen - 1`
tokens, and each decode iteration needs one new slot per running request.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Container

from aprilsim.engine.cost import EngineSpec
from aprilsim.engine.request import Request

_NUMBERS = ("kv_capacity", "max_running", "max_prefill_tokens", "clip_max_new_tokens",
            "sglang_ratio", "new_token_ratio", "new_token_ratio_decay", "min_new_token_ratio",
            "retract_decode_steps")  # what `AdmissionRules` copies (mypyc drops `__slots__`)


class AdmissionRules:
    """The numbers the rules below read from an `EngineSpec`, copied once into plain slots.

    Several are properties of the spec (a Python call per read); the fast engine asks the rules
    a few times per event, so it passes this instead (the reference engine passes its spec: both
    run the same functions on the same values)."""

    __slots__ = _NUMBERS
    kv_capacity: int
    max_running: int
    max_prefill_tokens: int
    clip_max_new_tokens: int
    sglang_ratio: bool
    new_token_ratio: float
    new_token_ratio_decay: float
    min_new_token_ratio: float
    retract_decode_steps: int

    def __init__(self, spec: EngineSpec) -> None:
        for name in _NUMBERS:
            setattr(self, name, getattr(spec, name))


Rules = EngineSpec | AdmissionRules  # what every rule below reads its numbers from


def ratio_at(spec: Rules, base: float, steps: int) -> float:
    """The new-token ratio `steps` decode steps after it was set to `base` (at a reset: the
    initial ratio; after a retraction: SGLang's estimate). SGLang subtracts the decay once per
    decode step and floors at the minimum; both engines use this closed form instead, so they
    compute the same float. Constant when the schedule is off."""
    if steps <= 0 or not spec.sglang_ratio:
        return base
    r = base - spec.new_token_ratio_decay * steps
    lo = spec.min_new_token_ratio
    return r if r > lo else lo


def ratio_after_retraction(spec: Rules, gen_sum: int, max_new_sum: int, n: int) -> float:
    """SGLang's `estimate_new_token_ratio_after_retract`, over the requests still running: what
    they have generated plus `retract_decode_steps` each, over their max_new_tokens (+1)."""
    return min(1.0, (gen_sum + spec.retract_decode_steps * n) / (max_new_sum + 1))


def clipped(spec: Rules, remaining: int) -> int:
    """A request's remaining max_new_tokens as the admission estimate counts it
    (SGLang's CLIP_MAX_NEW_TOKENS; no clip at 0)."""
    c = spec.clip_max_new_tokens
    return remaining if c == 0 or remaining < c else c


def enqueue(waiting: deque[Request], reqs: list[Request]) -> None:
    """Queue `reqs` behind every waiting request of equal or higher priority (SGLang's priority
    scheduling: higher priority first, arrival order among equals). Without priorities (all 0,
    the default) this is a plain append: FCFS."""
    if not reqs:
        return
    p = reqs[0].priority
    if (not waiting or waiting[-1].priority >= p) and all(r.priority == p for r in reqs):
        waiting.extend(reqs)
        return
    for r in reqs:
        _insert(waiting, r, head=False)


def requeue(waiting: deque[Request], victims: list[Request], head: bool) -> None:
    """Put retracted requests back: at the head of the queue (in reverse eviction order, as
    SGLang's `extendleft`) or at its tail; with priorities, at the head or tail of their own
    priority class, so a retraction never moves work ahead of higher-priority requests."""
    # the queue is ordered by priority: its head and tail bound every priority in it
    if not any(r.priority for r in victims) and (
            not waiting or not waiting[0].priority and not waiting[-1].priority):
        if head:
            waiting.extendleft(victims)
        else:
            waiting.extend(victims)
        return
    for r in victims:
        _insert(waiting, r, head)


def _insert(waiting: deque[Request], r: Request, head: bool) -> None:
    """Insert `r` at the head (before its first equal) or the tail (after its last equal) of its
    priority class in a queue ordered by priority, highest first."""
    p = r.priority
    for i, q in enumerate(waiting):
        if q.priority < p or (head and q.priority == p):
            waiting.insert(i, r)
            return
    waiting.append(r)


def can_admit_head(
    spec: Rules,
    waiting: deque[Request],
    n_running: int,
    kv: int,
    reserve: int,
    ratio: float,
    batch_reserve: int = 0,
    resident: Container[int] = (),
) -> bool:
    """Would the head of the waiting queue be admitted now? (FCFS: the head blocks the rest.)

    `n_running` counts the running requests and those already chosen for this prefill batch;
    `kv` includes them. `reserve` is the running requests' remaining max_new (clipped), and
    `batch_reserve` that of the requests already chosen for this batch. Two conditions:

    * the decode iteration after the prefill fits: the input now, plus one slot for every running
      request (this one included). So a prefill never forces a retraction at the next boundary,
      whatever the ratio (at 0 nothing else would prevent that wasted prefill). A request
      alone always passes, since input_len + max_new <= kv_capacity (`check_requests`);
    * SGLang's estimate of future growth must fit in what is free: `ratio` times the running
      requests' remaining max_new, plus the candidate's (and this batch's) remaining max_new in
      full with SGLang's schedule (`PrefillAdder`), or times `ratio` with the older rule.
    """
    if not waiting or n_running >= spec.max_running:
        return False
    r = waiting[0]
    need = r.input_len + r.gen
    if r.shared and r.prefix not in resident:  # it brings its shared prefix (`resident`: held)
        need += r.shared
    if kv + need + n_running + 1 > spec.kv_capacity:
        return False
    if n_running == 0:
        return True
    head, c = r.max_new - r.gen, spec.clip_max_new_tokens  # clipped(spec, ...), inline
    if c and head >= c:
        head = c
    if spec.sglang_ratio:
        return need + head <= spec.kv_capacity - kv - ratio * reserve - batch_reserve
    return need + ratio * head <= spec.kv_capacity - kv - ratio * (reserve + batch_reserve)


def select_prefill_batch(
    spec: Rules,
    waiting: deque[Request],
    n_running: int,
    kv: int,
    reserve: int,
    ratio: float,
    resident: Container[int] = (),
) -> tuple[list[Request], int, int, int, int, bool]:
    """Pop from `waiting` the requests one prefill batch admits (FCFS, KV reserve, token budget:
    at most `max_prefill_tokens` input tokens, at least one request).

    Returns the batch (empty when the head is not admitted: the fast engine's one admission
    test) with what it adds up to, counted in the same pass (its hot path): the input tokens it
    computes, the sum of their squares per request (attention work),
    its remaining max_new (unclipped), the migrated tokens it holds without computing them
    (`Request.migrated`: n computed tokens after m migrated ones cost (m + n)^2 - m^2), and
    whether the token budget ended it (the queue head was admissible but did not
    fit): with chunked prefill SGLang has no such budget across passes, so the next batch, which
    follows at once, continues this one's last pass (`cost.prefill_passes`). With prefix
    sharing, `resident` holds the prefixes already on the engine; a request whose prefix is
    neither there nor brought by an earlier request of the batch brings it (see `prefill_sizes`).
    """
    batch: list[Request] = []
    tokens = sq = added = held = moved = 0
    limit = spec.max_prefill_tokens
    seen: Container[int] = resident
    brought: set[int] | None = None  # the prefixes this batch brings (made at the first)
    while can_admit_head(spec, waiting, n_running + len(batch), kv + tokens + moved, reserve, ratio,
                         held, seen):
        r = waiting[0]
        need = r.input_len + r.gen
        s = r.shared
        brings = s and r.prefix not in seen  # a shared prefix not held yet: computed here
        if brings:
            need += s
        m = r.migrated  # held with the request, not computed (never with a shared prefix)
        if batch and tokens + need - m > limit:
            return batch, tokens, sq, added, moved, True
        waiting.popleft()
        batch.append(r)
        tokens += need - m
        if s and not brings:  # over a cached prefix: its tokens are attended to, not computed
            sq += (s + need) * (s + need) - s * s
        else:
            sq += need * need - m * m
        moved += m
        if brings:
            if brought is None:
                brought = set()
                seen = _Union(resident, brought)
            brought.add(r.prefix)
        added += r.max_new - r.gen
        held += clipped(spec, r.max_new - r.gen)
    return batch, tokens, sq, added, moved, False


class _Union:
    """Membership in either of two containers (the engine's prefixes, the batch's new ones)."""

    __slots__ = ("a", "b")

    def __init__(self, a: Container[int], b: Container[int]) -> None:
        self.a, self.b = a, b

    def __contains__(self, x: object) -> bool:
        return x in self.a or x in self.b


def prefill_pieces(batch: list[Request], resident: Container[int] = ()) -> tuple[list[int], list[int]]:
    """Per request of a prefill batch, in order: (tokens it computes, tokens of its prefix already
    held). The first request of a group whose prefix is not yet `resident` computes the prefix
    too; the later ones compute their own tokens only, over a cached prefix they attend to. A
    request with migrated KV computes the rest of its input over it."""
    lens: list[int] = []
    cached: list[int] = []
    have: set[int] = set()
    for r in batch:
        n = r.input_len + r.gen
        s = r.shared
        if s and r.prefix not in resident and r.prefix not in have:
            have.add(r.prefix)
            lens.append(n + s)
            cached.append(0)
        elif r.migrated:
            lens.append(n - r.migrated)
            cached.append(r.migrated)
        else:
            lens.append(n)
            cached.append(s)
    return lens, cached


def prefill_sizes(batch: list[Request], resident: Container[int] = ()) -> tuple[int, int]:
    """(tokens, attention work) of a prefill (`prefill_pieces`): attention work is sum(n_i^2)
    over the tokens each request computes, except that n tokens after a cached prefix of s
    tokens cost (s + n)^2 - s^2 (they attend to it): the p2 term of the cost."""
    lens, cached = prefill_pieces(batch, resident)
    return sum(lens), sum((s + n) * (s + n) - s * s for n, s in zip(lens, cached))
