"""Contract tests: the vLLM adapter's payloads and parsers against vLLM's documented shapes.

The shapes are described in ``vllm_schema.py`` (derived from the vLLM 0.33.0 wheel's pydantic
models; vLLM itself is never imported). Every body :func:`completion_payload` builds must pass
:func:`vllm_schema.check_request`; every response shape the parsers accept here is schema-valid.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("msgspec")

import vllm_schema as S  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from aprilsim.types import FinishReason  # noqa: E402
from real.clients.vllm_wire import (  # noqa: E402
    StreamError,
    completion_payload,
    parse_metrics,
    parse_stream_chunk,
)
from real.protocol import GenerateRequest, SamplingParams  # noqa: E402

requests = st.builds(
    GenerateRequest,
    prompt_ids=st.lists(st.integers(0, 150_000), min_size=1, max_size=50).map(tuple),
    max_new_tokens=st.integers(1, 32_768),
    sampling=st.builds(
        SamplingParams,
        temperature=st.floats(0, 2),
        top_p=st.floats(0.01, 1),
        top_k=st.integers(-1, 100),
        stop_token_ids=st.lists(st.integers(0, 150_000), max_size=3).map(tuple),
        seed=st.none() | st.integers(0, 2**31),
    ),
    replay_len=st.none() | st.integers(1, 32_768),
)


@settings(max_examples=200, deadline=None)
@given(req=requests, ids_via=st.sampled_from(["token_ids", "logprobs"]),
       model=st.none() | st.just("m"))
def test_completion_payload_matches_vllm_request_schema(req, ids_via, model):
    body = completion_payload(req, model, "aprilsim-x-1", ids_via)
    decoded = S.check_request(json.loads(json.dumps(body)))
    n = req.tokens_to_generate
    assert decoded.prompt == list(req.prompt_ids) and decoded.max_tokens == n
    assert "temperature" in body and decoded.temperature == req.sampling.temperature
    assert decoded.stream is True and decoded.stream_options.include_usage is True
    assert decoded.ignore_eos is req.replay
    assert decoded.min_tokens == (n if req.replay else 0)
    assert decoded.stop_token_ids == (None if req.replay or not req.sampling.stop_token_ids
                                      else list(req.sampling.stop_token_ids))
    assert decoded.seed == req.sampling.seed and decoded.model == model
    if ids_via == "token_ids":
        assert decoded.return_token_ids is True and decoded.logprobs is None
    else:
        assert decoded.logprobs == 0 and decoded.return_tokens_as_token_ids is True
        assert decoded.return_token_ids is None


def test_exact_body_replay_and_free():
    replay = GenerateRequest((5, 6, 7), max_new_tokens=100, replay_len=40,
                             sampling=SamplingParams(temperature=0.7, seed=3))
    assert completion_payload(replay, "m", "rid-1") == {
        "model": "m", "prompt": [5, 6, 7], "max_tokens": 40, "temperature": 0.7, "top_p": 1.0,
        "top_k": -1, "seed": 3, "stream": True, "stream_options": {"include_usage": True},
        "request_id": "rid-1", "return_weight_versions": True, "ignore_eos": True, "min_tokens": 40,
        "return_token_ids": True}
    free = GenerateRequest((1,), max_new_tokens=8, sampling=SamplingParams(stop_token_ids=(2, 3)))
    assert completion_payload(free, None, "rid-2", "logprobs") == {
        "prompt": [1], "max_tokens": 8, "temperature": 1.0, "top_p": 1.0, "top_k": -1,
        "stream": True, "stream_options": {"include_usage": True}, "request_id": "rid-2",
        "return_weight_versions": True, "stop_token_ids": [2, 3], "logprobs": 0,
        "return_tokens_as_token_ids": True}
    with pytest.raises(ValueError):  # vLLM rejects max_tokens < 1: such a request is never sent
        completion_payload(GenerateRequest((1,), max_new_tokens=0), None, "r")


@pytest.mark.parametrize("body", [
    {"prompt": [1], "max_new_tokens": 5},  # SGLang's name: vLLM would silently ignore it
    {"prompt": "hello", "max_tokens": 5},  # text prompts are not what the adapter sends
    {"prompt": [1], "stream_options": {"include_usage": True}},  # stream_options need stream
    {"prompt": [1], "max_tokens": 4, "min_tokens": 5},
    {"prompt": [-1]},
    {"prompt": []},
])
def test_schema_is_strict_enough_to_catch_mistakes(body):
    with pytest.raises(S.ContractError):
        S.check_request(body)


def _chunk(**choice) -> dict:
    obj = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
           "choices": [{"index": 0, "text": "", **choice}]}
    S.check(obj, S.CompletionStreamResponse)
    return obj


def test_parse_chunks_token_ids_logprobs_usage():
    c = parse_stream_chunk(_chunk(text=" a b", token_ids=[4, 5], prompt_token_ids=[1, 2, 3]))
    assert c.new_ids == [4, 5] and c.prompt_ids == [1, 2, 3] and c.finish is None
    lp = {"text_offset": [0], "token_logprobs": [-0.1], "tokens": ["token_id:42"],
          "top_logprobs": [None]}
    c = parse_stream_chunk(_chunk(text=" x", logprobs=lp, token_ids=None, finish_reason="length"))
    assert c.new_ids == [42] and c.finish.reason is FinishReason.LENGTH
    c = parse_stream_chunk(_chunk(token_ids=[], finish_reason="stop", stop_reason=7,
                                  weight_versions=[{"version": "3", "start": 0, "end": 9}]))
    assert c.new_ids == [] and c.finish.reason is FinishReason.STOP and c.stop_reason == 7
    assert c.weight_version == "3"
    usage = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m", "choices": [],
             "usage": {"prompt_tokens": 3, "completion_tokens": 9, "total_tokens": 12}}
    S.check(usage, S.CompletionStreamResponse)
    c = parse_stream_chunk(usage)
    assert c.is_usage and c.prompt_tokens == 3 and c.completion_tokens == 9 and c.new_ids == []
    # Without ids the text alone is useless: the chunk says so (new_ids None).
    assert parse_stream_chunk(_chunk(text=" y", token_ids=None)).new_ids is None
    with pytest.raises(StreamError):  # logprob tokens as text, not ids
        parse_stream_chunk(_chunk(text=" y", logprobs={**lp, "tokens": [" y"]}))


@pytest.mark.parametrize("reason,ours,code", [
    ("stop", FinishReason.STOP, None), ("length", FinishReason.LENGTH, None),
    ("abort", FinishReason.ABORT, None), ("repetition", FinishReason.STOP, None),
    ("error", FinishReason.ABORT, 500)])
def test_finish_reasons(reason, ours, code):
    f = parse_stream_chunk(_chunk(token_ids=[], finish_reason=reason)).finish
    assert f.reason is ours and f.status_code == code


def test_error_chunk_raises_with_code():
    err = {"error": {"message": "Internal server error", "type": "InternalServerError",
                     "param": None, "code": 500}}
    S.check(err, S.ErrorResponse)
    with pytest.raises(StreamError) as e:
        parse_stream_chunk(err)
    assert e.value.code == 500


DP_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="100",x="a \\"q\\""} 1.0
vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="100",x="a \\"q\\""} 1.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 1.0
"""


def test_parse_metrics_sums_engines():
    S.check_metrics(DP_METRICS)
    m = parse_metrics(DP_METRICS)
    assert (m.running, m.waiting, m.engines) == (5, 1, 2)
    assert m.kv_capacity_tokens == 3200 and m.kv_used_tokens == 800 + 400
    assert m.kv_cache_usage == pytest.approx(0.375)
    assert m.as_loads()["num_running_reqs"] == 5
    assert parse_metrics("# nothing\nother_metric 1\n") is None
