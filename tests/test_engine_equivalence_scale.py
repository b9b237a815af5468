"""Fast == reference at the scale users run (issue 17): 16k caps, the 4,096 clip, SGLang's decaying
new-token ratio, retraction to the tail, chunked prefill, and a KV cache of 100k-400k tokens that
binds.

The small-KV properties (tests/test_engine_equivalence.py) reach every rule one by one but almost
never the combination that broke: a request far above the clip crossing it while the queue
waits, then retracted and re-admitted. These cases do, and the test asserts it: the shares of
examples where a request crossed the clip with the queue non-empty, where the reserve (not the
room for the input) refused the queue head, where a retracted request was admitted again, where
a prompt longer than the chunk (8,192) was prefilled over several passes, and where a pass that
ended such a request's prefill admitted others (SGLang's per-pass admission). Reach is read from a
probed reference engine (the oracle with counters, nothing else changed). A seeded case
(`SEEDED`) that reaches every one of them runs as an explicit example: whatever hypothesis draws
elsewhere, each case is reached.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

from engine_agreement import close
from hypothesis import event, example, given, settings, target
from hypothesis import strategies as st
from test_engine_equivalence import Case, Driver, _no_mined_constants

from aprilsim.config import default_scenario
from aprilsim.engine.cost import SGLANG_RULES, EngineSpec
from aprilsim.engine.fast import FastEngine
from aprilsim.engine.reference import ReferenceEngine

PRESET = default_scenario().engine_spec()  # the presets' default cost and SGLang's rules
EXAMPLES = 24
REACHED: Counter[str] = Counter()
# measured 0.50-0.67, 0.46-0.83, 0.58-0.83 (two versions of this file's source, which seeds the
# derandomized examples)
MIN_SHARE = {"crossed the clip with the queue waiting": 0.3, "reserve refused the head": 0.3,
             "retracted request re-admitted": 0.3,
             # chunked prefill (SGLang's 8,192-token passes), measured 0.96 and 0.96
             "request prefilled over several passes": 0.4,
             "pass ended a chunked request and began others": 0.3}


class ProbedReference(ReferenceEngine):
    """The reference engine, counting the cases the scale test is for."""

    def __init__(self, spec: EngineSpec, name: int = 0) -> None:
        super().__init__(spec, name)
        self.probe: Counter[str] = Counter()

    def advance(self):
        clip = self.spec.clip_max_new_tokens
        above = [r for r in self.running if r.max_new - r.gen > clip] if self.waiting else []
        done = super().advance()
        self.probe["crossed the clip with the queue waiting"] += sum(
            r.max_new - r.gen <= clip for r in above)
        return done

    def _plan(self) -> None:
        rules, w = self.rules, self.waiting
        if w and not self.hold and len(self.running) < rules.max_running:
            args = (w, len(self.running), self.kv)
            if not rules.admits_head(*args, self.reserve, self.it) \
                    and rules.admits_head(*args, 0, self.it):
                self.probe["reserve refused the head"] += 1
        super()._plan()
        self.probe["retracted request re-admitted"] += sum(r.retractions > 0 for r in self.batch)


class CheckedFast(FastEngine):
    """The fast engine, checking after every event that its clipped reserve equals the sum
    recounted over the running batch (the quantity whose drift once changed admissions)."""

    def advance(self):
        done = super().advance()
        clip = self.spec.clip_max_new_tokens
        brute = sum(min(r.max_new - r.base - self.it, clip) for r in self.running.values())
        assert self._reserve_after(0) == brute, (self._reserve_after(0), brute)
        self.checked = getattr(self, "checked", 0) + 1
        return done


@st.composite
def scale_cases(draw) -> Case:
    """One or two engines of 100k-400k KV tokens under the preset's SGLang rules; requests
    with prompts of 100-4,000 tokens and 16k caps (remainders when they stand for resumed
    samples) and enough of them to fill the cache, lengths long-tailed; a per-request prefill
    cost (`pr`, what `calibrate` fits on CPU engines) or none, arriving in two waves; a few aborts
    and pauses."""
    kv = draw(st.one_of(st.integers(100_000, 160_000), st.integers(100_000, 400_000)))
    cost = draw(st.sampled_from([PRESET.cost, replace(PRESET.cost, pr=2e-3)]))  # pr: per request
    spec = EngineSpec(cost, kv_capacity=kv, max_running=256, max_prefill_tokens=16_384,
                      **{**SGLANG_RULES, "family": replace(SGLANG_RULES["family"], abort_steps=-1)})
    reqs = []
    for rid in range(draw(st.integers(kv // 3_500, kv // 2_500))):  # more than the cache admits
        inp = draw(st.integers(100, 4_000))
        carried = draw(st.sampled_from([0, 0, 0, 2_000, 9_000]))  # a resumed partial's tokens
        max_new = 16_384 - carried
        tgt = draw(st.one_of(st.just(max_new), st.integers(1, max_new),
                             st.integers(1, min(max_new, 6_000))))
        t = draw(st.sampled_from([0.0, 0.0, 0.0, 5.0, 40.0]))
        reqs.append((t, rid, inp + carried, max_new, tgt))
    dur = st.floats(0.05, 3.0)
    timed = draw(st.lists(st.tuples(st.floats(0, 200, allow_nan=False),
                                    st.sampled_from(["abort_late", "pause", "submit"]), dur),
                          max_size=2))
    return Case(spec, draw(st.integers(1, 2)), draw(st.sampled_from(["round_robin",
                                                                     "least_loaded"])),
                sorted(reqs), sorted(timed), [], False)


def seeded_case(seed: int) -> Case:
    """A `scale_cases` case drawn from `random.Random(seed)` (one engine, no aborts): the
    explicit example, independent of what hypothesis draws."""
    rng = random.Random(seed)
    kv = rng.choice([100_000, 130_000, 160_000])
    spec = EngineSpec(PRESET.cost, kv_capacity=kv, max_running=256, max_prefill_tokens=16_384,
                      **{**SGLANG_RULES, "family": replace(SGLANG_RULES["family"], abort_steps=-1)})
    reqs = []
    for rid in range(kv // 3_000):
        inp = rng.randint(100, 4_000)
        carried = rng.choice([0, 0, 0, 2_000, 9_000])
        max_new = 16_384 - carried
        tgt = rng.choice([max_new, rng.randint(1, max_new), rng.randint(1, min(max_new, 6_000))])
        reqs.append((rng.choice([0.0, 0.0, 0.0, 5.0, 40.0]), rid, inp + carried, max_new, tgt))
    return Case(spec, 1, "round_robin", sorted(reqs), [], [], False)


SEEDED = seeded_case(0)  # reaches every case of MIN_SHARE (13 to 28 times each)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True)
@example(SEEDED)
@given(scale_cases())
def _fast_matches_reference_at_scale(case: Case) -> None:
    fd, rd = Driver(CheckedFast, case), Driver(ProbedReference, case)
    fast, ref = fd.run(), rd.run()
    assert [c[:3] for c in fast] == [c[:3] for c in ref]
    for a, b in zip(fast, ref):
        assert close(a[3], b[3]), (a, b)
    for ef, er in zip(fd.engines, rd.engines):
        assert ef.tokens == er.tokens and ef.kv_peak == er.kv_peak
        assert ef.stats == er.stats
        assert close(ef.busy_time, er.busy_time)
    probe = sum((e.probe for e in rd.engines), Counter())
    probe["request prefilled over several passes"] = sum(
        e.stats.chunked_requests for e in rd.engines)
    probe["pass ended a chunked request and began others"] = sum(
        e.stats.chunk_tail_passes for e in rd.engines)
    REACHED["examples"] += 1
    for name in MIN_SHARE:
        if probe[name]:
            event(name)
            REACHED[name] += 1
    target(float(probe["retracted request re-admitted"]), label="re-admissions")


def test_fast_engine_matches_reference_at_users_scale():
    """Every completion (request, tokens, reason, time to 1e-9) and every statistic agree, and the
    examples reach the combination the small-KV properties miss."""
    REACHED.clear()
    with _no_mined_constants():
        _fast_matches_reference_at_scale()
    n = REACHED["examples"]
    shares = {k: REACHED[k] / n for k in MIN_SHARE}
    print("scale examples reached:", {k: round(v, 2) for k, v in shares.items()})
    for name, least in MIN_SHARE.items():
        assert shares[name] >= least, (name, shares)
