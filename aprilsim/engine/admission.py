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


def can_admit_head(
    spec: EngineSpec, waiting: deque[Request], n_running: int, kv: int, reserve: int
) -> bool:
    """Would the head of the waiting queue be admitted now? (FCFS: the head blocks the rest.)

    `n_running` counts the running requests and those already chosen for this prefill batch;
    `kv` and `reserve` include them. Two conditions, both needed:

    * the decode iteration after the prefill fits: the input now, plus one slot for every running
      request (this one included). So a prefill never forces a retraction at the next boundary,
      whatever `new_token_ratio` (at 0 nothing else would prevent that wasted prefill). A request
      alone always passes, since input_len + max_new <= kv_capacity (`check_requests`);
    * SGLang's estimate of future growth: `new_token_ratio` times the remaining max_new_tokens of
      every request, the running ones and this one, must fit in what is free.
    """
    if not waiting or n_running >= spec.max_running:
        return False
    r = waiting[0]
    need = r.input_len + r.gen
    if kv + need + n_running + 1 > spec.kv_capacity:
        return False
    if n_running == 0:
        return True
    ratio = spec.new_token_ratio
    return need + ratio * (r.max_new - r.gen) <= spec.kv_capacity - kv - ratio * reserve


def select_prefill_batch(
    spec: EngineSpec, waiting: deque[Request], n_running: int, kv: int, reserve: int
) -> tuple[list[Request], int, int, int]:
    """Pop from `waiting` the requests one prefill batch admits (FCFS, KV reserve, token budget:
    at most `max_prefill_tokens` input tokens, at least one request).

    Returns the batch with what it adds up to, counted in the same pass (the fast engine's hot
    path): its input tokens, the sum of their squares per request, and its remaining max_new.
    """
    batch: list[Request] = []
    tokens = sq = added = 0
    limit = spec.max_prefill_tokens
    while can_admit_head(spec, waiting, n_running + len(batch), kv + tokens, reserve + added):
        r = waiting[0]
        need = r.input_len + r.gen
        if batch and tokens + need > limit:
            break
        waiting.popleft()
        batch.append(r)
        tokens += need
        sq += need * need
        added += r.max_new - r.gen
    return batch, tokens, sq, added


def prefill_sizes(batch: list[Request]) -> tuple[int, int]:
    """(sum of n_i, sum of n_i^2) over the batch's input lengths: what a prefill costs."""
    tokens = sq = 0
    for r in batch:
        n = r.input_len + r.gen
        tokens += n
        sq += n * n
    return tokens, sq
