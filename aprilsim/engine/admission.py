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

from aprilsim.engine.cost import EngineSpec
from aprilsim.engine.request import Request


def ratio_at(spec: EngineSpec, base: float, steps: int) -> float:
    """The new-token ratio `steps` decode steps after it was set to `base` (at a reset: the
    initial ratio; after a retraction: SGLang's estimate). SGLang subtracts the decay once per
    decode step and floors at the minimum; both engines use this closed form instead, so they
    compute the same float. Constant when the schedule is off."""
    if steps <= 0 or not spec.sglang_ratio:
        return base
    r = base - spec.new_token_ratio_decay * steps
    lo = spec.min_new_token_ratio
    return r if r > lo else lo


def ratio_after_retraction(spec: EngineSpec, gen_sum: int, max_new_sum: int, n: int) -> float:
    """SGLang's `estimate_new_token_ratio_after_retract`, over the requests still running: what
    they have generated plus `retract_decode_steps` each, over their max_new_tokens (+1)."""
    return min(1.0, (gen_sum + spec.retract_decode_steps * n) / (max_new_sum + 1))


def clipped(spec: EngineSpec, remaining: int) -> int:
    """A request's remaining max_new_tokens as the admission estimate counts it
    (SGLang's CLIP_MAX_NEW_TOKENS; no clip at 0)."""
    c = spec.clip_max_new_tokens
    return remaining if c == 0 or remaining < c else c


def can_admit_head(
    spec: EngineSpec,
    waiting: deque[Request],
    n_running: int,
    kv: int,
    reserve: int,
    ratio: float,
    batch_reserve: int = 0,
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
    if kv + need + n_running + 1 > spec.kv_capacity:
        return False
    if n_running == 0:
        return True
    head = clipped(spec, r.max_new - r.gen)
    if spec.sglang_ratio:
        return need + head <= spec.kv_capacity - kv - ratio * reserve - batch_reserve
    return need + ratio * head <= spec.kv_capacity - kv - ratio * (reserve + batch_reserve)


def select_prefill_batch(
    spec: EngineSpec,
    waiting: deque[Request],
    n_running: int,
    kv: int,
    reserve: int,
    ratio: float,
) -> tuple[list[Request], int, int, int, bool]:
    """Pop from `waiting` the requests one prefill batch admits (FCFS, KV reserve, token budget:
    at most `max_prefill_tokens` input tokens, at least one request).

    Returns the batch with what it adds up to, counted in the same pass (the fast engine's hot
    path): its input tokens, the sum of their squares per request, its remaining max_new
    (unclipped), and whether the token budget ended it (the queue head was admissible but did not
    fit): with chunked prefill SGLang has no such budget across passes, so the next batch, which
    follows at once, continues this one's last pass (`cost.prefill_passes`).
    """
    batch: list[Request] = []
    tokens = sq = added = held = 0
    limit = spec.max_prefill_tokens
    while can_admit_head(spec, waiting, n_running + len(batch), kv + tokens, reserve, ratio, held):
        r = waiting[0]
        need = r.input_len + r.gen
        if batch and tokens + need > limit:
            return batch, tokens, sq, added, True
        waiting.popleft()
        batch.append(r)
        tokens += need
        sq += need * need
        added += r.max_new - r.gen
        held += clipped(spec, r.max_new - r.gen)
    return batch, tokens, sq, added, False


def prefill_sizes(batch: list[Request]) -> tuple[int, int]:
    """(sum of n_i, sum of n_i^2) over the batch's input lengths: what a prefill costs."""
    tokens = sq = 0
    for r in batch:
        n = r.input_len + r.gen
        tokens += n
        sq += n * n
    return tokens, sq
