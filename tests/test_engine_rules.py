"""Engine rules and cost model, checked on hand-built cases in both engines."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aprilsim.engine.cost import CostModel, DecodeCost, EngineSpec, TabulatedCost
from aprilsim.engine.families import SGLangFamily
from aprilsim.engine.fast import FastEngine
from aprilsim.engine.reference import ReferenceEngine
from aprilsim.engine.request import Request

COST = CostModel(a=0.005, b=1e-4, c=2e-7, p0=0.01, p1=1e-5, p2=1e-8)
ENGINES = (FastEngine, ReferenceEngine)


def run_all(e) -> list:
    done = []
    while e.t_event < math.inf:
        done += e.advance()
    return done


@pytest.mark.parametrize("cls", ENGINES)
def test_prefill_emits_the_first_token(cls):
    """SGLang samples a token from the prefill forward pass: a one-token request finishes there."""
    e = cls(EngineSpec(COST, kv_capacity=10_000))
    e.submit([Request(0, 300, 10, 1), Request(1, 200, 10, 3)], 0.0)
    first = e.advance()
    t_prefill = COST.prefill_time(500, 300**2 + 200**2)
    assert [(c.rid, c.tokens, c.reason) for c in first] == [(0, 1, "stop")]
    assert math.isclose(first[0].time, t_prefill, rel_tol=1e-12)
    (last,) = run_all(e)
    assert (last.rid, last.tokens) == (1, 3)
    # two decode iterations, batch 1, from the 200 prompt tokens (token 1 has no KV entry yet)
    assert math.isclose(last.time, t_prefill + COST.decode_span(2, 1, 200), rel_tol=1e-12)
    assert e.tokens == 4 and e.stats.iterations == 2


def test_prefill_attention_is_quadratic_per_request():
    """64 prompts of 200 tokens: p2 * 64 * 200^2, not p2 * 12,800^2."""
    e = FastEngine(EngineSpec(COST, kv_capacity=100_000, max_running=64))
    e.submit([Request(i, 200, 10, 5) for i in range(64)], 0.0)
    assert math.isclose(e.t_event, 0.01 + 1e-5 * 12_800 + 1e-8 * 64 * 200**2, rel_tol=1e-12)
    assert COST.prefill_time(200) == pytest.approx(0.01 + 1e-5 * 200 + 1e-8 * 200**2)


@pytest.mark.parametrize("cls", ENGINES)
def test_no_prefill_is_followed_by_a_retraction(cls):
    """new_token_ratio = 0: a request that exactly fills the cache waits instead of being
    prefilled and evicted at the next decode step (before the rule: 1 retraction, 700 tokens
    prefilled twice)."""
    spec = EngineSpec(COST, kv_capacity=1_000, max_running=8, new_token_ratio=0.0)
    e = cls(spec)
    e.submit([Request(0, 300, 100, 100), Request(1, 700, 300, 300)], 0.0)
    done = run_all(e)
    assert e.retractions == 0
    assert e.stats.prefill_tokens == 1_000
    assert sorted((c.rid, c.tokens) for c in done) == [(0, 100), (1, 300)]
    assert e.kv_peak <= 1_000


@pytest.mark.parametrize("cls", ENGINES)
def test_a_lone_request_that_fills_the_cache_runs_to_the_end(cls):
    """input + max_new == kv_capacity: admitted alone, never retracted, peak KV one short of full
    (the last token's KV entry is never written)."""
    e = cls(EngineSpec(COST, kv_capacity=1_000, new_token_ratio=0.0))
    e.submit([Request(0, 400, 600, 600)], 0.0)
    (c,) = run_all(e)
    assert (c.tokens, c.reason) == (600, "length")
    assert e.retractions == 0 and e.kv_peak == 999


def test_new_token_ratio_is_validated():
    with pytest.raises(ValueError):
        EngineSpec(COST, new_token_ratio=1.5)
    with pytest.raises(ValueError):
        EngineSpec(COST, new_token_ratio=-0.1)


# ------------------------------------------------------------------------------ cost models
TABLE = TabulatedCost(
    table_b=(1, 8, 64), table_f=(4e-3, 6e-3, 1.2e-2), table_g=(3e-7, 2e-7, 1e-7), p0=0.01, p1=1e-5
)


def test_tabulated_cost_interpolates_and_holds_its_ends():
    assert TABLE.coefficients(1) == (4e-3, 3e-7)
    f, g = TABLE.coefficients(4)  # 3/7 of the way from B=1 to B=8
    assert f == pytest.approx(4e-3 + 3 / 7 * 2e-3) and g == pytest.approx(3e-7 - 3 / 7 * 1e-7)
    assert TABLE.coefficients(36) == pytest.approx((9e-3, 1.5e-7))
    assert TABLE.coefficients(500) == TABLE.coefficients(64) == (1.2e-2, 1e-7)
    assert TABLE.decode_time(4, 1_000) == pytest.approx(f + g * 1_000)
    assert isinstance(TABLE, DecodeCost) and isinstance(COST, DecodeCost)


def test_three_coefficient_and_tabulated_forms_agree_when_the_table_is_linear():
    bs = (1, 10, 100, 256)
    table = TabulatedCost(bs, tuple(COST.a + COST.b * b for b in bs), (COST.c,) * 4, 0.01, 1e-5, 1e-8)
    for b in (1, 3, 50, 255, 256):
        assert table.decode_span(37, b, 5_000) == pytest.approx(COST.decode_span(37, b, 5_000), rel=1e-12)


@pytest.mark.parametrize(
    "kw",
    [
        dict(table_b=(), table_f=(), table_g=()),
        dict(table_b=(1, 2), table_f=(1e-3,), table_g=(0.0, 0.0)),
        dict(table_b=(2, 2), table_f=(1e-3, 1e-3), table_g=(0.0, 0.0)),
        dict(table_b=(0, 2), table_f=(1e-3, 1e-3), table_g=(0.0, 0.0)),
        dict(table_b=(1, 2), table_f=(0.0, 1e-3), table_g=(0.0, 0.0)),
        dict(table_b=(1, 2), table_f=(1e-3, 1e-3), table_g=(0.0, -1e-9)),
    ],
)
def test_tabulated_cost_rejects_bad_tables(kw):
    with pytest.raises(ValueError):
        TabulatedCost(**kw, p0=0.0, p1=0.0)


@settings(max_examples=60, deadline=None)
@given(
    cost=st.sampled_from([COST, TABLE, CostModel(a=0.01, b=0.0, c=0.0, p0=0.0, p1=0.0)]),
    batch=st.integers(1, 300),
    kv=st.integers(0, 500_000),
    n_max=st.integers(0, 3_000),
    dt=st.floats(0, 100),
)
def test_iterations_within_is_the_largest_that_fits(cost, batch, kv, n_max, dt):
    """Closed-form inversion of decode_span, checked against its definition."""
    m = cost.iterations_within(dt, batch, kv, n_max)
    assert 0 <= m <= n_max
    assert m == 0 or cost.decode_span(m, batch, kv) <= dt
    assert m == n_max or cost.decode_span(m + 1, batch, kv) > dt
    span = sum(cost.decode_time(batch, kv + i * batch) for i in range(min(m, 50)))
    assert span == pytest.approx(cost.decode_span(min(m, 50), batch, kv), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("cls", ENGINES)
def test_tabulated_cost_drives_both_engines(cls):
    """A table that makes small batches slow per request shows in the completion times."""
    e = cls(EngineSpec(TABLE, kv_capacity=10_000))
    e.submit([Request(0, 100, 50, 50)], 0.0)
    (c,) = run_all(e)
    assert math.isclose(c.time, TABLE.prefill_time(100) + TABLE.decode_span(49, 1, 100), rel_tol=1e-12)


# ---------------------------------------------------------------- SGLang's rules (issue 11)
SGL = dict(new_token_ratio=0.7, new_token_ratio_decay_steps=600, clip_max_new_tokens=4096,
           family=SGLangFamily(abort_steps=-1))


def test_ratio_schedule_decays_to_its_floor_and_is_reestimated_after_retraction():
    spec = EngineSpec(COST, **SGL)
    rules = spec.family.rules(spec)
    assert spec.min_new_token_ratio == pytest.approx(0.098)
    assert spec.new_token_ratio_decay == pytest.approx((0.7 - 0.098) / 600)
    assert rules.ratio_at(0.7, 0) == 0.7 == rules.ratio(0)
    assert rules.ratio_at(0.7, 300) == pytest.approx(0.7 - 300 * (0.7 - 0.098) / 600)
    assert rules.ratio(300) == rules.ratio_at(0.7, 300)
    assert rules.ratio_at(0.7, 10_000) == pytest.approx(0.098)
    # SGLang: (decoded + 20 per request) / (sum of max_new_tokens + 1), at most 1
    assert rules.ratio_after_retraction(100, 999, 2) == pytest.approx(140 / 1000)
    assert rules.ratio_after_retraction(5000, 1000, 1) == 1.0
    assert not rules.retracted(50, 100, 999, 2)  # re-estimated, admission not held
    assert rules.ratio(50) == rules.ratio(51) == pytest.approx(0.14)  # the step that retracted
    assert rules.ratio(52) < 0.14  # decays from the next one
    rules.reset(60)
    assert rules.ratio(60) == 0.7
    # decay 0: the constant ratio of older scenarios, and a retraction holds admission
    legacy = EngineSpec(COST, new_token_ratio=0.3)
    held = legacy.family.rules(legacy)
    assert held.ratio_at(0.3, 10_000) == 0.3 and not legacy.sglang_ratio
    assert held.retracted(5, 100, 999, 2) and held.ratio(100) == 0.3


@pytest.mark.parametrize("cls", ENGINES)
def test_a_refused_head_holds_admission_until_a_running_request_leaves(cls):
    """SGLang's `batch_is_full`: the head (max_new 4,500, stops after 10) is refused while
    request 0 runs, and no admission is tried again until a running request leaves, though the
    decaying ratio would admit it after a few hundred steps; a short request finishing in
    between (request 2) releases the hold, and the head is admitted at that boundary."""
    def run(short: bool):
        e = cls(EngineSpec(COST, kv_capacity=6_000, max_running=8, new_token_ratio=0.7,
                           new_token_ratio_decay_steps=600))
        e.submit([Request(0, 100, 4_000, 4_000)] + ([Request(2, 50, 1_000, 500)] if short
                                                    else []), 0.0)
        e.advance()  # prefill of request 0 (and 2)
        e.submit([Request(1, 100, 4_500, 10)], e.t)
        return {c.rid: c for c in run_all(e)}, e

    held, e = run(short=False)
    assert held[1].time > held[0].time  # waited for request 0 to finish
    assert e.stats.iterations > 3_900  # request 0's decode, then request 1's
    released, e = run(short=True)
    assert released[2].time < released[1].time < released[0].time
    assert e.retractions == 0


@pytest.mark.parametrize("cls", ENGINES)
def test_clip_bounds_the_estimate_of_long_requests(cls):
    """A request with max_new 20,000 reserves at most 4,096 in the admission estimate."""
    def first_batch(clip):
        spec = EngineSpec(COST, kv_capacity=30_000, max_running=8, new_token_ratio=1.0,
                          clip_max_new_tokens=clip)
        e = cls(spec)
        e.submit([Request(0, 100, 20_000, 50), Request(1, 100, 12_000, 50)], 0.0)
        return [r.rid for r in e.prefilling()]

    assert first_batch(0) == [0]  # 100 + 12,000 > 30,000 - 100 - 20,000: the second waits
    assert first_batch(4096) == [0, 1]  # 100 + 4,096 <= 30,000 - 100 - 4,096


@pytest.mark.parametrize("cls", ENGINES)
@pytest.mark.parametrize("where", ["head", "tail"])
def test_retracted_requests_reenter_at_the_chosen_end(cls, where):
    """SGLang appends a retracted request to the waiting queue (`_add_request_to_queue`); the
    older rule put it back at the head."""
    spec = EngineSpec(COST, kv_capacity=1_000, max_running=2, new_token_ratio=0.0,
                      new_token_ratio_decay_steps=600, family=SGLangFamily(retract_to=where))
    e = cls(spec)
    # max_running 2 keeps request 2 queued while 0 and 1 grow into a retraction of 1; request 1
    # joins at the next boundary (SGLang counts its whole max_new: 100 + 700 + 1 < 1,000 - 101)
    e.submit([Request(0, 100, 800, 800), Request(1, 100, 700, 700), Request(2, 10, 5, 5)], 0.0)
    while e.retractions == 0:
        e.advance()
    assert [r.rid for r in e.waiting] == ([1, 2] if where == "head" else [2, 1])
    done = run_all(e)
    assert sorted(c.rid for c in done) == [0, 1, 2]


def test_cluster_keys_set_sglang_rules():
    """Each rule is a `[cluster]` key that reaches the engine spec."""
    from aprilsim.config import default_scenario
    from aprilsim.engine.cost import SGLANG_RULES

    sc = default_scenario()
    keys = {k: v for k, v in SGLANG_RULES.items() if k != "family"}
    sc = sc.model_copy(update={"cluster": sc.cluster.model_copy(update=keys)})
    spec = sc.engine_spec()
    assert spec.sglang_ratio and spec.clip_max_new_tokens == 4096
    assert spec.family == SGLANG_RULES["family"] and spec.family.retract_to == "tail"
    assert spec.new_token_ratio == 0.7 and spec.min_new_token_ratio == pytest.approx(0.098)


# ---------------------------------------------------------------- chunked prefill (issue 11)
INT_COST = CostModel(a=1.0, b=0.0, c=0.0, p0=100.0, p1=10.0, p2=1.0)  # integer sums: exact floats


def test_chunked_prefill_time_walks_the_passes():
    """[5, 3] in passes of 4: (100 + 10*4 + 4^2) + (100 + 10*4 + (5^2 - 4^2) + 3^2), and the same
    tokens after 3 tokens of room left open by the previous batch (no p0 for that pass)."""
    from aprilsim.engine.cost import chunked_prefill_time, prefill_passes

    assert chunked_prefill_time(INT_COST, [5, 3], 4) == (156.0 + 158.0, 2, 0)
    # room 3: [r0 0..3] (30 + 9) + [r0 3..5, r1 0..2] (100 + 40 + 16 + 4) + [r1 2..3] (100 + 10 + 5)
    assert chunked_prefill_time(INT_COST, [5, 3], 4, room=3) == (39.0 + 160.0 + 115.0, 2, 3)
    assert prefill_passes(8, 4, 3) == (2, 3) and prefill_passes(8, 4) == (2, 0)
    assert chunked_prefill_time(INT_COST, [2], 4, room=3) == (10 * 2 + 4.0, 0, 1)
    assert prefill_passes(2, 4, 3) == (0, 1)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(1, 5_000), min_size=1, max_size=12),
    st.integers(1, 6_000),
    st.data(),
)
def test_chunked_prefill_telescopes_to_one_p0_per_pass(lens, chunk, data):
    """Pass by pass, the quadratic terms telescope to sum(n_i^2): the walk equals the closed form
    passes*p0 + p1*sum(n_i) + p2*sum(n_i^2), with passes = ceil((sum - room) / chunk)."""
    from aprilsim.engine.cost import chunked_prefill_time, prefill_passes

    room = data.draw(st.integers(0, chunk - 1))
    tokens, sq = sum(lens), sum(n * n for n in lens)
    t, passes, left = chunked_prefill_time(INT_COST, lens, chunk, room)
    assert (passes, left) == prefill_passes(tokens, chunk, room)
    assert passes == max(0, math.ceil((tokens - room) / chunk))
    assert t == INT_COST.prefill_time(tokens, sq, passes)  # exact: integer-valued floats
    for cost in (COST, TABLE):
        t, passes, _ = chunked_prefill_time(cost, lens, chunk, room)
        assert math.isclose(t, cost.prefill_time(tokens, sq, passes), rel_tol=1e-12)


@pytest.mark.parametrize("chunk", [0, -1, 20_000, 7_000])
def test_one_pass_is_the_unchunked_cost_exactly(chunk):
    """Off (0, SGLang's -1) or a chunk no smaller than the batch: the unchunked cost, bit for bit."""
    from aprilsim.engine.cost import chunked_prefill_time, prefill_passes

    lens = [3_000, 2_500, 1_500]
    one = COST.prefill_time(7_000, sum(n * n for n in lens))
    assert chunked_prefill_time(COST, lens, chunk)[:2] == (one, 1)
    assert COST.prefill_time(7_000, sum(n * n for n in lens), prefill_passes(7_000, chunk)[0]) == one


@pytest.mark.parametrize("cls", ENGINES)
@pytest.mark.parametrize("cost", [COST, TABLE])
def test_a_long_prompt_takes_one_p0_per_pass(cls, cost):
    """A 20,000-token prompt in passes of 8,192 (SGLang's H100/H200 default): 3 p0 terms, the
    rest of the prefill cost unchanged; the prompt alone exceeds max_prefill_tokens (16,384)."""
    def finish(chunk):
        e = cls(EngineSpec(cost, kv_capacity=100_000, chunked_prefill_size=chunk))
        e.submit([Request(0, 20_000, 10, 1)], 0.0)
        (c,) = run_all(e)
        return c.time, e

    off, _ = finish(0)
    on, e = finish(8192)
    assert off == cost.prefill_time(20_000)
    assert math.isclose(on, off + 2 * cost.p0, rel_tol=1e-12)
    assert e.stats.prefill_passes == 3 and e.stats.chunked_requests == 1
    assert math.isclose(e.busy_time, on, rel_tol=1e-12)


@pytest.mark.parametrize("cls", ENGINES)
def test_a_chunked_request_continues_first_and_the_pass_admits_the_next(cls):
    """Two 10,000-token prompts, passes of 8,192 (SGLang's per-pass admission): request 0 takes
    pass 1 and 1,808 tokens of pass 2, whose other 6,384 start request 1, which ends in pass 3;
    request 0 emits its token at the end of pass 2. When the KV cache holds only one of them,
    request 1 starts in a pass of its own once request 0 has finished (4 passes)."""
    def run(kv):
        spec = EngineSpec(INT_COST, kv_capacity=kv, chunked_prefill_size=8192,
                          new_token_ratio=0.0)
        e = cls(spec)
        e.submit([Request(0, 10_000, 5, 1), Request(1, 10_000, 5, 1)], 0.0)
        return {c.rid: c.time for c in run_all(e)}, e

    t, e = run(100_000)
    one = INT_COST.prefill_time(10_000)
    pass1 = INT_COST.prefill_time(8192)
    pass2 = INT_COST.prefill_time(8192, 10_000 ** 2 - 8192 ** 2 + 6384 ** 2)
    assert t[0] == pass1 + pass2  # integer-valued floats: exact
    assert t[1] == 2 * one + INT_COST.p0  # three passes in all
    assert (e.stats.prefill_passes, e.stats.chunked_requests, e.stats.chunk_tail_passes) == \
        (3, 2, 1)
    t, e = run(15_000)  # request 1 fits only once request 0 has finished
    assert t[1] == t[0] + one + INT_COST.p0
    assert (e.stats.prefill_passes, e.stats.chunk_tail_passes) == (4, 0)


@pytest.mark.parametrize("cls", ENGINES)
def test_a_pause_mid_chunked_prefill_redoes_the_pass(cls):
    """A pause during the second of three passes: the busy time of that pass so far is lost and
    the pass is redone after the pause (the first pass's tokens are kept)."""
    from aprilsim.engine.cost import pass_ends

    e = cls(EngineSpec(COST, kv_capacity=100_000, chunked_prefill_size=8192))
    e.submit([Request(0, 20_000, 10, 1)], 0.0)
    e1, _, e3 = pass_ends(COST, [20_000], 8192)
    full = COST.prefill_time(20_000, passes=3)
    assert math.isclose(e3, full, rel_tol=1e-12)
    e.pause(0.5 * full, 2.0)
    (c,) = run_all(e)
    assert math.isclose(c.time, 2.0 + full - e1, rel_tol=1e-12)
    assert math.isclose(e.busy_time, 1.5 * full - e1, rel_tol=1e-12)
    assert e.stats.prefill_passes == 3


def test_cluster_key_sets_chunked_prefill():
    """`[cluster] chunked_prefill_size` reaches the engine; -1 (SGLang's "off") and 0 are off."""
    from aprilsim.config import default_scenario
    from aprilsim.engine.cost import PRESETS, SGLANG_RULES

    sc = default_scenario()
    assert sc.engine_spec().prefill_chunk == 8192  # the presets run SGLang's rules
    # SGLang's default by GPU (arg_groups/memory_hook.py): 8192 on H100/H200, 16384 on MI300
    assert all(p.prefill_chunk == (16384 if "mi300" in k else 8192) for k, p in PRESETS.items())
    for value, chunk in ((8192, 8192), (-1, 0), (0, 0)):
        c = sc.cluster.model_copy(update={"chunked_prefill_size": value})
        assert sc.model_copy(update={"cluster": c}).engine_spec().prefill_chunk == chunk
    assert SGLANG_RULES["chunked_prefill_size"] == 8192
    with pytest.raises(ValueError):
        EngineSpec(COST, chunked_prefill_size=-2)


@pytest.mark.parametrize("cls", ENGINES)
def test_an_abort_lands_after_the_prefill_pass_in_flight(cls):
    """`abort_after_steps` with chunked prefill: the step in flight is a pass. During the first
    of three, the abort lands at its end and the request leaves with nothing new (SGLang launches
    no further chunk); during the last, its prefill completes, then k = 1 decode step runs."""
    from aprilsim.engine.cost import pass_ends

    spec = EngineSpec(COST, kv_capacity=100_000, chunked_prefill_size=8192)
    ends = pass_ends(COST, [20_000], 8192)
    assert len(ends) == 3 and math.isclose(ends[0], COST.prefill_time(8192), rel_tol=1e-12)
    e = cls(spec)
    e.submit([Request(0, 20_000, 10, 5)], 0.0)
    t, out = e.abort_after_steps(0.5 * ends[0], 1)
    assert math.isclose(t, ends[0], rel_tol=1e-12) and math.isclose(e.busy_time, t, rel_tol=1e-12)
    assert [(c.rid, c.tokens, c.reason) for c in out] == [(0, 0, "abort")]
    assert e.stats.prefill_passes == 1 and e.is_idle() and e.progress_at(t)[2] == 0
    e = cls(spec)
    e.submit([Request(0, 20_000, 10, 5)], 0.0)
    t, out = e.abort_after_steps(0.5 * (ends[1] + ends[2]), 1)
    full = COST.prefill_time(20_000, passes=3)
    assert math.isclose(t, full + COST.decode_time(1, 20_000), rel_tol=1e-12)
    assert [(c.rid, c.tokens, c.reason) for c in out] == [(0, 2, "abort")]
    assert e.stats.prefill_passes == 3


def _grouped(rid: int, key: int, prompt: int, max_new: int, target: int) -> Request:
    """A fresh sample of group `key` as the runtime submits it with prefix sharing: the prompt
    but its last token is the shared prefix."""
    r = Request(rid, 1, max_new, target)
    r.prefix, r.shared = key, prompt - 1
    return r


@pytest.mark.parametrize("cls", ENGINES)
def test_a_group_prefills_and_holds_its_prompt_once(cls):
    """Prefix sharing: four samples of one 101-token prompt compute 100 + 4 x 1 prefill tokens
    (not 404), hold the prefix once, pay attention over it ((100 + 1)^2 - 100^2 per sample but
    the first), and free it with the last of them; a second group brings its own."""
    e = cls(EngineSpec(COST, kv_capacity=10_000, prefix_sharing=True))
    e.submit([_grouped(i, 7, 101, 10, 3 + i) for i in range(4)], 0.0)
    e.submit([_grouped(9, 8, 51, 10, 2)], 0.0)
    assert e.kv == 100 + 4 + 50 + 1
    (first,) = [c for c in run_all(e) if c.rid == 0]
    sq = 101**2 + 3 * (101**2 - 100**2) + 51**2
    # decode 1: 5 requests over 150 prefix + 5 own tokens; then sample 9 leaves with its
    # prefix (50 + its 2 own), so decode 2 runs 4 requests over 155 + 5 - 52 = 108 tokens
    decodes = COST.decode_time(5, 155) + COST.decode_time(4, 108)
    assert math.isclose(first.time, COST.prefill_time(155, sq) + decodes, rel_tol=1e-12)
    assert e.stats.prefill_tokens == 155 and e.stats.prefix_hits == 3
    assert e.kv == 0 and e.is_idle()
    plain = cls(EngineSpec(COST, kv_capacity=10_000))
    plain.submit([Request(i, 101, 10, 3 + i) for i in range(4)], 0.0)
    run_all(plain)
    assert plain.stats.prefill_tokens == 404


@pytest.mark.parametrize("cls", ENGINES)
def test_a_shared_prefix_stays_while_one_holder_runs(cls):
    """The prefix leaves with its last holder: after the first sample finishes, the second still
    holds it, so a third arriving then is admitted onto it and computes one token."""
    e = cls(EngineSpec(COST, kv_capacity=10_000, prefix_sharing=True))
    e.submit([_grouped(0, 1, 201, 50, 1), _grouped(1, 1, 201, 50, 40)], 0.0)
    done = e.advance()  # the prefill: sample 0 finishes there (one token)
    assert [c.rid for c in done] == [0]
    assert e.kv == 200 + 1  # the prefix + sample 1's prompt token (its first output has no KV)
    e.submit([_grouped(2, 1, 201, 50, 5)], e.t)
    run_all(e)
    assert e.stats.prefill_tokens == 200 + 2 + 1 and e.stats.prefix_hits == 2
    assert e.kv == 0


def test_prefix_sharing_is_a_cluster_key():
    from aprilsim.config import default_scenario

    sc = default_scenario()
    assert not sc.engine_spec().prefix_sharing
    c = sc.cluster.model_copy(update={"prefix_sharing": True, "router": "group_affinity"})
    assert sc.model_copy(update={"cluster": c}).engine_spec().prefix_sharing


@pytest.mark.parametrize("cls", ENGINES)
def test_chunked_prefill_over_a_cached_prefix(cls):
    """Both rules at once: a group of three 301-token prompts with 100-token passes computes
    300 + 1 + 1 + 1 tokens in 4 passes, the later samples attending to the cached 300."""
    from aprilsim.engine.cost import chunked_prefill_time

    e = cls(EngineSpec(COST, kv_capacity=10_000, prefix_sharing=True, chunked_prefill_size=100))
    e.submit([_grouped(i, 3, 301, 10, 1) for i in range(3)], 0.0)
    done = run_all(e)
    assert e.stats.prefill_tokens == 303 and e.stats.prefill_passes == 4
    dur, passes, _ = chunked_prefill_time(COST, [301, 1, 1], 100, 0, [0, 300, 300])
    assert passes == 4 and all(math.isclose(c.time, dur, rel_tol=1e-12) for c in done)
    assert e.stats.chunk_tail_passes == 1 and e.stats.prefix_hits == 2
    assert math.isclose(dur, COST.prefill_time(303, 301**2 + 2 * (301**2 - 300**2), 4),
                        rel_tol=1e-12)


@pytest.mark.parametrize(("chunk", "share"), [(0, False), (40, False), (40, True), (0, True)])
def test_a_per_request_prefill_cost_is_charged_alike_by_both_engines(chunk, share):
    """`pr` (seconds per request of a prefill batch, fitted by calibrate): both engines charge it
    once per request, with chunked prefill and prefix sharing too, and it delays completions by
    about pr x the requests prefilled before them."""
    from dataclasses import replace

    def completions(cost, cls):
        e = cls(EngineSpec(cost, kv_capacity=20_000, max_prefill_tokens=300,
                           chunked_prefill_size=chunk, prefix_sharing=share))
        reqs = [_grouped(i, i % 2, 120, 30, 5 + i) if share else Request(i, 120, 30, 5 + i)
                for i in range(6)]
        e.submit(reqs, 0.0)
        return sorted((c.rid, c.tokens, c.time) for c in run_all(e))

    with_pr = replace(COST, pr=0.05)
    fast, ref = completions(with_pr, FastEngine), completions(with_pr, ReferenceEngine)
    assert [c[:2] for c in fast] == [c[:2] for c in ref]
    assert all(math.isclose(a[2], b[2], rel_tol=1e-9) for a, b in zip(fast, ref))
    plain = completions(COST, FastEngine)
    delays = [a[2] - b[2] for a, b in zip(fast, plain)]
    assert min(delays) >= 0.05 and max(delays) <= 6 * 0.05 + 1e-9
