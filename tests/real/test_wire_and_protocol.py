"""Pure parts of real/: request ids, stream reassembly, error parsing, requests from samples."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from aprilsim.types import FinishReason, Sample
from real.clients.sglang_wire import (
    RidFactory,
    StreamAccumulator,
    parse_chunk,
    parse_error_body,
    parse_finish_reason,
)
from real.protocol import GenerateRequest, replay_finish_reason
from real.samples import request_from_sample


@settings(max_examples=50, deadline=None)  # timing on a loaded CI box is not the property
@given(n=st.integers(2, 300),
       sessions=st.lists(st.text(max_size=20), min_size=1, max_size=3, unique=True))
def test_request_ids_are_never_prefixes_of_each_other(n, sessions):
    rids = [f() for f in (RidFactory(s) for s in sessions) for _ in range(n)]
    rids += [RidFactory()() for _ in range(5)]
    assert len(set(rids)) == len(rids)
    for a in rids:
        assert sum(b.startswith(a) for b in rids) == 1


def _chunks(ids: list[int], cuts: list[int], incremental: bool, queued_repeat: bool) -> list[dict]:
    """Encode ``ids`` as a stream cut at ``cuts``, the SGLang way."""
    bounds = sorted({c for c in cuts if 0 < c < len(ids)} | {len(ids)})
    out, prev = [], 0
    for i, b in enumerate(bounds):
        last = i == len(bounds) - 1
        part = ids[prev:b] if incremental else ids[:b]
        meta = {"completion_tokens": b,
                "finish_reason": {"type": "length", "length": b} if last else None}
        out.append({"output_ids": part, "meta_info": meta})
        prev = b
    if queued_repeat and incremental and ids:
        # SGLang's abort path in incremental mode repeats the last id in a final chunk.
        out[-1]["meta_info"]["finish_reason"] = None
        out.append({"output_ids": ids[-1:], "meta_info": {
            "completion_tokens": len(ids), "finish_reason": {"type": "abort"}}})
    return out


@settings(max_examples=300, deadline=None)
@given(ids=st.lists(st.integers(0, 9), min_size=1, max_size=40),
       cuts=st.lists(st.integers(0, 40), max_size=10),
       incremental=st.booleans(), told=st.sampled_from([None, "right"]),
       queued_repeat=st.booleans())
def test_stream_accumulator_rebuilds_output(ids, cuts, incremental, told, queued_repeat):
    """Cumulative or incremental, told or inferred from completion_tokens: the same ids."""
    acc = StreamAccumulator(incremental if told == "right" else None)
    streamed = []
    for c in _chunks(ids, cuts, incremental, queued_repeat):
        streamed += acc.feed(parse_chunk(c))
    assert acc.ids == ids
    assert streamed == ids


def test_error_bodies_in_every_shape():
    assert parse_error_body(400,
                            b'{"object":"error","message":"bad","code":400}') == "HTTP 400: bad"
    assert parse_error_body(400, b'{"error":"contract broken"}') == "HTTP 400: contract broken"
    assert parse_error_body(503, b'{"error":{"message":"overloaded","code":503}}') == (
        "HTTP 503: overloaded")
    assert parse_error_body(422, b'{"detail":[{"msg":"x"}]}') == 'HTTP 422: [{"msg": "x"}]'
    assert parse_error_body(502, b"Bad Gateway") == "HTTP 502: Bad Gateway"
    assert parse_error_body(500, b"") == "HTTP 500: <empty body>"


def test_finish_reasons():
    assert parse_finish_reason(None) is None
    assert parse_finish_reason({"type": "stop", "matched": 2}).reason is FinishReason.STOP
    assert parse_finish_reason({"type": "length", "length": 9}).reason is FinishReason.LENGTH
    ab = parse_finish_reason({"type": "abort", "message": "Abort in waiting queue"})
    assert ab.reason is FinishReason.ABORT and ab.message == "Abort in waiting queue"
    assert parse_finish_reason("length").reason is FinishReason.LENGTH
    assert parse_finish_reason({"type": "weird"}).reason is FinishReason.ABORT


def test_replay_finish_reason_maps_length_to_stop_below_the_cap():
    req = GenerateRequest((1,), max_new_tokens=100, replay_len=30)
    assert replay_finish_reason(req, 30, FinishReason.LENGTH) is FinishReason.STOP
    capped = GenerateRequest((1,), max_new_tokens=30, replay_len=30)
    assert replay_finish_reason(capped, 30, FinishReason.LENGTH) is FinishReason.LENGTH
    assert replay_finish_reason(req, 10, FinishReason.ABORT) is FinishReason.ABORT


def _sample(uid=3, group=7, generated=0):
    s = Sample(uid=uid, group_id=group, index=0, prompt_len=12, _target_len=50, max_len=80,
               _reward=1.0)
    s.generated = generated
    return s


def test_request_from_sample_fresh_and_resumed():
    a, b = _sample(uid=1), _sample(uid=2)
    ra, rb = request_from_sample(a, 256), request_from_sample(b, 256)
    assert ra.prompt_ids == rb.prompt_ids and len(ra.prompt_ids) == 12  # one group, one prompt
    assert request_from_sample(a, 256) == ra  # deterministic
    assert ra.replay_len == 50 and ra.max_new_tokens == 80 and ra.tag == 1
    assert all(16 <= t < 256 for t in ra.prompt_ids)
    other = request_from_sample(_sample(group=8), 256)
    assert other.prompt_ids != ra.prompt_ids
    resumed = request_from_sample(_sample(generated=20), 256,
                                  partial_output_ids=list(range(20, 40)))
    assert resumed.prompt_ids == ra.prompt_ids + tuple(range(20, 40))
    assert resumed.replay_len == 30 and resumed.max_new_tokens == 60
    synthetic = request_from_sample(_sample(generated=20), 256)
    assert len(synthetic.prompt_ids) == 32


def test_request_from_sample_rejects_inconsistent_partial():
    import pytest

    with pytest.raises(ValueError):
        request_from_sample(_sample(generated=5), 256, partial_output_ids=[1, 2])
