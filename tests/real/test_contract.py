"""Contract tests: our payloads and the responses we rely on, against SGLang's own schema.

This checks the *wire format*, not engine behaviour: every /generate and /abort_request body the
adapter builds must decode with SGLang 0.5.23's request types (``sglang/api/v1/api_types.py``,
vendored in ``sglang_schema/`` and loaded with msgspec only; the ``sglang`` package is never
imported), and every response shape the tests feed the adapter (the bundled server's stream
chunks, aborts, errors, /server_info, /model_info) must decode with its response types.
Whether an engine *does* the right thing is for the end-to-end tests.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from conftest import run
from hypothesis import given, settings
from hypothesis import strategies as st

from real.clients.sglang_wire import ABORT_ALL_PAYLOAD, RidFactory, abort_payload, generate_payload
from real.protocol import GenerateRequest, SamplingParams

requests = st.builds(
    GenerateRequest,
    prompt_ids=st.lists(st.integers(0, 150_000), min_size=1, max_size=50).map(tuple),
    max_new_tokens=st.integers(0, 32_768),
    sampling=st.builds(
        SamplingParams,
        temperature=st.floats(0, 2),
        top_p=st.floats(0.01, 1),
        top_k=st.integers(-1, 100),
        stop_token_ids=st.lists(st.integers(0, 150_000), max_size=3).map(tuple),
        seed=st.none() | st.integers(0, 2**31),
    ),
    replay_len=st.none() | st.integers(0, 32_768),
)


@settings(max_examples=200, deadline=None)
@given(req=requests, stream=st.booleans())
def test_generate_payload_matches_sglang_request_schema(sglang_schema, req, stream):
    rid = RidFactory()()
    payload = generate_payload(req, rid, stream=stream)
    decoded = sglang_schema.GenerateRequest.from_json_value(json.loads(json.dumps(payload)))
    sp = decoded.sampling_params
    assert isinstance(sp, sglang_schema.SamplingParams)  # one request, not a batch
    assert decoded.input_ids == list(req.prompt_ids) and decoded.rid == rid
    assert decoded.stream is stream
    assert sp.max_new_tokens == req.tokens_to_generate
    assert sp.temperature == req.sampling.temperature  # sent explicitly, not left to default
    assert "temperature" in payload["sampling_params"]
    assert sp.ignore_eos is req.replay


def test_schema_is_strict_enough_to_catch_mistakes(sglang_schema):
    """Sanity: the schema rejects what a wrong adapter would send."""
    bad_key = {"input_ids": [1], "sampling_params": {"max_tokens": 5}}
    bad_type = {"input_ids": [1], "sampling_params": {"max_new_tokens": "5"}}
    for body in (bad_key, bad_type):
        with pytest.raises(sglang_schema.JsonContractError):
            sglang_schema.GenerateRequest.from_json_value(body)


def test_abort_payloads_match_schema(sglang_schema):
    a = sglang_schema.AbortRequest.from_json_value(ABORT_ALL_PAYLOAD)
    assert a.abort_all is True and a.rid == ""
    b = sglang_schema.AbortRequest.from_json_value(abort_payload("aprilsim-x-000000000001"))
    assert b.abort_all is False and b.rid == "aprilsim-x-000000000001"


async def _collect_stream(url: str, body: dict, abort_after: int | None = None) -> list[dict]:
    """Raw ``data:`` objects of one /generate stream (optionally abort_all after n chunks)."""
    out: list[dict] = []
    async with aiohttp.ClientSession() as s, s.post(url + "/generate", json=body) as r:
        assert r.status == 200
        async for line in r.content:
            line = line.strip()
            if not line:
                continue
            assert line.startswith(b"data: ")
            if line == b"data: [DONE]":
                return out
            out.append(json.loads(line[6:]))
            if abort_after is not None and len(out) == abort_after:
                async with s.post(url + "/abort_request", json=ABORT_ALL_PAYLOAD) as a:
                    assert a.status == 200
    raise AssertionError("stream ended without data: [DONE]")


def _check_generate_response(schema, obj: dict):
    decoded = schema.GenerateResponse.from_json_value(obj)
    assert decoded.meta_info is not None and decoded.output_ids == obj["output_ids"]
    return decoded


def test_bundled_server_responses_match_sglang_response_schema(sglang_schema, servers,
                                                               incremental_server):
    gen = {"input_ids": [20, 21, 22], "sampling_params": {"max_new_tokens": 6, "temperature": 0.0,
                                                          "ignore_eos": True}, "stream": True}

    async def main():
        cum = await _collect_stream(servers[0].url, {**gen, "rid": "c-1"})
        inc = await _collect_stream(incremental_server.url, {**gen, "rid": "i-1"})
        aborted = await _collect_stream(
            servers[0].url, {**gen, "rid": "a-1", "sampling_params": {
                "max_new_tokens": 1000, "temperature": 0.0, "ignore_eos": True}}, abort_after=3)
        # A queued request: fill the 8 slots, then abort everything.
        long = {"max_new_tokens": 1000, "ignore_eos": True, "temperature": 1.0}
        busy = [asyncio.create_task(_collect_stream(servers[1].url, {
            "input_ids": [30 + i], "sampling_params": long, "stream": True, "rid": f"b-{i}"}))
            for i in range(9)]
        await asyncio.sleep(0.5)
        async with aiohttp.ClientSession() as s:
            async with s.post(servers[1].url + "/abort_request", json=ABORT_ALL_PAYLOAD) as a:
                assert a.status == 200
            async with s.post(servers[0].url + "/generate", json={**gen, "stream": False}) as r:
                once = await r.json()
            async with s.get(servers[0].url + "/server_info") as r:
                info = await r.json()
            async with s.get(servers[0].url + "/model_info") as r:
                model = await r.json()
            async with s.post(servers[0].url + "/generate", json={
                    "input_ids": [1], "sampling_params": {"max_tokens": 3}}) as r:
                err_status, err_body = r.status, await r.json()
        return (cum, inc, aborted, await asyncio.gather(*busy), once, info, model, err_status,
                err_body)

    cum, inc, aborted, busy, once, info, model, err_status, err_body = run(main())
    for chunk in cum + inc + aborted + [c for stream in busy for c in stream] + [once]:
        _check_generate_response(sglang_schema, chunk)
    final = sglang_schema.GenerateResponse.from_json_value(cum[-1]).meta_info
    assert isinstance(final.finish_reason, sglang_schema.FinishLength)
    assert final.completion_tokens == 6 and len(cum[-1]["output_ids"]) == 6
    assert sum(len(c["output_ids"]) for c in inc) == 6  # incremental deltas add up
    abort_final = sglang_schema.GenerateResponse.from_json_value(aborted[-1]).meta_info
    assert isinstance(abort_final.finish_reason, sglang_schema.FinishAbort)
    queued = [s[-1] for s in busy if s[-1]["meta_info"]["completion_tokens"] == 0]
    assert queued, "expected one request aborted in the waiting queue"
    q = sglang_schema.GenerateResponse.from_json_value(queued[0]).meta_info
    assert q.finish_reason.message == "Abort in waiting queue"
    assert "prompt_tokens" not in queued[0]["meta_info"]
    si = sglang_schema.GetServerInfoResponse.from_json_value(info)
    assert si.max_total_num_tokens == 8 * 2048 and si.incremental_streaming_output is False
    mi = sglang_schema.GetModelInfoResponse.from_json_value(model)
    assert mi.is_generation and mi.weight_version == "default"
    assert err_status == 400
    sglang_schema.ErrorBody.from_json_value(err_body)


def test_error_chunk_shape_matches_schema(sglang_schema):
    """The error chunk our fault proxy injects (and SGLang sends) is a GenerateStreamError."""
    chunk = {"error": {"message": "injected failure", "code": 500}}
    decoded = sglang_schema.GenerateStreamError.from_json_value(chunk)
    assert decoded.error.code == 500


def test_logprob_responses_and_new_endpoints_match_schema(sglang_schema, servers):
    """The RL-facing shapes: log-prob triples, top log-probs, model cards, server info."""
    from http_util import call, stream

    body = {"text": "Hello there", "return_logprob": True, "top_logprobs_num": 2,
            "logprob_start_len": 0, "return_text_in_logprobs": True,
            "sampling_params": {"max_new_tokens": 3, "ignore_eos": True, "stop": ["zz"]}}
    req = sglang_schema.GenerateRequest.from_json_value(body)  # a body SGLang accepts too
    assert req.return_logprob is True
    status, once = call(servers[0].url, "/generate", body)
    assert status == 200
    chunks = stream(servers[0].url, "/generate", {**body, "stream": True})
    for obj in [once, *chunks]:
        meta = _check_generate_response(sglang_schema, obj).meta_info
        assert [e.token_id for e in meta.output_token_logprobs] == obj["output_ids"]
        assert all(e.logprob is not None and e.text is not None
                   for e in meta.output_token_logprobs)
    meta = sglang_schema.GenerateResponse.from_json_value(once).meta_info
    assert meta.input_token_logprobs[0].logprob is None
    assert len(meta.output_top_logprobs) == 3
    card = call(servers[0].url, "/v1/models")[1]["data"][0]
    assert sglang_schema.ModelCard.from_json_value(card).max_model_len == 2048
    info = sglang_schema.GetServerInfoResponse.from_json_value(
        call(servers[0].url, "/server_info")[1])
    assert info.max_total_num_tokens == 8 * 2048
