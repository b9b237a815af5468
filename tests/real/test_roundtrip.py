"""Generated text round-trips: the output vocabulary mask and the sampling under it.

The bundled server lets the model sample only tokens whose text re-encodes to themselves
(:func:`real.torch_engine.tokenizer.roundtrip_token_ids`), so any sequence of sampled ids
decodes to text that the tokenizer encodes back to exactly those ids (what SGLang's
``bench_serving`` counts as "retokenized"). Log-probs are those of the masked distribution.
"""

from __future__ import annotations

import functools

import pytest
import torch
from conftest import VOCAB, tokenizer_dir
from hypothesis import given, settings
from hypothesis import strategies as st

from real.torch_engine import BatchEngine, EngineConfig, EngineRequest, ModelConfig, TinyDecoder
from real.torch_engine.tokenizer import MIN_VOCAB, TextCodec, build_tokenizer, roundtrip_token_ids

CFG = ModelConfig(vocab_size=VOCAB, d_model=64, n_layers=2, n_heads=4, max_context=512)
EOS = CFG.eos_token_id


@functools.cache
def _tok(vocab: int):
    return build_tokenizer(vocab)


@functools.cache
def _allowed(vocab: int) -> tuple[int, ...]:
    return tuple(roundtrip_token_ids(_tok(vocab)))


@pytest.fixture(scope="module")
def codec() -> TextCodec:
    return TextCodec(tokenizer_dir())


@pytest.fixture(scope="module")
def model() -> TinyDecoder:
    return TinyDecoder.random(CFG, seed=0)


def test_roundtrip_set_is_whole_words_and_large_enough(codec):
    allowed = codec.roundtrip_ids
    assert allowed == _allowed(VOCAB)
    assert len(allowed) >= 64, len(allowed)  # 85 of 512 for the bundled corpus
    assert not set(allowed) & codec.special_ids
    for t in allowed:
        text = codec.token_text(t)
        assert text[0] == " " and (text[1:].isalpha() or text[1:].isdigit()), text
        assert codec.encode(text) == [t]
    assert _allowed(MIN_VOCAB)  # even the smallest bundled vocabulary has some


@settings(max_examples=300, deadline=None)
@given(data=st.data(), vocab=st.sampled_from([MIN_VOCAB, VOCAB, 1024]))
def test_any_sequence_of_allowed_ids_reencodes_to_itself(data, vocab):
    tok, allowed = _tok(vocab), _allowed(vocab)
    ids = data.draw(st.lists(st.sampled_from(allowed), max_size=64))
    text = tok.decode(ids)
    assert len(tok.encode(text, add_special_tokens=False).ids) == len(ids)
    assert tok.encode(text, add_special_tokens=False).ids == ids
    # an output that ends on EOS: the text without it (skip_special_tokens) or with it
    assert tok.encode(tok.decode([*ids, EOS]), add_special_tokens=False).ids == ids
    with_eos = tok.decode([*ids, EOS], skip_special_tokens=False)
    assert tok.encode(with_eos, add_special_tokens=False).ids == [*ids, EOS]


def test_autotokenizer_counts_the_same(codec):
    """bench_serving retokenizes with transformers.AutoTokenizer, not the tokenizers library."""
    transformers = pytest.importorskip("transformers")
    auto = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir()))
    allowed = list(codec.roundtrip_ids)
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        ids = [allowed[i] for i in torch.randint(len(allowed), (40,), generator=gen).tolist()]
        assert auto.encode(auto.decode(ids), add_special_tokens=False) == ids


def _engine(model: TinyDecoder, codec: TextCodec, **cfg) -> BatchEngine:
    eng = BatchEngine(model, EngineConfig(max_running_requests=8, **cfg))
    eng.restrict_output(codec.roundtrip_ids)
    return eng


def _drain(eng: BatchEngine) -> dict:
    done = {}
    while eng.has_work:
        for f in eng.step().finished:
            done[f.rid] = f
    return done


def _masked_logprobs(model: TinyDecoder, allowed, ids: list[int], eos: bool,
                     temperature: float) -> torch.Tensor:
    """log_softmax over the allowed ids (+ EOS when the request may stop on it), every position."""
    mask = torch.full((model.cfg.vocab_size,), -float("inf"))
    mask[list(allowed)] = 0.0
    if eos:
        mask[EOS] = 0.0
    logits = model.forward_full(torch.tensor(ids)) + mask
    return torch.log_softmax(logits / temperature, dim=-1)


SAMPLERS = {  # plain rows (batched path) and rows that go through sample_next
    "greedy": {"temperature": 0.0},
    "temp": {"temperature": 0.8},
    "seeded": {"temperature": 1.0, "seed": 7},
    "top_p": {"temperature": 1.0, "top_p": 0.9, "seed": 3},
    "top_k": {"temperature": 1.0, "top_k": 5, "seed": 4},
}


@pytest.mark.parametrize("ignore_eos", [True, False])
def test_every_sampler_emits_only_allowed_ids_with_masked_logprobs(model, codec, ignore_eos):
    eng = _engine(model, codec)
    allowed = set(codec.roundtrip_ids)
    reqs = []
    for name, kw in SAMPLERS.items():
        prompt = [3, 200, 17, 99, 4 + len(reqs)]  # prompts are unrestricted (byte tokens here)
        r = EngineRequest(name, prompt, 24, ignore_eos=ignore_eos, return_logprob=True,
                          top_logprobs_num=4, **kw)
        reqs.append(r)
        eng.add(r)
    done = _drain(eng)
    for r in reqs:
        out = done[r.rid].output_ids
        assert out and set(out) <= allowed | ({EOS} if not ignore_eos else set()), r.rid
        assert EOS not in out[:-1]
        text = codec.decode(out)
        assert codec.encode(text) == [t for t in out if t != EOS]
        lp = _masked_logprobs(model, allowed, r.prompt_ids + out, eos=not ignore_eos,
                              temperature=r.spec.temperature)  # type: ignore[union-attr]
        for i, t in enumerate(out):
            row = lp[len(r.prompt_ids) - 1 + i]
            assert r.output_logprobs[i] == pytest.approx(float(row[t]), abs=1e-4), r.rid
            top = r.output_top_logprobs[i]
            assert [tid for _, tid in top] == row.topk(4).indices.tolist()
            assert all(tid in allowed or (tid == EOS and not ignore_eos) for _, tid in top)
        if r.rid == "greedy":
            assert all(r.output_top_logprobs[i][0][1] == t for i, t in enumerate(out))


def test_greedy_and_seeded_outputs_are_deterministic(model, codec):
    def outputs() -> dict:
        eng = _engine(model, codec)
        for name, kw in SAMPLERS.items():
            if name != "temp":  # unseeded sampling shares the engine's generator
                eng.add(EngineRequest(name, [40, 41, 42], 20, ignore_eos=True, **kw))
        return {k: f.output_ids for k, f in _drain(eng).items()}

    assert outputs() == outputs()
    # a seeded request alone draws the same tokens as in a batch
    eng = _engine(model, codec)
    eng.add(EngineRequest("seeded", [40, 41, 42], 20, ignore_eos=True, **SAMPLERS["seeded"]))
    assert _drain(eng)["seeded"].output_ids == outputs()["seeded"]


def test_bias_cannot_bring_back_a_masked_token_and_input_logprobs_are_unmasked(model, codec):
    eng = _engine(model, codec)
    masked = next(t for t in range(VOCAB) if t not in codec.roundtrip_ids and t != EOS)
    word = codec.roundtrip_ids[5]
    r1 = EngineRequest("masked", [40, 41], 3, ignore_eos=True, temperature=0.0, return_logprob=True,
                       logprob_start_len=0)
    r1.spec.logit_bias[masked] = 100.0  # type: ignore[union-attr]
    r2 = EngineRequest("word", [40, masked], 3, ignore_eos=True, temperature=0.0)
    r2.spec.logit_bias[word] = 100.0  # type: ignore[union-attr]
    eng.add(r1)
    eng.add(r2)
    done = _drain(eng)
    assert masked not in done["masked"].output_ids
    assert done["word"].output_ids == [word] * 3
    # the prompt is scored by the unmasked model (prompt ids are not restricted)
    full = torch.log_softmax(model.forward_full(torch.tensor([40, 41])), dim=-1)
    assert r1.input_logprobs == [None, pytest.approx(float(full[0, 41]), abs=1e-4)]


def test_restrict_output_validates_and_can_be_lifted(model, codec):
    eng = BatchEngine(model, EngineConfig(max_running_requests=2))
    assert eng.sampleable_tokens == VOCAB
    with pytest.raises(ValueError):
        eng.restrict_output([EOS])
    with pytest.raises(ValueError):
        eng.restrict_output([VOCAB])
    eng.restrict_output(codec.roundtrip_ids)
    assert eng.sampleable_tokens == len(codec.roundtrip_ids) + 1
    eng.restrict_output(None)
    assert eng.output_mask is None and eng.sampleable_tokens == VOCAB
