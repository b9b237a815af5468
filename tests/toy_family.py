"""A toy engine family, written as a new family is: one module (its `Family` and its `Rules`) and
one `aprilsim.engine.families.register` call (`tests/test_family_rules.py` makes it).

Its rules differ from SGLang's in every question a batch-shaped family answers: admission
reserves a quarter of each running request's remaining max_new (a constant ratio, no clip, in
whole numbers: 4 * (kv + input) + remaining tokens <= 4 * capacity) and a prefill batch takes
at most `batch_cap` requests; preemption takes the running request with the *most* generated tokens
first and puts it back at the head of its priority class, admission never waits; an abort lands
after `abort_steps` more decode steps, the retained cache serves whole blocks of `cache_block`
tokens. While a batch of b requests decodes, 4 * kv + reserve grows by 3b a step, so a head
refused now stays refused until the batch changes: `stretch` says the whole span is fixed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Container
from dataclasses import dataclass
from typing import Any

from aprilsim.engine.families.protocol import Admitted, Rules
from aprilsim.engine.request import Request
from aprilsim.engine.waiting import requeue


@dataclass(frozen=True)
class ToyFamily:
    """The toy's parameters (what `[cluster]` keys may set: `abort_steps`, `prefix_cache_block`
    by the scenario's name for `cache_block`; it has no `retract_to`)."""

    abort_steps: int = 2
    cache_block: int = 4
    batch_cap: int = 2

    @property
    def name(self) -> str:
        return "toy"

    @property
    def live_prefix_cache(self) -> str:
        return "none"

    def rules(self, spec: Any) -> Rules:
        return ToyRules(spec, self)


class ToyRules(Rules):
    """One engine's toy rules (they keep no state)."""

    def __init__(self, spec: Any, family: ToyFamily) -> None:
        self.family = "toy"
        self.abort_steps = family.abort_steps
        self.cache_block = family.cache_block
        self.mixed_steps = False
        self.kv_capacity = spec.kv_capacity
        self.max_running = spec.max_running
        self.clip = 0  # the reserve counts every remaining token
        self.fewest_first = False  # the most generated first
        self.batch_cap = family.batch_cap
        self.budget = spec.max_prefill_tokens

    def admits_head(self, waiting: deque[Request], n_running: int, kv: int, reserve: int,
                    it: int, batch_reserve: int = 0, resident: Container[int] = ()) -> bool:
        if not waiting or n_running >= self.max_running:
            return False
        r = waiting[0]
        need = r.input_len + r.gen + (r.shared if r.shared and r.prefix not in resident else 0)
        if kv + need + n_running + 1 > self.kv_capacity:
            return False
        return n_running == 0 or (4 * (kv + need) + reserve + batch_reserve + r.max_new - r.gen
                                  <= 4 * self.kv_capacity)

    def select_batch(self, waiting: deque[Request], n_running: int, kv: int, reserve: int,
                     it: int, resident: Container[int] = ()) -> Admitted:
        batch: list[Request] = []
        tokens = sq = added = moved = 0
        seen = set(resident)
        while len(batch) < self.batch_cap and self.admits_head(
                waiting, n_running + len(batch), kv + tokens + moved, reserve, it, added, seen):
            r = waiting[0]
            need, s, m = r.input_len + r.gen, r.shared, r.migrated
            brings = bool(s) and r.prefix not in seen
            if brings:
                need += s
            if batch and tokens + need - m > self.budget:
                return batch, tokens, sq, added, moved, True
            waiting.popleft()
            batch.append(r)
            tokens += need - m
            sq += (s + need) ** 2 - s * s if s and not brings else need * need - m * m
            moved += m
            if brings:
                seen.add(r.prefix)
            added += r.max_new - r.gen
        return batch, tokens, sq, added, moved, False

    def stretch(self, lo: int, hi: int, n_running: int, kv: int, reserve: int, clipped: Any,
                it: int, head: Request, resident: Container[int]) -> int | None:
        return None  # 4 * kv + reserve only grows over a fixed batch: refused now, refused after

    def reserve_of(self, remaining: int) -> int:
        return remaining

    def requeue(self, waiting: deque[Request], victims: list[Request]) -> None:
        requeue(waiting, victims, head=True)

    def retracted(self, it: int, gen_sum: int, max_new_sum: int, n: int) -> bool:
        return False

    def reset(self, it: int) -> None:
        return None
