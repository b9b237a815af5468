"""The bundled server as an SGLang stand-in: validation, log-probs, tokenizer, text I/O.

Against the session's shared servers (seed 0, tokenizer built from the bundled corpus).
"""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch
from conftest import VOCAB, run, served_logprobs, tokenizer_dir
from http_util import call, internal, stream

from real.torch_engine import BatchEngine, EngineConfig, EngineRequest, ModelConfig, TinyDecoder
from real.torch_engine.runner import EngineRunner, TokenEvent
from real.torch_engine.tokenizer import TextCodec, build_tokenizer

SERVED = ModelConfig(vocab_size=VOCAB, d_model=64, n_layers=2, n_heads=4, max_context=2048)


@pytest.fixture(scope="module")
def served_model() -> TinyDecoder:
    return TinyDecoder.random(SERVED, seed=0)


@pytest.fixture(scope="module")
def codec() -> TextCodec:
    return TextCodec(tokenizer_dir())


def gen(url: str, **body) -> tuple[int, dict]:
    body.setdefault("sampling_params", {})
    return call(url, "/generate", body)


# ---- item 3: validation as SGLang, and an engine that cannot be killed -------------------------

KILLERS = [  # each killed the old engine for good; SGLang answers 400
    ({"temperature": float("nan")}, "temperature"),
    ({"top_p": -1}, "top_p"),
    ({"sampling_seed": "abc"}, "sampling_seed"),
    ({"sampling_seed": 1.5}, "sampling_seed"),
    ({"top_p": 0}, "top_p"),
    ({"top_k": 0}, "top_k"),
    ({"temperature": -0.5}, "temperature"),
    ({"min_p": 2}, "min_p"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"frequency_penalty": 3}, "frequency_penalty"),
    ({"min_new_tokens": 9, "max_new_tokens": 4}, "min_new_tokens"),
    ({"max_new_tokens": -1}, "max_new_tokens"),
    ({"logit_bias": {"99999": 1.0}}, "logit_bias"),
    ({"max_tokens": 5}, "max_tokens"),
]
UNSUPPORTED = [  # never silently ignored: refused with a 400 naming the parameter
    ({"sampling_params": {"n": 2}}, "n"),
    ({"sampling_params": {"regex": "a+"}}, "regex"),
    ({"sampling_params": {"json_schema": "{}"}}, "json_schema"),
    ({"sampling_params": {"ebnf": "root ::= 'a'"}}, "ebnf"),
    ({"sampling_params": {"stop_regex": "x"}}, "stop_regex"),
    ({"sampling_params": {"structural_tag": "t"}}, "structural_tag"),
    ({"sampling_params": {"custom_params": 3}}, "custom_params"),  # a dict is accepted
    ({"token_ids_logprob": [1, 2]}, "token_ids_logprob"),
    ({"lora_path": "x"}, "lora_path"),
    ({"return_hidden_states": True}, "return_hidden_states"),
    ({"image_data": "http://x/y.png"}, "image_data"),
    ({"input_ids": [[1, 2], [3]]}, "input_ids"),
    ({"sampling_params": {"no_such_param": 1}}, "no_such_param"),  # top-level: ignored
]


def test_bad_sampling_params_get_400_naming_them_and_the_engine_lives(servers):
    url = servers[0].url
    for sp, name in KILLERS:
        raw = json.dumps({"input_ids": [10, 11], "sampling_params": sp}).encode()  # NaN allowed
        status, body = call(url, "/generate", raw=raw)
        assert status == 400, (sp, body)
        assert name in body["message"], (sp, body)
        assert call(url, "/health")[0] == 200
    for extra, name in UNSUPPORTED:
        body = {"input_ids": [10, 11], **extra}
        status, resp = call(url, "/generate", body)
        assert status == 400 and name in resp["message"], (extra, resp)
    # still serving after them all (ignore_eos: a sampled EOS would end it early, as it did once
    # in CI, output [485, 2])
    status, ok = gen(url, input_ids=[10, 11],
                     sampling_params={"max_new_tokens": 3, "ignore_eos": True})
    assert status == 200 and len(ok["output_ids"]) == 3


def test_greedy_temperature_zero_and_supported_params_take_effect(servers, codec):
    url = servers[0].url
    base = {"input_ids": [30, 31, 32], "sampling_params": {"max_new_tokens": 6, "temperature": 0,
                                                             "ignore_eos": True}}
    a, b = gen(url, **base)[1], gen(url, **base)[1]
    assert a["output_ids"] == b["output_ids"]
    # logit_bias forces a token the model may sample; frequency_penalty stops it repeating
    word = codec.roundtrip_ids[5]
    forced = gen(url, input_ids=[30, 31], sampling_params={
        "max_new_tokens": 4, "temperature": 0, "ignore_eos": True,
        "logit_bias": {str(word): 100.0}})[1]
    assert forced["output_ids"] == [word] * 4
    pen = gen(url, input_ids=[30, 31], sampling_params={
        "max_new_tokens": 4, "temperature": 0, "ignore_eos": True, "logit_bias": {str(word): 5.0},
        "frequency_penalty": 2.0, "presence_penalty": 2.0, "repetition_penalty": 2.0})[1]
    assert pen["output_ids"] != [word] * 4
    # ... but no bias brings back a token outside the round-trip set (77: a byte-level piece)
    assert 77 not in codec.roundtrip_ids
    masked = gen(url, input_ids=[30, 31], sampling_params={
        "max_new_tokens": 4, "temperature": 0, "ignore_eos": True, "logit_bias": {"77": 100.0}})[1]
    assert 77 not in masked["output_ids"] and set(masked["output_ids"]) <= set(codec.roundtrip_ids)
    # a stop string ends generation and is trimmed from text (kept with no_stop_trim)
    ids = a["output_ids"]
    piece = codec.decode(ids[2:4])
    assert piece.strip(), "need printable tokens for a stop string"
    sp = {**base["sampling_params"], "ignore_eos": False, "stop": [piece]}
    stopped = gen(url, input_ids=[30, 31, 32], sampling_params=sp)[1]
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": piece}
    assert len(stopped["output_ids"]) <= 4 and piece not in stopped["text"]
    kept = gen(url, input_ids=[30, 31, 32], sampling_params={**sp, "no_stop_trim": True})[1]
    assert kept["text"].endswith(piece) or piece in kept["text"]


def test_engine_loop_survives_a_failing_step_and_logs_it(caplog):
    """An unexpected exception in a step fails that batch alone (500 finish), is logged with
    its traceback, and the next request is served by the same loop."""
    model = TinyDecoder.random(ModelConfig(vocab_size=300, d_model=32, n_layers=1, n_heads=2,
                                           max_context=64), seed=1)
    engine = BatchEngine(model, EngineConfig(max_running_requests=2))
    real_decode = engine._decode
    calls = {"n": 0}

    def flaky():
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("injected step failure")
        return real_decode()

    engine._decode = flaky

    async def main():
        runner = EngineRunner(engine)
        runner.start()
        try:
            async def one(rid):
                h = runner.submit(EngineRequest(rid, [5, 6], 5, ignore_eos=True))
                while True:
                    ev = await h.events.get()
                    if not isinstance(ev, TokenEvent):
                        return ev
            first = await one("a")
            second = await one("b")
            return first, second, runner.alive, runner.step_errors
        finally:
            await runner.close()

    with caplog.at_level(logging.ERROR):
        first, second, alive, errors = run(main())
    assert first.reason["type"] == "abort" and first.reason["status_code"] == 500
    assert "injected step failure" in first.reason["message"]
    assert second.reason == {"type": "length", "length": 5} and len(second.output_ids) == 5
    assert alive and errors == 1
    assert "Traceback" in caplog.text and "injected step failure" in caplog.text


def test_a_request_failing_in_sampling_fails_alone(monkeypatch):
    from real.torch_engine import engine as engine_mod

    model = TinyDecoder.random(ModelConfig(vocab_size=300, d_model=32, n_layers=1, n_heads=2,
                                           max_context=64), seed=1)
    eng = BatchEngine(model, EngineConfig(max_running_requests=4))
    real_sample = engine_mod.sample_next

    def bad(logits, spec, gen):
        if spec.top_p == 0.5:
            raise FloatingPointError("boom")
        return real_sample(logits, spec, gen)

    monkeypatch.setattr(engine_mod, "sample_next", bad)
    eng.add(EngineRequest("ok", [5, 6], 4, ignore_eos=True))
    eng.add(EngineRequest("bad", [5, 6], 4, ignore_eos=True, top_p=0.5))
    done = {}
    while eng.has_work:
        for f in eng.step().finished:
            done[f.rid] = f
    assert done["bad"].reason["status_code"] == 500 and "boom" in done["bad"].reason["message"]
    assert len(done["ok"].output_ids) == 4 and len(eng.pool.free) == 4


# ---- item 1: log-probs in SGLang's format ------------------------------------------------------

def test_return_logprob_gives_real_model_logprobs(servers, served_model, codec):
    url = servers[0].url
    prompt = [40, 41, 42, 43]
    status, r = gen(url, input_ids=prompt, return_logprob=True, top_logprobs_num=3,
                    logprob_start_len=0,
                    sampling_params={"max_new_tokens": 5, "temperature": 0, "ignore_eos": True})
    assert status == 200
    meta, out = r["meta_info"], r["output_ids"]
    # response tokens rebuilt from output_token_logprobs == output_ids (RL rollout code does this)
    assert [t[1] for t in meta["output_token_logprobs"]] == out
    # outputs: the distribution sampled (masked to the round-trip tokens); inputs: the model's
    ref = served_logprobs(served_model, prompt + out)
    full = torch.log_softmax(served_model.forward_full(torch.tensor(prompt + out)), dim=-1)
    for i, (lp, tid, text) in enumerate(meta["output_token_logprobs"]):
        assert text is None
        assert math.isclose(lp, float(ref[len(prompt) - 1 + i, tid]), abs_tol=1e-4)
    ins = meta["input_token_logprobs"]
    assert [t[1] for t in ins] == prompt and ins[0][0] is None
    for i in range(1, len(prompt)):
        assert math.isclose(ins[i][0], float(full[i - 1, prompt[i]]), abs_tol=1e-4)
    tops = meta["output_top_logprobs"]
    assert len(tops) == len(out) and all(len(t) == 3 for t in tops)
    assert all(t[0][1] == tok for t, tok in zip(tops, out))  # greedy: the top-1 was chosen
    assert all(x[1] in codec.roundtrip_ids for t in tops for x in t)
    assert [x[0] for t in tops for x in t] == pytest.approx(
        [v for i in range(len(out)) for v in ref[len(prompt) - 1 + i].topk(3).values.tolist()],
        abs=1e-4)
    assert meta["input_top_logprobs"][0] is None and len(meta["input_top_logprobs"]) == 4


def test_logprob_defaults_and_errors_follow_sglang(servers, codec):
    url = servers[0].url
    r = gen(url, input_ids=[40, 41, 42], return_logprob=True,
            sampling_params={"max_new_tokens": 3, "ignore_eos": True})[1]
    assert r["meta_info"]["input_token_logprobs"] == []  # logprob_start_len -1: outputs only
    assert len(r["meta_info"]["output_token_logprobs"]) == 3
    assert "output_top_logprobs" not in r["meta_info"]
    status, err = gen(url, input_ids=[40, 41, 42], return_logprob=True, logprob_start_len=5)
    assert status == 400 and "logprob_start_len" in err["message"]
    t = gen(url, input_ids=[40, 41], return_logprob=True, return_text_in_logprobs=True,
            sampling_params={"max_new_tokens": 2, "ignore_eos": True})[1]
    assert [x[2] for x in t["meta_info"]["output_token_logprobs"]] == \
        [codec.token_text(i) for i in t["output_ids"]]
    chunks = stream(url, "/generate", {"input_ids": [40, 41], "return_logprob": True,
                                       "stream": True, "sampling_params": {
                                           "max_new_tokens": 4, "ignore_eos": True}})
    assert [len(c["meta_info"]["output_token_logprobs"]) for c in chunks] == [1, 2, 3, 4]
    assert [x[1] for x in chunks[-1]["meta_info"]["output_token_logprobs"]] == \
        chunks[-1]["output_ids"]


def test_incremental_stream_sends_logprob_deltas(incremental_server):
    chunks = stream(incremental_server.url, "/generate", {
        "input_ids": [40, 41], "return_logprob": True, "stream": True,
        "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}})
    got = [x for c in chunks for x in c["meta_info"]["output_token_logprobs"]]
    ids = [i for c in chunks for i in c["output_ids"]]
    assert [x[1] for x in got] == ids and len(ids) == 4


# ---- item 2: a real tokenizer, text in and out ---------------------------------------------------

def test_tokenizer_is_deterministic_and_loads_with_autotokenizer(codec):
    assert build_tokenizer(VOCAB).to_str() == build_tokenizer(VOCAB).to_str()
    assert codec.vocab_size == VOCAB and codec.tok.token_to_id("<|eos|>") == 2
    text = "Hello world, the quick brown fox 123."
    assert codec.decode(codec.encode(text)) == text
    transformers = pytest.importorskip("transformers")
    auto = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir()))
    assert auto.encode(text, add_special_tokens=False) == codec.encode(text)
    assert auto.eos_token_id == 2


def test_text_prompts_and_text_outputs(servers, codec):
    url = servers[0].url
    text = "Shai tra ploun, the bread is warm."
    sp = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
    by_text = gen(url, text=text, sampling_params=sp)[1]
    by_ids = gen(url, input_ids=codec.encode(text), sampling_params=sp)[1]
    assert by_text["output_ids"] == by_ids["output_ids"]
    assert by_text["meta_info"]["prompt_tokens"] == len(codec.encode(text))
    assert by_text["text"] == codec.decode(by_text["output_ids"]) and by_text["text"]
    chunks = stream(url, "/generate", {"text": text, "stream": True, "sampling_params": sp})
    assert chunks[-1]["text"] == by_text["text"]
    assert all(c["text"] for c in chunks[1:])  # what SGLang's bench client needs for TTFT/ITL
    status, info = call(url, "/get_model_info")
    assert status == 200 and info["tokenizer_path"] == str(tokenizer_dir())
    assert call(url, "/server_info")[1]["skip_tokenizer_init"] is False
    status, err = gen(url, text=["a", "b"])
    assert status == 400 and "text" in err["message"]
    assert internal(url)["step_errors"] == 0
