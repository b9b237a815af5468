"""A found case the vLLM family's fast engine once got wrong: whether the queue head joins the
next step is decided AFTER the running requests take that step's KV blocks, and those
allocations evict cached blocks from the front of vLLM's free queue, which may be the head's
own prefix hit (here: a request preempted a step earlier, its blocks freed to the queue's back,
then mostly evicted). The fast engine's check for a pure-decode span looked the hit up before
the allocation, saw blocks the reference (`VllmSteps`, vLLM's order) no longer had, refused the
head and planned a span; the reference admitted it. `Pool.front_cut` makes the lookup see the
cache as the step's allocation leaves it.
"""

from __future__ import annotations

import pytest
from engine_agreement import assert_engines_agree
from vllm_cases import SMALL_COST, ProbedReference, VllmCase, VllmDriver, vllm_spec

from aprilsim.engine.families.vllm_pool import Pool
from aprilsim.engine.fast import FastEngine

# 32 sequences, a 64-token budget, blocks of one token, prefix caching on, full-sequence
# reservation off; the third completion triggers an interrupting update, the fourth a pause
REQS = [(0.0, 1, 120, 102, 102), (0.0, 6, 120, 1, 1), (0.0, 12, 21, 53, 53), (0.0, 14, 106, 44, 1),
        (0.0, 16, 120, 52, 52), (0.0, 23, 4, 102, 102), (0.0625, 3, 154, 97, 97),
        (0.25, 15, 58, 2, 2), (0.5, 5, 58, 57, 57), (0.5, 25, 58, 28, 28), (0.75, 9, 106, 1, 1),
        (0.75, 21, 120, 1, 1), (0.75, 22, 1, 1, 1), (1.0, 0, 58, 1, 1), (1.0, 2, 1, 1, 1),
        (1.0, 4, 106, 1, 1), (1.0, 7, 1, 1, 1), (1.0, 8, 4, 1, 1), (1.0, 10, 58, 1, 1),
        (1.0, 11, 120, 1, 1), (1.0, 13, 4, 1, 1), (1.0, 17, 1, 15, 15), (1.0, 19, 106, 1, 1),
        (1.0, 20, 58, 1, 1), (1.0, 24, 106, 1, 1), (1.0, 26, 120, 1, 1), (1.0, 27, 1, 1, 1),
        (3.0, 18, 24, 18, 18)]
CASE = VllmCase(vllm_spec(SMALL_COST, 1_154, 32, max_num_batched_tokens=64, cache_block=1,
                          scheduler_reserve_full_isl=False),
                1, "round_robin", sorted(REQS), [],
                [(4, 0.125, "pause", 1.0), (3, 0.0, "update", 0.125)], True,
                prompt_of={r: r % 5 for r in range(28)}, carried_of={3: 150, 12: 20, 18: 20})


def _agree() -> None:
    fd, rd = VllmDriver(FastEngine, CASE), VllmDriver(ProbedReference, CASE)
    assert_engines_agree(fd, rd, CASE.spec.kv_capacity)
    assert sum(e.retractions for e in fd.engines) > 0


def test_the_head_is_looked_up_as_the_steps_allocation_leaves_the_cache():
    _agree()


def test_the_case_has_teeth(monkeypatch):
    """Without the cut (the hit looked up before the step's allocation) the engines disagree."""
    monkeypatch.setattr(Pool, "front_cut", lambda self, k: {})
    with pytest.raises(AssertionError):
        _agree()
