"""SGLang's rules object (`families.SGLangRules`, each engine's copy of its spec's numbers) keeps
the spec's numbers, and its two admission questions agree.

Both engines ask the same rules; the fast engine asks `admits_head` first at every plan with a
queue and builds a batch (`select_batch`) only when it says yes, so an empty batch must be
exactly a refused head, whatever the queue, the reserve, the ratio's state and the prefixes held.
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

from aprilsim.engine.cost import SGLANG_RULES, CostModel, EngineSpec
from aprilsim.engine.families import SGLangRules
from aprilsim.engine.request import Request

COST = CostModel(a=0.005, b=1e-4, c=2e-7, p0=0.01, p1=1e-5, p2=1e-8)
EXAMPLES = 300
REACHED: Counter[str] = Counter()


def _attributes(obj: object) -> set[str]:
    """The attributes an object holds: its `__dict__`, or where a compiled (mypyc) class has
    none, the lists mypyc keeps in its place (the class's and its bases')."""
    if hasattr(obj, "__dict__"):
        return set(vars(obj))
    return {a for c in type(obj).__mro__ for a in getattr(c, "__mypyc_attrs__", ())
            if not a.startswith("__")}


# the rules' attributes read from the spec, by the spec's name for them
FROM_SPEC = {"kv_capacity": "kv_capacity", "max_running": "max_running",
             "max_prefill_tokens": "max_prefill_tokens", "clip": "clip_max_new_tokens",
             "sglang_ratio": "sglang_ratio", "new_token_ratio": "new_token_ratio",
             "decay": "new_token_ratio_decay", "min_ratio": "min_new_token_ratio",
             "retract_decode_steps": "retract_decode_steps", "base": "new_token_ratio",
             "refusal_holds": "sglang_ratio",  # SGLang's `batch_is_full` comes with its schedule
             "chunk": "prefill_chunk"}
FROM_FAMILY = {"abort_steps": 1, "cache_block": 1, "to_head": False, "family": "sglang",
               "mixed_steps": False, "fewest_first": True, "it0": 0,
               "per_pass": True}  # chunked prefill (8,192 tokens) planned pass by pass


def test_rules_copy_every_number_the_spec_gives():
    spec = replace(EngineSpec(COST, kv_capacity=50_000), **SGLANG_RULES)
    rules = spec.family.rules(spec)
    assert isinstance(rules, SGLangRules)
    names = _attributes(rules)
    assert names == set(FROM_SPEC) | set(FROM_FAMILY), names ^ (set(FROM_SPEC) | set(FROM_FAMILY))
    for name, field_name in FROM_SPEC.items():
        assert getattr(rules, name) == getattr(spec, field_name), name
    for name, value in FROM_FAMILY.items():
        assert getattr(rules, name) == value, name
    assert rules.sglang_ratio and rules.clip == 4096
    assert rules.ratio(250) == rules.ratio_at(0.7, 250) < 0.7


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
    resident = data.draw(st.sets(st.integers(0, 2)))
    it = data.draw(st.integers(0, 2_000))
    rules = spec.family.rules(spec)
    if data.draw(st.booleans()):  # the ratio's state after a retraction (its re-estimate)
        rules.retracted(data.draw(st.integers(0, it)), data.draw(st.integers(0, 50_000)),
                        data.draw(st.integers(0, 80_000)), data.draw(st.integers(0, 12)))
    REACHED["examples"] += 1
    a = rules.admits_head(deque(reqs), n_running, kv, reserve, it, 0, resident)
    wa = deque(copy.deepcopy(reqs))
    ba = rules.select_batch(wa, n_running, kv, reserve, it, resident)
    assert [r.rid for r in ba[0]] + [r.rid for r in wa] == [r.rid for r in reqs]  # popped in order
    assert bool(ba[0]) == a  # an empty batch is exactly a refused head (the fast engine's test)
    if len(ba[0]) > 1:  # the budget holds: the batch's tokens stay within max_prefill_tokens
        assert ba[1] <= spec.max_prefill_tokens
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


def test_admission_answers_alike_head_first_and_batch():
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
