"""The SGLang rules the golden traces found (issue 34), each on a hand-built case in both engines:
the retraction order's tie-breaks and `PrefillAdder`'s input budget (a batch ended by the
`max_prefill_tokens` budget holds nothing, and `>=` ends it).
`test_engine_rules.py` holds the `batch_is_full` hold itself; tests/test_engine_traces_sglang.py
holds all of them to SGLang's own scheduler."""

from __future__ import annotations

import math

import pytest

from aprilsim.engine.cost import CostModel, EngineSpec
from aprilsim.engine.families import SGLangFamily
from aprilsim.engine.fast import FastEngine
from aprilsim.engine.reference import ReferenceEngine
from aprilsim.engine.request import Request

COST = CostModel(a=0.005, b=1e-4, c=2e-7, p0=0.01, p1=1e-5, p2=1e-8)
ENGINES = (FastEngine, ReferenceEngine)


def _sglang(kv: int, **kw: object) -> EngineSpec:
    """SGLang's schedule with a ratio of 0 (only the candidate's own max_new is reserved)."""
    return EngineSpec(COST, kv_capacity=kv, max_running=8, new_token_ratio=0.0,
                      new_token_ratio_decay_steps=600, family=SGLangFamily(), **kw)


def _first_victim(cls, second: list[Request]) -> int:
    """Request 0 runs alone; the two of `second` join it in one batch, tie on generated tokens,
    and the KV overflows about 830 steps later: the request id retracted first."""
    e = cls(_sglang(3_000))
    e.submit([Request(0, 100, 2_800, 2_800)], 0.0)
    e.advance()  # request 0's prefill
    e.submit(second, e.t)
    while e.retractions == 0:
        assert e.t_event < math.inf
        e.advance()
    assert e.retractions == 1 and len(e.waiting) == 1
    return e.waiting[0].rid


@pytest.mark.parametrize("cls", ENGINES)
def test_a_tie_on_outputs_retracts_the_longest_prompt(cls):
    """SGLang's `_get_decode_retraction_order`: (outputs, -prompt length), popped from the end:
    of two requests with as many outputs, the longer prompt goes (not the later id)."""
    assert _first_victim(cls, [Request(2, 300, 1_200, 1_200), Request(3, 100, 1_200, 1_200)]) == 2


@pytest.mark.parametrize("cls", ENGINES)
def test_a_full_tie_retracts_the_latest_to_join(cls):
    """Equal outputs and prompts: the stable sort keeps the running batch's order and the last
    to join goes, whatever the ids (request 3 joined before request 2)."""
    assert _first_victim(cls, [Request(3, 100, 1_200, 1_200), Request(2, 100, 1_200, 1_200)]) == 2


@pytest.mark.parametrize("cls", ENGINES)
def test_the_token_budget_ends_a_batch_without_holding(cls):
    """`max_prefill_tokens` 300: a batch whose input reached it ends (`AddReqResult.OTHER`,
    asked before the next request's KV) and holds nothing: the next request is admitted at the
    next boundary, beside the running one (a refusal would hold it until request 0 finished)."""
    e = cls(_sglang(100_000, max_prefill_tokens=300))
    e.submit([Request(0, 400, 50, 50), Request(1, 100, 50, 50)], 0.0)
    assert [r.rid for r in e.prefilling()] == [0]  # 400 input tokens: the budget is spent
    assert not e.advance()
    assert [r.rid for r in e.prefilling()] == [1]  # no hold: admitted at once


@pytest.mark.parametrize("cls", ENGINES)
def test_a_candidate_reaching_the_token_budget_waits(cls):
    """SGLang ends a batch when the candidate's input would reach what is left of the budget
    (`input_tokens >= rem_input_tokens`): 149 + 151 = 300 ends it, 149 + 150 does not."""
    e = cls(_sglang(100_000, max_prefill_tokens=300))
    e.submit([Request(0, 149, 50, 50), Request(1, 151, 50, 50), Request(2, 10, 5, 5)], 0.0)
    assert [r.rid for r in e.prefilling()] == [0]
    e = cls(_sglang(100_000, max_prefill_tokens=300))
    e.submit([Request(0, 149, 50, 50), Request(1, 150, 50, 50), Request(2, 10, 5, 5)], 0.0)
    assert [r.rid for r in e.prefilling()] == [0, 1]  # 299 < 300; request 2 would reach it
