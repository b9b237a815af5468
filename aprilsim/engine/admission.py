"""SGLang-like admission and retraction rules, shared by every engine model.

These are policy (which request goes in or out), kept apart from the time arithmetic so the fast
engine and the per-iteration reference engine apply literally the same rules.
"""

from __future__ import annotations

from collections import deque

from aprilsim.engine.cost import EngineSpec
from aprilsim.engine.request import Request


def can_admit_head(
    spec: EngineSpec, waiting: deque[Request], n_running: int, kv: int, reserve: int
) -> bool:
    """Would the head of the waiting queue be admitted now? (FCFS: the head blocks the rest.)"""
    if not waiting or n_running >= spec.max_running:
        return False
    r = waiting[0]
    need = r.input_len + r.gen
    if n_running == 0:
        return kv + need <= spec.kv_capacity
    avail = spec.kv_capacity - kv - spec.new_token_ratio * reserve
    return need + spec.new_token_ratio * (r.max_new - r.gen) <= avail


def select_prefill_batch(
    spec: EngineSpec, waiting: deque[Request], n_running: int, kv: int, reserve: int
) -> list[Request]:
    """Pop from `waiting` the requests one prefill batch admits (FCFS, KV reserve, token budget).

    A request needs its input (prompt + tokens carried) now, plus new_token_ratio times its
    remaining max_new_tokens reserved for later, as SGLang's scheduler estimates it.
    """
    batch: list[Request] = []
    tokens = 0
    while can_admit_head(spec, waiting, n_running + len(batch), kv, reserve):
        r = waiting[0]
        need = r.input_len + r.gen
        if batch and tokens + need > spec.max_prefill_tokens:
            break
        waiting.popleft()
        batch.append(r)
        tokens += need
        kv += need
        reserve += r.max_new - r.gen
    return batch
