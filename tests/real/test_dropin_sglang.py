"""The bundled server as a drop-in SGLang: what SGLang's clients send is served, what a hostile
client sends gets a 4xx (never a 5xx), and the server says the truth about itself.

Each test here failed on the server before issue 22: sglang-router's OpenAI calls (400 for
``continue_final_message`` / ``return_hidden_states``), unknown ``/generate`` fields (400), slime's
sampling params (400), 2,000 nested brackets (503), a lone surrogate (500), a bad gzip body (500),
half-open sockets (held forever), a NaN checkpoint (loaded), ``-Infinity`` in a response (invalid
JSON), ``enable_memory_saver`` (always true).
"""

from __future__ import annotations

import gzip
import json
import math
import socket
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator

import pytest
from conftest import ROOT, SERVER_ARGS, VOCAB, Proc, start_server
from http_util import call, internal, stream

from real.torch_engine.model import ModelConfig, TinyDecoder

# SGLang 0.5.23's OpenAI extension fields at their defaults (protocol.py: CompletionRequest and
# ChatCompletionRequest), the values sglang-router 0.3.2 fills in before forwarding.
SGLANG_COMMON_DEFAULTS = {
    "bootstrap_host": None, "bootstrap_port": None, "bootstrap_room": None,
    "routed_dp_rank": None, "disagg_prefill_dp_rank": None, "return_hidden_states": False,
    "return_routed_experts": False, "routed_experts_start_len": 0,
    "return_cached_tokens_details": False, "return_spec_tokens_details": False,
    "return_token_ids": False, "top_k": -1, "min_p": 0.0, "min_tokens": 0, "regex": None,
    "ebnf": None, "repetition_penalty": 1.0, "stop_token_ids": None, "stop_regex": None,
    "no_stop_trim": False, "ignore_eos": False, "skip_special_tokens": True, "lora_path": None,
    "session_id": None, "session_params": None, "response_format": None, "custom_params": None,
    "custom_logit_processor": None, "watermark": None, "images_config": None,
    "mm_processor_kwargs": None, "data_parallel_rank": None, "rid": None, "extra_key": None,
    "cache_salt": None, "priority": None, "frequency_penalty": 0.0, "presence_penalty": 0.0,
    "logit_bias": None, "seed": None, "stop": None, "stream": False, "stream_options": None,
    "user": None, "n": 1,
}
SGLANG_COMPLETION_DEFAULTS = {**SGLANG_COMMON_DEFAULTS, "best_of": None, "echo": False,
                              "logprobs": None, "suffix": None, "temperature": 1.0, "top_p": 1.0,
                              "json_schema": None, "custom_labels": None}
SGLANG_CHAT_DEFAULTS = {
    **SGLANG_COMMON_DEFAULTS, "logprobs": False, "top_logprobs": None,
    "max_completion_tokens": None, "temperature": None, "top_p": None, "tools": None,
    "tool_choice": "none", "parallel_tool_calls": True, "return_prompt_token_ids": False,
    "return_meta_info": False, "return_input_ids_in_sglext": False,
    "return_output_ids_in_sglext": False, "return_sampling_mask": False,
    "sampling_logprobs_mode": None, "return_flat_raw_output_top_logprobs": False,
    "return_flat_raw_top_logprobs_b64": True, "reasoning_effort": None, "thinking": None,
    "task": None, "continue_final_message": False, "separate_reasoning": True,
    "stream_reasoning": True, "chat_template_kwargs": None, "max_dynamic_patch": None,
    "min_dynamic_patch": None, "use_audio_in_video": False, "video_config": None,
    "input_ids": None,
}
CHAT = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4}


def _generated_up_to(body: dict, n: int) -> bool:
    """`n` tokens, or fewer ending on EOS (the tiny model samples freely and may stop early)."""
    got = body["usage"]["completion_tokens"]
    return got == n or (0 < got < n and body["choices"][0]["finish_reason"] == "stop")


@pytest.fixture(scope="module")
def server(tmp_logs) -> Iterator[Proc]:
    p = start_server(tmp_logs)
    try:
        yield p
    finally:
        p.stop()


@pytest.fixture
def impatient_server(tmp_logs) -> Iterator[Proc]:
    p = start_server(tmp_logs, "--read-timeout", "1")
    try:
        yield p
    finally:
        p.stop()


def _strict(payload: bytes) -> object:
    """JSON as a strict parser reads it: NaN / Infinity are errors."""
    def refuse(name: str):
        raise ValueError(f"bare {name} in JSON")
    return json.loads(payload, parse_constant=refuse)


# ---- SGLang's clients -------------------------------------------------------------------------

def test_openai_calls_work_behind_the_real_sglang_router(router):
    """sglang-router 0.3.2 adds SGLang's extension fields to every OpenAI call."""
    status, chat = call(router.url, "/v1/chat/completions", {"model": "m", **CHAT})
    assert status == 200, chat
    assert chat["object"] == "chat.completion" and _generated_up_to(chat, 4), chat
    status, comp = call(router.url, "/v1/completions", {"model": "m", "prompt": "hello",
                                                         "max_tokens": 3})
    assert status == 200 and _generated_up_to(comp, 3), comp
    chunks = stream(router.url, "/v1/chat/completions", {"model": "m", **CHAT, "stream": True})
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert chunks[-1]["choices"][0]["finish_reason"] == "length" and isinstance(text, str)
    # a field that would change the output and is not implemented: a 400 naming it, through it
    status, err = call(router.url, "/v1/chat/completions",
                       {"model": "m", **CHAT, "return_hidden_states": True})
    assert status == 400 and "return_hidden_states" in json.dumps(err), err


def test_every_sglang_openai_field_at_its_default_is_accepted(server):
    status, r = call(server.url, "/v1/completions",
                     {**SGLANG_COMPLETION_DEFAULTS, "prompt": "hi", "max_tokens": 3})
    assert status == 200 and _generated_up_to(r, 3), r
    status, r = call(server.url, "/v1/chat/completions", {**SGLANG_CHAT_DEFAULTS, **CHAT})
    assert status == 200 and _generated_up_to(r, 4), r


@pytest.mark.parametrize("field,value", [
    ("return_hidden_states", True), ("return_hidden_states", "last"), ("regex", "a+"),
    ("json_schema", "{}"), ("lora_path", "adapter"), ("return_token_ids", True),
    ("custom_logit_processor", "x"), ("sampling_logprobs_mode", "support"),
    ("return_routed_experts", True), ("bootstrap_host", "10.0.0.1")])
def test_a_non_default_unimplemented_field_gets_a_400_naming_it(server, field, value):
    path, body = ("/v1/completions", {"prompt": "hi", "max_tokens": 2}) \
        if field == "json_schema" else ("/v1/chat/completions", CHAT)
    status, err = call(server.url, path, {**body, field: value})
    assert status == 400 and err["param"] == field and field in err["message"], err


def test_chat_continue_final_message_and_input_ids_are_honoured(server):
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    base = {"max_tokens": 3, "temperature": 0, "ignore_eos": True}
    status, cont = call(server.url, "/v1/chat/completions",
                        {**base, "messages": msgs, "continue_final_message": True})
    assert status == 200, cont
    # the same prompt as a completion of the template without the new assistant turn
    status, same = call(server.url, "/v1/completions", {
        **base, "prompt": "<|user|>\nhi\n<|assistant|>\nhello"})
    assert cont["choices"][0]["message"]["content"] == same["choices"][0]["text"]
    status, err = call(server.url, "/v1/chat/completions",
                       {**base, "messages": msgs[:1], "continue_final_message": True})
    assert status == 400 and err["param"] == "continue_final_message"
    status, by_ids = call(server.url, "/v1/chat/completions",
                          {**base, "messages": msgs, "input_ids": [5, 6, 7]})
    assert status == 200 and by_ids["usage"]["prompt_tokens"] == 3


def test_unknown_generate_fields_are_ignored_as_sglang_does(server):
    """bench_serving --extra-request-body '{"foo": 1}' warms up with such a body."""
    status, r = call(server.url, "/generate", {"input_ids": [1, 2, 3], "foo": 1, "bar": {"x": []},
                                               "sampling_params": {"max_new_tokens": 2,
                                                                   "ignore_eos": True}})
    assert status == 200 and len(r["output_ids"]) == 2, r  # (ignore_eos: no early EOS)
    # SGLang fields that change the output still get a 400 naming them
    status, err = call(server.url, "/generate", {"input_ids": [1], "return_hidden_states": True})
    assert status == 400 and err["param"] == "return_hidden_states"


def test_slimes_payload_is_served(server):
    """slime's rollout sends these sampling params (sglang_rollout.py, top_p != 1)."""
    sp = {"temperature": 1.0, "top_p": 0.9, "top_k": -1, "max_new_tokens": 5, "stop": None,
          "stop_token_ids": None, "skip_special_tokens": False, "no_stop_trim": True,
          "spaces_between_special_tokens": False, "custom_params": {"return_top_p_token_ids": True},
          "sampling_seed": 3}
    status, r = call(server.url, "/generate", {"input_ids": [4, 5, 6], "sampling_params": sp,
                                               "return_logprob": True,
                                               "return_routed_experts": False})
    assert status == 200, r
    lp = r["meta_info"]["output_token_logprobs"]
    assert [t for _, t, _ in lp] == r["output_ids"] and len(lp) == r["meta_info"][
        "completion_tokens"]
    status, err = call(server.url, "/generate", {"input_ids": [4], "sampling_params": {
        "custom_params": "not an object"}})
    assert status == 400 and err["param"] == "custom_params"


# ---- hostile bodies: 4xx, never 5xx --------------------------------------------------------------

@pytest.mark.parametrize("raw,status,param", [
    (b"[" * 2000 + b"]" * 2000, 400, "body"),
    (b'{"input_ids": ' + b"[" * 100 + b"]" * 100 + b"}", 400, "body"),
    (b'{"text": "\\ud800"}', 400, "body"),
    (b'{"input_ids": [1], "sampling_params": {"stop": ["\\udfff"]}}', 400, "body"),
    (b'{"text": "\\ud83d\\ude00", "sampling_params": {"max_new_tokens": 1}}', 200, None),
])
def test_deep_nesting_and_lone_surrogates_get_a_400(server, raw, status, param):
    got, body = call(server.url, "/generate", raw=raw)
    assert got == status, body
    if param is not None:
        assert body["param"] == param and body["message"], body
    got, body = call(server.url, "/v1/completions", raw=raw)  # no prompt: some 4xx, not a 5xx
    assert 400 <= got < 500, body
    assert call(server.url, "/health")[0] == 200


def test_content_encodings(server):
    body = json.dumps({"input_ids": [1, 2],  # ignore_eos: the length checked below, no early EOS
                       "sampling_params": {"max_new_tokens": 2, "ignore_eos": True}}).encode()
    cases = [("gzip", gzip.compress(body), 200), ("x-gzip", gzip.compress(body), 200),
             ("deflate", zlib.compress(body), 200), ("identity", body, 200),
             ("gzip, gzip", gzip.compress(gzip.compress(body)), 200),
             ("gzip", body, 400), ("gzip", gzip.compress(body)[:-9], 400), ("deflate", b"xx", 400),
             ("br", body, 415), ("zstd", body, 415), ("x-nonsense", body, 415)]
    for enc, data, want in cases:
        status, r = call(server.url, "/generate", raw=data, headers={"Content-Encoding": enc})
        assert status == want, (enc, r)
        if want == 200:
            assert len(r["output_ids"]) == 2
        else:
            assert "message" in r and r["message"], r


def test_a_gzip_bomb_is_refused_without_inflating_it():
    from real.torch_engine.http_body import BodyError, decode_body

    bomb = gzip.compress(b"[" + b"0," * (40 * 1024 * 1024) + b"0]")
    with pytest.raises(BodyError) as e:
        decode_body(bomb, "gzip")
    assert e.value.status == 413


def test_half_open_sockets_are_released(impatient_server):
    """Connections that never finish a request head, or a body, are closed after the read
    timeout (1 s here); the server keeps serving meanwhile."""
    server = impatient_server
    port = int(server.url.rsplit(":", 1)[1])
    heads, bodies, silent = [], [], []
    for _ in range(20):
        c = socket.create_connection(("127.0.0.1", port))
        c.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\n")
        heads.append(c)
    for _ in range(5):
        c = socket.create_connection(("127.0.0.1", port))
        c.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"inp")
        bodies.append(c)
    for _ in range(5):
        silent.append(socket.create_connection(("127.0.0.1", port)))
    import http.client

    kept = http.client.HTTPConnection("127.0.0.1", port, timeout=10)  # served, then idle
    kept.request("GET", "/health")
    assert kept.getresponse().read() == b""
    assert call(server.url, "/health")[0] == 200
    t0 = time.monotonic()
    closed_in = []
    for c in heads + bodies + silent:
        c.settimeout(10)
        data = b""
        while True:
            chunk = c.recv(4096)
            if not chunk:
                break
            data += chunk
        closed_in.append(time.monotonic() - t0)
        if c in bodies:
            assert b" 408 " in data.split(b"\r\n")[0], data[:200]
        c.close()
    assert max(closed_in) < 5.0, closed_in
    assert call(server.url, "/health")[0] == 200
    kept.request("GET", "/health")  # a kept-alive connection outlives the read timeout
    assert kept.getresponse().status == 200
    kept.close()


# ---- the truth about itself ---------------------------------------------------------------------

def test_strict_json_never_carries_bare_nan():
    from real.torch_engine.http_body import dumps

    assert dumps({"a": [1.0, float("nan"), -math.inf], "b": "x"}) == \
        '{"a": [1.0, null, null], "b": "x"}'


def test_top_logprobs_of_masked_tokens_are_valid_json(server):
    """The test servers mask the vocabulary to round-trip words: many ids have log-prob -inf."""
    body = json.dumps({"input_ids": [3, 4], "return_logprob": True, "top_logprobs_num": VOCAB,
                       "sampling_params": {"max_new_tokens": 2}}).encode()
    import urllib.request

    req = urllib.request.Request(server.url + "/generate", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        out = _strict(r.read())
    tops = out["meta_info"]["output_top_logprobs"][0]
    assert len(tops) == VOCAB and any(lp is None for lp, _, _ in tops)


def test_a_nan_checkpoint_is_refused_at_load(server, tmp_path):
    cfg = ModelConfig(vocab_size=VOCAB, d_model=64, n_layers=2, n_heads=4, max_context=2048)
    model = TinyDecoder.random(cfg, seed=1)
    import torch

    with torch.no_grad():
        next(iter(model.parameters())).view(-1)[0] = float("nan")
    model.save(tmp_path / "nan")
    status, r = call(server.url, "/update_weights_from_disk", {"model_path": str(tmp_path / "nan")})
    assert status == 400 and r["success"] is False and "non-finite" in r["message"], r
    status, out = call(server.url, "/generate", {"input_ids": [1, 2], "return_logprob": True,
                                                 "sampling_params": {"max_new_tokens": 3}})
    assert status == 200 and all(math.isfinite(lp) for lp, _, _ in
                                 out["meta_info"]["output_token_logprobs"])
    # at start-up: one line, exit 2
    cmd = [sys.executable, "-m", "real.serve", "--port", "1", *SERVER_ARGS,
           "--checkpoint", str(tmp_path / "nan"), "--tokenizer-path", "none"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "non-finite" in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr


def test_server_info_reports_enable_memory_saver_truthfully(server, tmp_logs):
    assert call(server.url, "/server_info")[1]["enable_memory_saver"] is False
    status, err = call(server.url, "/release_memory_occupation", {})
    assert status == 400 and "--enable-memory-saver" in err["error"]["message"]
    assert internal(server.url)["memory_released"] == []
    saver = start_server(tmp_logs, "--enable-memory-saver")
    try:
        assert call(saver.url, "/server_info")[1]["enable_memory_saver"] is True
        assert call(saver.url, "/release_memory_occupation", {})[0] == 200
        assert internal(saver.url)["memory_released"] == ["kv_cache", "weights"]
        assert call(saver.url, "/resume_memory_occupation", {})[0] == 200
    finally:
        saver.stop()
