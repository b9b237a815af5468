"""`AdmissionRules` (the fast engine's copy of a spec's numbers) gives the spec's answers.

The fast engine passes `AdmissionRules(spec)` to the admission functions, the reference engine
its `EngineSpec`: the same rules must come out of both, refusals and batches alike.
"""

from __future__ import annotations

import copy
import copyreg
from collections import Counter, deque
from contextlib import contextmanager
from dataclasses import fields, replace

from hypothesis import event, given, settings, target
from hypothesis import strategies as st
from test_engine_equivalence import _no_mined_constants

from aprilsim.engine.admission import AdmissionRules, can_admit_head, ratio_at, select_prefill_batch
from aprilsim.engine.cost import SGLANG_RULES, CostModel, EngineSpec
from aprilsim.engine.request import Request

COST = CostModel(a=0.005, b=1e-4, c=2e-7, p0=0.01, p1=1e-5, p2=1e-8)
EXAMPLES = 300
REACHED: Counter[str] = Counter()


def _attributes(cls: type) -> tuple[str, ...]:
    """The attributes a slotted class declares: its `__slots__`, or where a compiled (mypyc)
    class drops them, the list mypyc keeps in their place."""
    return getattr(cls, "__slots__", None) or cls.__mypyc_attrs__  # type: ignore[attr-defined]


def test_rules_copy_every_number_the_spec_gives():
    spec = replace(EngineSpec(COST, kv_capacity=50_000), **SGLANG_RULES)
    rules = AdmissionRules(spec)
    names = _attributes(AdmissionRules)
    assert "kv_capacity" in names, names
    for name in names:
        assert getattr(rules, name) == getattr(spec, name), name
    assert rules.sglang_ratio and rules.clip_max_new_tokens == 4096
    assert ratio_at(rules, 0.7, 250) == ratio_at(spec, 0.7, 250) < 0.7


specs = st.builds(
    lambda kv, running, budget, sglang, clip: replace(
        EngineSpec(COST, kv_capacity=kv, max_running=running, max_prefill_tokens=budget),
        **{**(SGLANG_RULES if sglang else {}), "clip_max_new_tokens": clip}),
    st.integers(2_000, 20_000), st.integers(1, 12), st.integers(200, 8_000), st.booleans(),
    st.sampled_from([0, 64, 4096]),
)


@st.composite
def queues(draw, spec: EngineSpec):
    n = draw(st.integers(1, 10))
    out = []
    for rid in range(n):
        max_new = draw(st.integers(1, spec.kv_capacity // 4))
        inp = draw(st.integers(1, spec.kv_capacity // 4))
        gen = draw(st.integers(0, max_new - 1))
        shared = draw(st.sampled_from([0, 0, 50]))
        r = Request(rid, inp, max_new, max_new, gen=gen)
        if shared:
            r.prefix, r.shared = draw(st.integers(0, 2)), shared
        out.append(r)
    return out


def _request_from(values: tuple) -> Request:
    """The request whose fields, in declaration order, are `values` (deep-copied by then)."""
    r = Request(*values[:4])
    for f, v in zip(fields(Request), values, strict=True):
        setattr(r, f.name, v)
    return r


@contextmanager
def _requests_copied_by_fields():
    """`copy.deepcopy` of a `Request` rebuilds it from its fields: by default it calls the class
    without arguments, which a compiled (mypyc) `Request` refuses. The property keeps its own
    source (Hypothesis seeds its examples from it), so the copy is taught here."""
    table = copyreg.dispatch_table
    before = table.get(Request)
    table[Request] = lambda r: (_request_from, (tuple(getattr(r, f.name) for f in fields(r)),))
    try:
        yield
    finally:
        if before is None:
            del table[Request]
        else:
            table[Request] = before


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True)
@given(data=st.data(), spec=specs)
def _same_answers(data, spec):
    reqs = data.draw(queues(spec))
    n_running = data.draw(st.integers(0, spec.max_running))
    kv = data.draw(st.integers(0, spec.kv_capacity))
    reserve = data.draw(st.integers(0, 4 * spec.kv_capacity))
    ratio = data.draw(st.floats(0.0, 1.0))
    resident = data.draw(st.sets(st.integers(0, 2)))
    rules = AdmissionRules(spec)
    REACHED["examples"] += 1
    a = can_admit_head(spec, deque(reqs), n_running, kv, reserve, ratio, 0, resident)
    assert a == can_admit_head(rules, deque(reqs), n_running, kv, reserve, ratio, 0, resident)
    wa, wb = deque(copy.deepcopy(reqs)), deque(copy.deepcopy(reqs))
    ba = select_prefill_batch(spec, wa, n_running, kv, reserve, ratio, resident)
    bb = select_prefill_batch(rules, wb, n_running, kv, reserve, ratio, resident)
    assert [r.rid for r in ba[0]] == [r.rid for r in bb[0]] and ba[1:] == bb[1:]
    assert [r.rid for r in wa] == [r.rid for r in wb]
    assert bool(ba[0]) == a  # an empty batch is exactly a refused head (the fast engine's test)
    case = "admitted" if a else "refused"
    event(case)
    REACHED[case] += 1
    target(float(len(ba[0])), label="batch size")
    if len(ba[0]) > 1:
        REACHED["several in a batch"] += 1
    if ba[5]:
        REACHED["token budget ended it"] += 1
    if spec.sglang_ratio and spec.clip_max_new_tokens:
        REACHED["sglang rules with a clip"] += 1


def test_admission_answers_alike_from_the_spec_and_its_rules():
    REACHED.clear()
    with _no_mined_constants(), _requests_copied_by_fields():
        _same_answers()
    n = REACHED["examples"]
    assert n >= EXAMPLES // 2, REACHED
    shares = {k: REACHED[k] / n for k in REACHED if k != "examples"}
    print("admission-rules examples reached:", {k: round(v, 2) for k, v in sorted(shares.items())})
    for name in ("admitted", "refused", "several in a batch", "token budget ended it",
                 "sglang rules with a clip"):
        assert shares.get(name, 0.0) >= 0.05, (name, shares)
