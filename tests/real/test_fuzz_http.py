"""HTTP fuzzing of the bundled server: whatever arrives, it keeps serving.

Hypothesis draws request bodies (valid-ish and hostile: wrong types, NaN/inf, huge numbers,
unknown fields, batches, raw garbage), headers and sampling parameters. Every response must be
a 2xx, or a 4xx carrying a message; never a 5xx, never a dead engine. ``hypothesis.event`` labels
what each example reached (run with ``--hypothesis-show-statistics`` to see them).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from conftest import Proc, start_server
from http_util import call, internal
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st


@pytest.fixture(scope="module")
def server(tmp_logs) -> Iterator[Proc]:
    p = start_server(tmp_logs, "--kv-budget-tokens", "600")
    try:
        yield p
    finally:
        p.stop()


weird = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
         | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8)
         | st.lists(st.integers(-5, 600), max_size=4) | st.dictionaries(st.text(max_size=4),
                                                                          st.integers(), max_size=2))
sampling_value = {
    "max_new_tokens": st.integers(-3, 40) | weird,
    "temperature": st.floats(-1, 3) | weird,
    "top_p": st.floats(-0.5, 1.5) | weird,
    "top_k": st.integers(-2, 600) | weird,
    "min_p": st.floats(-0.5, 1.5) | weird,
    "frequency_penalty": st.floats(-3, 3) | weird,
    "presence_penalty": st.floats(-3, 3) | weird,
    "repetition_penalty": st.floats(-1, 3) | weird,
    "min_new_tokens": st.integers(-2, 50) | weird,
    "sampling_seed": st.integers(-(2**64), 2**64) | weird,
    "ignore_eos": st.booleans() | weird,
    "stop": st.text(max_size=3) | st.lists(st.text(max_size=3), max_size=3) | weird,
    "stop_token_ids": st.lists(st.integers(-2, 700), max_size=3) | weird,
    "logit_bias": st.dictionaries(st.sampled_from(["1", "5", "600", "x", "-1"]),
                                  st.floats(-10, 10) | weird, max_size=2) | weird,
    "n": st.integers(0, 3) | weird,
    "regex": st.none() | st.text(max_size=3),
    "stream_interval": st.integers(-1, 4) | weird,
    "skip_special_tokens": st.booleans() | weird,
    "bogus_param": weird,
}
valid_sampling = st.fixed_dictionaries({"max_new_tokens": st.integers(0, 8)}, optional={
    "temperature": st.floats(0, 2), "top_p": st.floats(0.05, 1), "top_k": st.integers(1, 600),
    "min_p": st.floats(0, 1), "frequency_penalty": st.floats(-2, 2),
    "presence_penalty": st.floats(-2, 2), "repetition_penalty": st.floats(0.1, 2),
    "sampling_seed": st.integers(0, 2**40), "ignore_eos": st.booleans(),
    "stop": st.lists(st.text(max_size=3), max_size=2),
    "stop_token_ids": st.lists(st.integers(0, 511), max_size=3),
    "logit_bias": st.dictionaries(st.sampled_from(["1", "5", "300"]), st.floats(-5, 5),
                                  max_size=2),
    "stream_interval": st.integers(1, 4), "skip_special_tokens": st.booleans()})
valid_body = st.fixed_dictionaries(
    {"input_ids": st.lists(st.integers(0, 511), min_size=1, max_size=30)},
    optional={"sampling_params": valid_sampling, "stream": st.booleans(),
              "return_logprob": st.booleans(), "top_logprobs_num": st.integers(0, 5),
              "logprob_start_len": st.integers(-1, 1), "rid": st.uuids().map(str),
              "return_text_in_logprobs": st.booleans()})
prompt = (st.lists(st.integers(0, 511), min_size=1, max_size=40)
          | st.lists(st.integers(-10, 2000), max_size=5) | weird)
top_level = {"input_ids": prompt, "text": st.text(max_size=40) | weird, "sampling_params": weird,
             "stream": weird, "return_logprob": weird, "logprob_start_len": weird,
             "top_logprobs_num": weird, "rid": weird, "lora_path": weird,
             "unknown_thing": weird, "token_ids_logprob": weird}


@st.composite
def body(draw) -> object:
    """A valid request, then (mostly) one mutation: a hostile value somewhere, or no body."""
    b = draw(valid_body)
    kind = draw(st.sampled_from(["valid", "sampling", "sampling", "top", "top", "whole"]))
    event(f"body mutation: {kind}")
    if kind == "sampling":
        key = draw(st.sampled_from(sorted(sampling_value)))
        b.setdefault("sampling_params", {"max_new_tokens": 4})[key] = draw(sampling_value[key])
    elif kind == "top":
        key = draw(st.sampled_from(sorted(top_level)))
        b[key] = draw(top_level[key])
    elif kind == "whole":
        return draw(weird)
    return b


headers = st.fixed_dictionaries({}, optional={
    "Content-Type": st.sampled_from(["application/json", "text/plain", "application/x-www-form",
                                     "", "application/json; charset=latin-1"]),
    "X-Request-Id": st.text(alphabet="abcdefghij-", max_size=10),
    "Accept-Encoding": st.sampled_from(["gzip", "identity", "br"]),
})
raw_garbage = st.binary(max_size=60) | st.sampled_from(
    [b"{", b"[]", b"null", b'{"input_ids": [1,2', b"\xff\xfe", b'{"input_ids": NaN}'])
endpoints = st.sampled_from(["/generate", "/generate", "/generate", "/abort_request",
                             "/v1/completions", "/v1/chat/completions", "/pause_generation?x=1",
                             "/update_weight_version", "/update_weights_from_disk",
                             "/release_memory_occupation?dry=1"])


def _check(status: int, payload: object, label: str) -> None:
    event(f"{label}: HTTP {status // 100}xx")
    assert status < 500, (label, status, payload)
    if status >= 400:
        text = json.dumps(payload) if not isinstance(payload, str) else payload
        assert text and ("message" in text or "error" in text), payload
        if isinstance(payload, dict):
            msg = payload.get("message") or (payload.get("error") or {}).get("message")
            event(f"{label}: 4xx names " + (str(payload.get("param")) if payload.get("param")
                                             else "(message only)"))
            assert msg


@settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck))
@given(b=body(), h=headers, raw=st.none() | st.none() | st.none() | raw_garbage, path=endpoints)
def test_server_never_stops_serving(server, b, h, raw, path):
    if path.startswith(("/pause", "/release")):  # only invalid ones: the server must stay up
        path, raw = path.split("?")[0], None
        b = {"mode": "sideways"} if path.startswith("/pause") else {"tags": ["nonsense"]}
    elif path == "/update_weights_from_disk":
        b = b if isinstance(b, dict) and "model_path" not in b else {"model_path": "/nonexistent"}
    if isinstance(b, dict) and path == "/generate" and "sampling_params" not in b:
        b["sampling_params"] = {}
    if isinstance(b, dict) and isinstance(b.get("sampling_params"), dict):
        b["sampling_params"].setdefault("max_new_tokens", 4)  # keep valid requests short
    data = raw if raw is not None else json.dumps(b, allow_nan=True).encode()
    status, payload = call(server.url, path, raw=data, headers=h, timeout=60)
    _check(status, payload, path.split("?")[0])
    if path == "/generate" and status == 200:
        event("/generate: served")


def test_after_fuzzing_the_engine_is_whole(server):
    status, r = call(server.url, "/generate", {"input_ids": [1, 2, 3], "sampling_params": {
        "max_new_tokens": 3, "ignore_eos": True}})
    assert status == 200 and len(r["output_ids"]) == 3
    state = internal(server.url)
    assert state["step_errors"] == 0 and state["free_slots"] == 8 and state["kv_used_tokens"] == 0
    assert not state["paused"] and state["memory_released"] == []
    assert call(server.url, "/health")[0] == 200
