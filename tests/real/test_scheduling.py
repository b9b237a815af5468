"""SGLang-like scheduling in the bundled engine: admission reserve, retraction, limits, timings.

Engine-level (no HTTP) for the rules, HTTP for the error and the iteration log.
"""

from __future__ import annotations

import json

import pytest
from conftest import start_server
from http_util import call

from real.torch_engine import BatchEngine, EngineConfig, EngineRequest, ModelConfig, TinyDecoder

CFG = ModelConfig(vocab_size=128, d_model=64, n_layers=2, n_heads=4, max_context=512)


@pytest.fixture(scope="module")
def model() -> TinyDecoder:
    return TinyDecoder.random(CFG, seed=3)


def _reqs(n: int, max_new: int = 60, ignore_eos: bool = False) -> list[EngineRequest]:
    return [EngineRequest(f"r{i}", [(5 * i + j) % 100 + 10 for j in range(10)], max_new,
                          ignore_eos=ignore_eos, temperature=0.0) for i in range(n)]


def _drain(eng: BatchEngine):
    done, steps = {}, []
    while eng.has_work:
        out = eng.step()
        steps.append(out)
        for f in out.finished:
            done[f.rid] = f
    return done, steps


def test_admission_reserves_new_token_ratio_of_remaining_tokens(model):
    def engine(budget: int, **kw) -> BatchEngine:
        return BatchEngine(model, EngineConfig(max_running_requests=4, kv_budget_tokens=budget,
                                               **kw))

    # A candidate needs input + its whole max_new_tokens (10 + 60): two fit in one batch of 200;
    # once they run, their reserve is only 0.7 x what they may still generate: a third fits.
    eng = engine(200)
    for r in _reqs(4):
        eng.add(r)
    eng.step()
    assert len(eng.running) == 2
    eng.step()
    assert len(eng.running) == 3 and eng.iterations[-1].phase == "prefill"
    eng.step()  # the fourth does not fit: a decode step, and the ratio decays
    assert len(eng.running) == 3 and eng.iterations[-1].phase == "decode"
    assert eng.new_token_ratio == pytest.approx(0.7 - (0.7 - 0.7 * 0.14) / 600)
    # ignore_eos requests cannot end early: SGLang's fixed-length check keeps it at two
    eng2 = engine(200)
    for r in _reqs(4, ignore_eos=True):
        eng2.add(r)
    eng2.step()
    eng2.step()
    assert len(eng2.running) == 2
    # the estimate of a request's remaining tokens is clipped at clip_max_new_tokens
    eng3 = engine(120, clip_max_new_tokens=10)
    for r in _reqs(4):
        eng3.add(r)
    eng3.step()
    assert len(eng3.running) == 4  # 4 x (10 + 10 + 1) fit; unclipped, one would
    eng4 = engine(120)
    for r in _reqs(4):
        eng4.add(r)
    eng4.step()
    assert len(eng4.running) == 1


def test_retraction_on_kv_exhaustion_requeues_and_outputs_are_unchanged(model):
    roomy = BatchEngine(model, EngineConfig(max_running_requests=4))
    for r in _reqs(4):
        roomy.add(r)
    ref, _ = _drain(roomy)
    tight = BatchEngine(model, EngineConfig(max_running_requests=4, kv_budget_tokens=200))
    for r in _reqs(4):
        tight.add(r)
    done, steps = _drain(tight)
    assert tight.retracted_total >= 1
    for rid, f in ref.items():  # re-prefill of prompt + partial output: same greedy tokens
        assert done[rid].output_ids == f.output_ids and done[rid].reason == f.reason
    assert max(r.kv_tokens for r in tight.iterations) <= 200  # the budget is never exceeded
    assert len(tight.pool.free) == 4 and tight.used_tokens == 0
    retract_steps = [s for s in steps if s.retracted]
    assert retract_steps
    recs = [r for r in tight.iterations if r.retracted]
    assert recs and all(r.phase == "decode" for r in recs)
    # after a retraction the ratio is re-estimated from the batch (SGLang's formula)
    assert any(r.new_token_ratio > 0.7 or r.new_token_ratio < 0.69 for r in recs)


def test_retracts_the_request_with_fewest_output_tokens(model):
    eng = BatchEngine(model, EngineConfig(max_running_requests=4, kv_budget_tokens=110,
                                          init_new_token_ratio=0.01))
    first, second = _reqs(2, max_new=80)
    eng.add(first)
    for _ in range(6):  # first decodes alone for a while
        eng.step()
    eng.add(second)
    retracted: list[str] = []
    while eng.has_work and not retracted:
        retracted = eng.step().retracted
    assert retracted == ["r1"]  # fewer output tokens than r0
    assert [r.rid for r in eng.waiting] == ["r1"] and eng.waiting[0].output_ids
    assert eng.waiting[0].retractions == 1


def test_retracted_requests_go_to_the_tail_of_the_queue(model):
    """SGLang 0.5.23 appends retracted requests to waiting_queue (scheduler.py:
    ``for req in retracted_reqs: self._add_request_to_queue(req, is_retracted=True)``), behind
    requests already waiting; with FCFS the head then blocks them."""
    eng = BatchEngine(model, EngineConfig(max_running_requests=3, kv_budget_tokens=120,
                                          init_new_token_ratio=0.01))
    r0, r1, r2, r3 = _reqs(4, max_new=60)
    eng.add(r0)
    for _ in range(5):
        eng.step()
    eng.add(r1)
    for _ in range(5):
        eng.step()
    eng.add(r2)
    eng.add(r3)  # no slot left: r3 waits
    retracted: list[str] = []
    while eng.has_work and not retracted:
        retracted = eng.step().retracted
    assert [r.rid for r in eng.running] == ["r0", "r1"] and retracted == ["r2"]
    assert [r.rid for r in eng.waiting] == ["r3", "r2"]  # at the tail, not ahead of r3
    done, _ = _drain(eng)
    assert sorted(done) == ["r0", "r1", "r2", "r3"]


def test_retract_all_appends_the_running_batch_in_order(model):
    """pause_generation "retract": SGLang appends running_batch.reqs, in order, to the queue."""
    eng = BatchEngine(model, EngineConfig(max_running_requests=2))
    for r in _reqs(3, max_new=20):
        eng.add(r)
    eng.step()
    eng.step()
    assert [r.rid for r in eng.running] == ["r0", "r1"]
    assert [r.rid for r in eng.waiting] == ["r2"]
    assert eng.retract_all() == 2
    assert [r.rid for r in eng.waiting] == ["r2", "r0", "r1"] and not eng.running
    assert len(eng.pool.free) == 2 and all(r.output_ids for r in list(eng.waiting)[1:])


def test_request_larger_than_kv_budget_gets_sglangs_error(model):
    eng = BatchEngine(model, EngineConfig(max_running_requests=2, kv_budget_tokens=64))
    # max_req_len = min(512 - 1, 64 - 1) = 63; prompts of 63 - 5 = 58 tokens or more are refused
    with pytest.raises(ValueError) as exc:
        eng.add(EngineRequest("big", [20] * 58, 4))
    assert str(exc.value) == ("Input length (58 tokens) exceeds the maximum allowed length (58 "
                              "tokens). Use a shorter input or enable --allow-auto-truncate.")
    ok = EngineRequest("fits", [20] * 57, 100)  # max_new_tokens clipped as SGLang clips it
    eng.add(ok)
    assert ok.max_new_tokens == 63 - 57 - 1


def test_http_errors_and_iteration_log(tmp_logs, tmp_path):
    log = tmp_path / "iterations.jsonl"
    srv = start_server(tmp_logs, "--kv-budget-tokens", "256", "--iteration-log", str(log))
    try:
        status, err = call(srv.url, "/generate", {"input_ids": [20] * 251,
                                                  "sampling_params": {"max_new_tokens": 1}})
        assert status == 400
        assert err["message"].startswith("Input length (251 tokens) exceeds the maximum allowed "
                                          "length (250 tokens)")
        status, err = call(srv.url, "/generate", {"input_ids": [20] * 10,
                                                  "sampling_params": {"max_new_tokens": 5000}})
        assert status == 400 and "maximum context length of 2048 tokens" in err["message"]
        status, r = call(srv.url, "/generate", {"input_ids": [20] * 10, "sampling_params": {
            "max_new_tokens": 6, "ignore_eos": True}})
        assert status == 200 and len(r["output_ids"]) == 6
        status, it = call(srv.url, "/iteration_log?since=0")
        recs = it["records"]
        assert [r["phase"] for r in recs] == ["prefill"] + ["decode"] * 5
        assert all(r["batch_size"] == 1 and r["duration_s"] > 0 and r["kv_budget"] == 256
                   for r in recs)
        assert recs[0]["prefill_tokens"] == 10 and recs[-1]["kv_tokens"] == 0
        assert [r["kv_tokens"] for r in recs[1:-1]] == [12, 13, 14, 15]
        assert call(srv.url, f"/iteration_log?since={it['last_seq']}")[1]["records"] == []
        lines = [json.loads(x) for x in log.read_text().splitlines()]
        assert [x["seq"] for x in lines] == [r["seq"] for r in recs]
    finally:
        srv.stop()
