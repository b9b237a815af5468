"""The minimal OpenAI-compatible endpoints of the bundled server."""

from __future__ import annotations

from conftest import tokenizer_dir
from http_util import call, stream

from real.torch_engine.tokenizer import TextCodec


def test_completions(servers):
    url = servers[0].url
    codec = TextCodec(tokenizer_dir())
    body = {"model": "aprilsim/tiny-random", "prompt": "Once upon a time", "max_tokens": 7,
            "temperature": 0, "ignore_eos": True}
    status, r = call(url, "/v1/completions", body)
    assert status == 200 and r["object"] == "text_completion"
    choice = r["choices"][0]
    assert choice["finish_reason"] == "length" and choice["index"] == 0
    assert r["usage"] == {"prompt_tokens": len(codec.encode("Once upon a time")),
                          "completion_tokens": 7,
                          "total_tokens": len(codec.encode("Once upon a time")) + 7}
    native = call(url, "/generate", {"text": "Once upon a time", "sampling_params": {
        "max_new_tokens": 7, "temperature": 0, "ignore_eos": True}})[1]
    assert choice["text"] == native["text"]
    chunks = stream(url, "/v1/completions", {**body, "stream": True,
                                             "stream_options": {"include_usage": True}})
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == choice["text"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 7
    ids = call(url, "/v1/completions", {"prompt": [5, 6, 7], "max_tokens": 2})[1]
    assert ids["usage"]["prompt_tokens"] == 3


def test_chat_completions(servers):
    url = servers[0].url
    body = {"model": "aprilsim/tiny-random", "max_tokens": 5, "temperature": 0,
            "ignore_eos": True,
            "messages": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": [{"type": "text", "text": "Hi there"}]}]}
    status, r = call(url, "/v1/chat/completions", body)
    assert status == 200 and r["object"] == "chat.completion"
    msg = r["choices"][0]["message"]
    assert msg["role"] == "assistant" and r["usage"]["completion_tokens"] == 5
    chunks = stream(url, "/v1/chat/completions", {**body, "stream": True})
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == msg["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_openai_refuses_what_it_does_not_implement(servers):
    url = servers[0].url
    cases = [("/v1/completions", {"prompt": "x", "logprobs": 2}, "logprobs"),
             ("/v1/completions", {"prompt": "x", "n": 3}, "n"),
             ("/v1/completions", {"prompt": "x", "echo": True}, "echo"),
             ("/v1/completions", {"prompt": "x", "return_hidden_states": True},
              "return_hidden_states"),
             ("/v1/completions", {"prompt": ["a", "b"]}, "prompt"),
             ("/v1/completions", {"prompt": "x", "top_p": 0}, "top_p"),
             ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                       "tools": [{"type": "function"}]}, "tools"),
             ("/v1/chat/completions", {"messages": "hello"}, "messages")]
    for path, body, name in cases:
        status, err = call(url, path, body)
        assert status == 400 and name in err["message"], (body, err)
