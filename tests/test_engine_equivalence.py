"""The fast engine reproduces the per-iteration reference engine exactly (DESIGN invariant 4).

Both engines are driven through the same sequence of outside calls (submits at random times,
submits triggered by completions, aborts, pauses); their completions must agree in request,
token count and reason, and in time to float tolerance. A tight KV cache forces retractions.
"""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from aprilsim.engine.cost import CostModel, EngineSpec
from aprilsim.engine.fast import FastEngine
from aprilsim.engine.reference import ReferenceEngine
from aprilsim.engine.request import Request

COST = CostModel(a=0.005, b=1e-4, c=2e-7, p0=0.01, p1=1e-5, p2=1e-10)


@st.composite
def workloads(draw):
    kv = draw(st.integers(3_000, 20_000))
    spec = EngineSpec(
        COST,
        kv_capacity=kv,
        max_running=draw(st.integers(1, 16)),
        new_token_ratio=draw(st.sampled_from([0.0, 0.05, 0.3, 1.0])),
        max_prefill_tokens=draw(st.integers(200, 4_000)),
    )
    n = draw(st.integers(1, 25))
    reqs = []
    for rid in range(n):
        inp = draw(st.integers(1, 600))
        max_new = draw(st.integers(1, min(2_000, kv - inp)))
        target = draw(st.integers(1, max_new))
        t = draw(st.floats(0, 10, allow_nan=False))
        reqs.append((t, rid, inp, max_new, target))
    outside = draw(
        st.lists(
            st.tuples(st.floats(0, 40, allow_nan=False), st.sampled_from(["abort", "pause"])),
            max_size=3,
        )
    )
    resubmit = draw(st.booleans())  # finished requests trigger a new one at once
    return spec, sorted(reqs), sorted(outside), resubmit


def drive(engine_cls, spec, reqs, outside, resubmit):
    """Run one engine; return its completions and statistics."""
    e = engine_cls(spec)
    events = [(t, "submit", r) for t, *r in reqs] + [(t, kind, None) for t, kind in outside]
    events.sort(key=lambda x: (x[0], x[1]))
    out = []
    next_rid = 10_000
    i = 0
    while i < len(events) or e.t_event < math.inf:
        t_next = events[i][0] if i < len(events) else math.inf
        if e.t_event <= t_next:
            done = e.advance()
            out += done
            firsts = sorted((c for c in done if c.rid < 10_000), key=lambda c: c.rid)
            if resubmit and firsts:
                now = firsts[0].time
                follow = [Request(next_rid + k, 50, 300, 1 + (c.rid % 250)) for k, c in enumerate(firsts)]
                next_rid += len(firsts)
                e.submit(follow, now)
            continue
        t, kind, r = events[i]
        i += 1
        if kind == "submit":
            e.submit([Request(*r)], t)
        elif kind == "abort":
            out += e.abort_all(t)
        else:
            out += e.pause(t, t + 1.5)
    key = sorted((c.rid, c.tokens, c.reason, c.time) for c in out)
    return key, e


@settings(max_examples=150, deadline=None)
@given(workloads())
def test_fast_engine_matches_reference(case):
    spec, reqs, outside, resubmit = case
    fast, ef = drive(FastEngine, spec, reqs, outside, resubmit)
    ref, er = drive(ReferenceEngine, spec, reqs, outside, resubmit)
    assert [c[:3] for c in fast] == [c[:3] for c in ref]
    for a, b in zip(fast, ref):
        assert math.isclose(a[3], b[3], rel_tol=1e-9, abs_tol=1e-9), (a, b)
    assert ef.tokens == er.tokens
    assert ef.retractions == er.retractions
    assert ef.kv_peak == er.kv_peak <= spec.kv_capacity
    assert ef.prefill_tokens == er.prefill_tokens
    assert math.isclose(ef.busy_time, er.busy_time, rel_tol=1e-9, abs_tol=1e-9)


def test_retraction_happens_and_evicts_fewest_generated():
    """A KV cache that fits the prompts but not the growth forces SGLang-style retraction."""
    spec = EngineSpec(COST, kv_capacity=1_000, max_running=8, new_token_ratio=0.0)
    e = FastEngine(spec)
    e.submit([Request(0, 100, 800, 800), Request(1, 100, 800, 800)], 0.0)
    done = []
    while e.t_event < math.inf:
        done += e.advance()
    assert e.retractions >= 1
    assert sorted((c.rid, c.tokens, c.reason) for c in done) == [(0, 800, "length"), (1, 800, "length")]
    # request 1 (the later rid, tied on tokens) was the one evicted, so it finishes last
    assert max(done, key=lambda c: c.time).rid == 1


def test_decode_time_is_the_closed_form():
    """n iterations from KV K0 with batch B take n(a + bB + cK0) + cB n(n-1)/2."""
    spec = EngineSpec(COST, kv_capacity=100_000, max_running=8)
    e = FastEngine(spec)
    e.submit([Request(0, 1_000, 500, 500)], 0.0)
    assert e.advance() == []  # the prefill batch
    (done,) = e.advance()  # one jump to the finish
    expected = COST.prefill_time(1_000) + COST.decode_span(500, 1, 1_000)
    assert done.tokens == 500 and math.isclose(done.time, expected, rel_tol=1e-12)
    assert e.iterations == 500 and e.t_event == math.inf


def test_abort_returns_partial_tokens_and_queued_requests():
    spec = EngineSpec(COST, kv_capacity=10_000, max_running=1)
    e = FastEngine(spec)
    e.submit([Request(0, 100, 1_000, 1_000), Request(1, 100, 1_000, 1_000)], 0.0)
    e.advance()  # prefill of request 0 (max_running=1 keeps request 1 queued)
    t_mid = e.t + COST.decode_span(100, 1, 100) + 1e-9
    out = {c.rid: c for c in e.abort_all(t_mid)}
    assert out[0].reason == "abort" and out[0].tokens == 100
    assert out[1].reason == "abort" and out[1].tokens == 0
    assert e.load == 0 and e.t_event == math.inf
