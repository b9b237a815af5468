"""HTTP fuzzing of the bundled server: whatever arrives, it keeps serving.

Hypothesis draws request bodies (valid-ish and hostile: wrong types, NaN/inf, huge numbers,
unknown fields, batches, raw garbage), headers and sampling parameters. Every response must be
a 2xx, or a 4xx carrying a message; never a 5xx, never a dead engine. ``hypothesis.event`` labels
what each example reached (run with ``--hypothesis-show-statistics`` to see them).

:func:`test_hostile_shapes_get_4xx_never_5xx` adds the shapes of issue 22 (derandomized, its
reach counted and asserted): bodies nested up to 3,000 deep (bare or inside a valid request),
strings with lone surrogates anywhere a string goes, every ``Content-Encoding`` (right, wrong,
unsupported, stacked, truncated), and SGLang's OpenAI extension fields with hostile values.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections import Counter
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
         | st.lists(st.integers(-5, 600), max_size=4)
         | st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))
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


# ---- issue 22's shapes: deep nesting, lone surrogates, content encodings, SGLang's fields ------

REACH: Counter = Counter()
surrogate = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
dirty_text = st.builds(lambda a, s, b: a + s + b, st.text(max_size=5), surrogate,
                       st.text(max_size=5))


def _nest(depth: int, kind: str, leaf: object) -> object:
    for _ in range(depth):
        leaf = [leaf] if kind == "list" else {"k": leaf}
    return leaf


@st.composite
def deep_body(draw) -> bytes:
    depth = draw(st.integers(1, 3000) | st.sampled_from([63, 64, 65, 999, 1000, 1001, 2000]))
    kind = draw(st.sampled_from(["list", "dict"]))
    where = draw(st.sampled_from(["bare", "input_ids", "sampling_params", "stop", "messages"]))
    REACH["deep: >64" if depth > 64 else "deep: <=64"] += 1
    REACH[f"deep in {where}"] += 1
    if where == "bare":  # written by hand: json.dumps itself recurses
        return (b"[" * depth + b"]" * depth) if kind == "list" else \
            (b'{"k":' * depth + b"1" + b"}" * depth)
    open_, close = (b"[", b"]") if kind == "list" else (b'{"k":', b"}")
    inner = open_ * depth + (b"" if kind == "list" else b"1") + close * depth
    if where == "input_ids":
        return b'{"input_ids": ' + inner + b"}"
    if where == "sampling_params":
        return b'{"input_ids": [1], "sampling_params": {"max_new_tokens": 2, "x": ' + inner + b"}}"
    if where == "stop":
        return b'{"input_ids": [1], "sampling_params": {"max_new_tokens": 2, "stop": ' + inner \
            + b"}}"
    return b'{"messages": [{"role": "user", "content": ' + inner + b'}], "max_tokens": 2}'


@st.composite
def surrogate_body(draw) -> bytes:
    where = draw(st.sampled_from(["text", "stop", "rid", "key", "prompt", "message", "model"]))
    REACH[f"surrogate in {where}"] += 1
    bad = draw(dirty_text)
    body: dict = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}}
    if where == "text":
        body = {"text": bad, "sampling_params": {"max_new_tokens": 2}}
    elif where == "stop":
        body["sampling_params"]["stop"] = [bad]
    elif where == "rid":
        body["rid"] = bad
    elif where == "key":
        body["sampling_params"][bad] = 1
    elif where == "prompt":
        body = {"prompt": bad, "max_tokens": 2}
    elif where == "message":
        body = {"messages": [{"role": "user", "content": bad}], "max_tokens": 2}
    else:
        body = {"model": bad, "prompt": "hi", "max_tokens": 2}
    if draw(st.booleans()):  # the surrogate as raw bytes (ED A0 80...): invalid UTF-8 on the wire
        REACH["surrogate as raw bytes"] += 1  # (issue 36 item 10: a 500 from the tokenizer)
        return json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")
    REACH["surrogate as an escape"] += 1
    return json.dumps(body).encode()  # ensure_ascii: a lone surrogate becomes a \uDXXX escape


ENCODINGS = ["gzip", "x-gzip", "deflate", "identity", "gzip, gzip", "deflate, gzip", "br",
             "zstd", "compress", "x-nonsense", "", " gzip ", "GZIP"]


def _encode(data: bytes, encoding: str) -> bytes:
    for coding in [c.strip().lower() for c in encoding.split(",") if c.strip()]:
        if coding in ("gzip", "x-gzip"):
            data = gzip.compress(data)
        elif coding == "deflate":
            data = zlib.compress(data)
    return data


@st.composite
def encoded(draw, data: bytes) -> tuple[bytes, dict]:
    enc = draw(st.sampled_from(ENCODINGS))
    how = draw(st.sampled_from(["right", "right", "plain", "truncated", "garbage"]))
    REACH[f"encoding {enc.strip().lower() or '(empty)'}: {how}"] += 1
    REACH["encoding: any"] += 1
    if how == "right":
        data = _encode(data, enc)
    elif how == "truncated":
        data = _encode(data, enc)[: max(1, len(data) // 2)]
    elif how == "garbage":
        data = draw(st.binary(min_size=1, max_size=40))
    return data, {"Content-Encoding": enc}


sglang_fields = st.sampled_from([
    "return_hidden_states", "continue_final_message", "separate_reasoning", "stream_reasoning",
    "return_routed_experts", "routed_experts_start_len", "chat_template_kwargs", "custom_params",
    "custom_logit_processor", "lora_path", "regex", "ebnf", "json_schema", "stop_regex",
    "session_params", "bootstrap_host", "bootstrap_port", "routed_dp_rank", "reasoning_effort",
    "input_ids", "return_token_ids", "sampling_logprobs_mode", "priority", "extra_key",
    "tool_choice", "response_format", "n", "best_of", "logprobs", "top_logprobs", "echo"])


@st.composite
def openai_body(draw) -> bytes:
    chat = draw(st.booleans())
    body: dict = ({"messages": [{"role": "user", "content": "hi"}]} if chat
                  else {"prompt": "hi"})
    body["max_tokens"] = 2
    for _ in range(draw(st.integers(1, 4))):
        key = draw(sglang_fields)
        body[key] = draw(weird | st.sampled_from(["last", "support", {"type": "text"}, True]))
        REACH["openai field " + ("chat" if chat else "completion")] += 1
    return json.dumps(body, allow_nan=True).encode()


hostile = st.one_of(deep_body(), surrogate_body(), openai_body())


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(data=st.data(), raw=hostile, encode=st.booleans())
def test_hostile_shapes_get_4xx_never_5xx(server, data, raw, encode):
    headers: dict = {}
    if encode:
        raw, headers = data.draw(encoded(raw))
    text = raw.decode("latin-1")
    path = ("/v1/chat/completions" if '"messages"' in text else "/v1/completions"
            if '"prompt"' in text or '"max_tokens"' in text else "/generate")
    status, payload = call(server.url, path, raw=raw, headers=headers, timeout=60)
    REACH[f"{path}: HTTP {status // 100}xx"] += 1
    REACH[f"HTTP {status}"] += 1
    _check(status, payload, path)


def test_hostile_shapes_reached_every_category():
    """The counts behind the fuzz above (it runs first): every shape was tried, and answered."""
    if not REACH:
        pytest.skip("run together with test_hostile_shapes_get_4xx_never_5xx")
    print(sorted(REACH.items()))
    deep = ("bare", "input_ids", "sampling_params", "stop", "messages")
    places = ("text", "stop", "rid", "key", "prompt", "message", "model")
    assert REACH["deep: >64"] >= 25 and REACH["deep: <=64"] >= 5
    assert all(REACH[f"deep in {w}"] >= 2 for w in deep)
    assert sum(REACH[f"surrogate in {w}"] for w in places) >= 40
    assert all(REACH[f"surrogate in {w}"] >= 1 for w in places)
    assert REACH["surrogate as raw bytes"] >= 15 and REACH["surrogate as an escape"] >= 15
    assert REACH["encoding: any"] >= 80
    assert sum(v for k, v in REACH.items() if k.startswith("encoding gzip: right")) >= 3
    assert sum(v for k, v in REACH.items() if k.startswith("encoding br")) >= 3
    assert REACH["openai field chat"] + REACH["openai field completion"] >= 50
    assert REACH["HTTP 400"] >= 150 and REACH["HTTP 415"] >= 10
    assert REACH["/generate: HTTP 2xx"] + REACH["/v1/completions: HTTP 2xx"] \
        + REACH["/v1/chat/completions: HTTP 2xx"] >= 10
    assert not any(k.startswith("HTTP 5") for k in REACH)


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/abort_request", {"abort_all": "yes"}, "abort_all"),  # issue 36 item 10: read as true
    ("/abort_request", {"abort_all": 1}, "abort_all"),
    ("/abort_request", {"rid": "x", "abort_all": "false"}, "abort_all"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2, "stream": "false"}, "stream"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2, "stream": True,
                         "stream_options": {"include_usage": "no"}}, "include_usage"),
])
def test_booleans_are_json_booleans(server, path, body, param):
    """`bool("false")` is true: a string where SGLang takes a boolean gets a 400 naming it."""
    status, payload = call(server.url, path, raw=json.dumps(body).encode())
    assert status == 400 and payload["param"] == param and "expected true or false" in \
        payload["message"]
    assert call(server.url, "/abort_request", raw=b'{"abort_all": true}')[0] == 200


def test_a_client_gone_mid_body_is_no_error_in_the_log(server):
    """An ordinary disconnect while the body is read logged ERROR with two tracebacks."""
    import socket
    import time
    from urllib.parse import urlparse

    u = urlparse(server.url)
    before = server.log.read_text(errors="replace")
    for _ in range(3):
        with socket.create_connection((u.hostname, u.port)) as s:
            s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 1000\r\n\r\n{\"text\": \"ab")
            time.sleep(0.3)
    time.sleep(0.5)
    added = server.log.read_text(errors="replace")[len(before):]
    assert "ERROR" not in added and "Traceback" not in added, added[-2000:]
    assert call(server.url, "/health")[0] == 200
