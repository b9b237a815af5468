"""The fast engine reproduces the per-iteration reference engine exactly (DESIGN invariant 4).

A small cluster (1-3 engines behind a router) of each kind is driven through the same outside
calls: submits at random times, follow-up submits triggered by completions, aborts, pauses and
interrupting weight updates (abort everything, `block_until` the sync ends, resubmit the partial
outputs), aborts that land after the step in flight and k more decode steps (`abort_after_steps`), placed either at random times or just after a completion, when engines are busy. The
KV cache holds 500-3,000 tokens, so running batches outgrow it and retract. Completions must agree
in request, token count and reason, and in time to 1e-9; so must the engines' statistics.

The test also measures what it reached (`hypothesis.event`, `target`, and a final assertion on
the shares of examples that retracted, aborted requests with partial output and paused busy
engines): a strategy that drifts away from the hard cases fails it. A second property runs the
same with chunked prefill, on bursts of requests and small chunks so that requests span several
passes, a pass that ends one begins others, and prefills are paused or aborted mid-way.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from engine_agreement import assert_engines_agree
from hypothesis import event, example, given, settings, target
from hypothesis import strategies as st

from aprilsim.engine.cost import CostModel, EngineSpec, TabulatedCost
from aprilsim.engine.families import SIMPLE
from aprilsim.engine.fast import PREFILL, FastEngine
from aprilsim.engine.reference import ReferenceEngine
from aprilsim.engine.request import Request
from aprilsim.engine.router import make_router

COST = CostModel(a=0.005, b=1e-4, c=2e-7, p0=0.01, p1=1e-5, p2=1e-8)
FOLLOW = 10_000  # rids from here on are follow-ups and resubmissions
EXAMPLES = 160

# what the examples reached, counted by the property test and checked by the test that runs it
REACHED: Counter[str] = Counter()
# the least share of examples that must reach each case (measured over 14 hypothesis seeds at 160
# examples: retracted 0.43-0.63, partial abort 0.49-0.93, busy pause 0.49-0.96; the others 0.12+;
# with SGLang's rules drawn (issue 11): ratio re-estimated 0.59, requeued at the tail 0.55,
# clipped estimate 0.11, span cut where the decaying ratio may admit 0.11)
MIN_SHARE = {"retracted": 0.25, "aborted with partial output": 0.25, "paused a busy engine": 0.25}
MIN_SHARE_OTHER = 0.005  # at least one example of each other case (observed 1-95 % across runs)
MIN_SHARE_RARE: dict[str, float] = {}  # span cuts: reached in 0-1 % of examples here; covered deterministically in tests/test_engine_rules.py (admitted mid-decode)
# the chunked-prefill property: its own examples and least shares (SGLang's per-pass admission,
# the derandomized run with its targets and explicit examples, no mined constants: request over
# several passes 0.78, pass that ended one and began others 0.75, interrupted a prefill 0.90, abort
# took a chunked request 0.03, retracted 0.08; before it, with whole batches split into passes,
# 6 hypothesis seeds gave 0.67-0.92 several passes and 0.65-0.84 interrupted)
CHUNK_EXAMPLES = 100
REACHED_CHUNKED: Counter[str] = Counter()
MIN_SHARE_CHUNKED = {
    "request prefilled over several passes": 0.5,
    "pass ended a chunked request and began others": 0.2,
    "interrupted a prefill": 0.3,
}


@contextmanager
def no_mined_constants() -> Iterator[None]:
    """Hypothesis (6.131+) seeds some draws with literals mined from every loaded local module,
    so which test files were imported or ran before (and any edit to aprilsim's source) changes
    a derandomized property's examples, hence the reach shares measured on them: a case reached
    alone could vanish in the full suite. Pin that pool empty while a reach-measuring property
    runs (a private hook: without it, nothing to pin)."""
    try:
        from hypothesis.internal.conjecture import providers
        from hypothesis.internal.constants_ast import Constants
    except ImportError:
        yield
        return
    get, cache = getattr(providers, "_get_local_constants", None), getattr(providers, "CONSTANTS_CACHE", None)
    if get is None or cache is None:
        yield
        return
    empty = Constants()
    providers._get_local_constants = lambda: empty
    providers.CONSTANTS_CACHE = type(cache)(1024)
    try:
        yield
    finally:
        providers._get_local_constants, providers.CONSTANTS_CACHE = get, cache


_no_mined_constants = no_mined_constants  # the name this file's properties use


@dataclass
class Case:
    spec: EngineSpec
    engines: int
    router: str
    reqs: list[tuple[float, int, int, int, int]]  # (time, rid, input_len, max_new, target_new)
    timed: list[tuple[float, str, float]]  # (time, kind, duration)
    after: list[tuple[int, float, str, float]]  # (k-th completion, delay, kind, duration)
    follow: bool  # a finished original request triggers a new one at once
    prefixes: dict[int, tuple[int, int]] = field(default_factory=dict)  # rid -> (key, shared)
    priorities: dict[int, int] = field(default_factory=dict)  # rid -> admission priority
    migrated: dict[int, int] = field(default_factory=dict)  # rid -> input tokens with migrated KV


costs = st.one_of(
    st.just(COST),
    st.builds(
        lambda pts, p2: TabulatedCost(
            table_b=tuple(b for b, _, _ in pts),
            table_f=tuple(f for _, f, _ in pts),
            table_g=tuple(g for _, _, g in pts),
            p0=0.01,
            p1=1e-5,
            p2=p2,
        ),
        st.lists(
            st.tuples(st.integers(1, 40), st.floats(1e-3, 2e-2), st.floats(0, 1e-6)),
            min_size=1,
            max_size=4,
            unique_by=lambda x: x[0],
        ).map(sorted),
        st.sampled_from([0.0, 1e-8]),
    ),
)

kinds = st.sampled_from(["submit", "abort", "pause", "update", "abort_late"])


@st.composite
def cases(draw, chunked: bool = False, shared: bool = False, prioritized: bool = False) -> Case:
    """A case; `chunked`: chunked prefill on, small prefill budgets, requests arriving in bursts;
    `shared`: prefix sharing on, requests in groups sharing a prefix, the group-affinity router
    drawn too (without either, the draws are those of the property before they existed)."""
    kv = draw(st.integers(500, 3_000))
    spec = EngineSpec(
        draw(costs),
        kv_capacity=kv,
        max_running=draw(st.integers(1, 32)),
        new_token_ratio=draw(st.sampled_from([0.0, 0.05, 0.3, 0.7, 1.0])),
        max_prefill_tokens=draw(st.integers(30, 600) if chunked else st.integers(50, 3_000)),
        # SGLang's rules (0 decay steps: the older constant ratio with admission held), picked
        # by the KV size so that hypothesis's preferences and targets cannot starve them
        new_token_ratio_decay_steps=(600, 40, 3, 600, 0)[kv % 5],
        min_new_token_ratio_factor=draw(st.sampled_from([0.14, 0.0, 0.6])),
        retract_decode_steps=draw(st.sampled_from([20, 0, 200])),
        clip_max_new_tokens=(400, 60, 0)[kv // 5 % 3],
        family=replace(SIMPLE, retract_to=("head", "tail")[kv // 15 % 2]),
        chunked_prefill_size=(draw(st.sampled_from([16, 40, 150, 400])) if chunked
                              else draw(st.sampled_from([0, 0, 24, 150])) if shared or prioritized
                              else 0),
        prefix_sharing=shared,
    )
    n_groups = draw(st.integers(1, 4)) if shared else 0
    plens = [draw(st.integers(1, 200)) for _ in range(n_groups)]
    prefixes: dict[int, tuple[int, int]] = {}
    arrival = st.sampled_from([0.0, 0.0, 0.4, 1.5]) if chunked else st.floats(0, 3, allow_nan=False)
    reqs = []
    for rid in range(draw(st.integers(2, 24))):
        inp = draw(st.integers(1, 300))
        if shared:
            key = rid % n_groups
            prefixes[rid] = (key, plens[key])
            inp = min(inp, 100)
        max_new = draw(st.integers(1, min(1_500, kv - inp - (plens[rid % n_groups] if shared else 0))))
        tgt = draw(st.one_of(st.just(max_new), st.just(1), st.integers(1, max_new)))
        reqs.append((draw(arrival), rid, inp, max_new, tgt))
    dur = st.floats(0.05, 2.0)
    timed = draw(st.lists(st.tuples(st.floats(0, 15, allow_nan=False), kinds, dur), max_size=3))
    # one pause and one abort or weight update just after early completions (engines are busy
    # then), and up to two more calls of any kind
    after = [
        (draw(st.integers(1, 4)), draw(st.floats(0, 0.2)), "pause", draw(dur)),
        (draw(st.integers(1, 6)), draw(st.floats(0, 0.2)), draw(st.sampled_from(["abort", "update", "abort_late"])), draw(dur)),
    ]
    after += draw(st.lists(st.tuples(st.integers(1, 12), st.floats(0, 0.3), kinds, dur), max_size=2))
    routers = ["round_robin", "least_loaded", "group_affinity"] if shared else ["round_robin", "least_loaded"]
    priorities = {rid: draw(st.sampled_from([0, 0, 1, 3, -2])) for _, rid, *_ in reqs} \
        if prioritized else {}
    migrated = {rid: m for _, rid, inp, *_ in reqs
                if (m := draw(st.sampled_from([0, 0, inp - 1, inp // 2]))) > 0} \
        if prioritized else {}
    return Case(
        spec,
        draw(st.integers(1, 3)),
        draw(st.sampled_from(routers)),
        sorted(reqs),
        sorted(timed),
        after,
        draw(st.booleans()),
        prefixes,
        priorities,
        migrated,
    )


class Driver:
    """Runs one cluster of `engine_cls` engines through a case; records completions and what the
    outside calls hit (busy engines, partial outputs)."""

    def __init__(self, engine_cls, case: Case) -> None:
        self.case = case
        self.engines = [engine_cls(case.spec, i) for i in range(case.engines)]
        self.router = make_router(case.router)
        self.out: list = []
        self.reqs: dict[int, tuple[int, int, int]] = {}  # rid -> (input_len, max_new, target)
        self.next_rid = FOLLOW
        self.hits: Counter[str] = Counter()
        self.prefix_of: dict[int, tuple[int, int]] = {}
        self.priority_of: dict[int, int] = {}
        self.jumps = 0  # requests queued ahead of lower-priority waiting ones (not compared)

    def submit(self, reqs: list[Request], now: float) -> None:
        for r in reqs:
            self.reqs[r.rid] = (r.input_len, r.max_new, r.target_new)
            self.prefix_of[r.rid] = (r.prefix, r.shared)
            self.priority_of[r.rid] = r.priority
            i = self.router.pick([e.load for e in self.engines], r.prefix if r.shared else None)
            w = self.engines[i].waiting
            self.jumps += bool(w) and w[-1].priority < r.priority
            self.engines[i].submit([r], now)

    def new_rid(self) -> int:
        self.next_rid += 1
        return self.next_rid

    def outside(self, now: float, kind: str, dur: float) -> None:
        es = self.engines
        if kind == "submit":
            self.submit([Request(self.new_rid(), 40, 400, 1 + int(dur * 100))], now)
            return
        self.hits["interrupted a prefill"] += sum(e.phase == PREFILL for e in es)
        if kind == "pause":
            self.hits["paused a busy engine"] += sum(not e.is_idle() for e in es)
            for e in es:
                self.out += e.pause(now, now + dur)
            return
        if kind == "abort_late":  # lands after the step in flight and k more decode steps
            k = int(dur * 5) % 9  # 0-8: long enough, often, for a request to finish meanwhile
            finished_before = sum(e.stats.abort_finishes for e in es)
            for e in es:
                busy = not e.is_idle()
                t_land, got = e.abort_after_steps(now, k)
                self.out += got
                self.hits["abort landed after a step in flight"] += busy and t_land > now
                self.hits["aborted with partial output"] += sum(
                    c.tokens > 0 and c.reason == "abort" for c in got)
            self.hits["finished while an abort landed"] += (
                sum(e.stats.abort_finishes for e in es) > finished_before)
            return
        aborted = [c for e in es for c in e.abort_all(now)]
        self.out += aborted
        partial = [c for c in aborted if c.tokens > 0]
        self.hits["aborted with partial output"] += len(partial)
        if kind == "update":  # interrupting weight update: flush, sync, resubmit the partials
            self.hits["interrupting update"] += 1
            for e in es:
                e.block_until(now + dur)
            resub = []
            for c in partial:
                inp, max_new, tgt = self.reqs[c.rid]
                r = Request(self.new_rid(), inp + c.tokens, max_new - c.tokens, tgt - c.tokens)
                r.prefix, r.shared = self.prefix_of[c.rid]  # a resumed sample keeps its prefix
                r.priority = self.priority_of[c.rid]  # and its priority
                if self.case.priorities and r.rid % 2 and r.input_len > 1:
                    r.migrated = r.input_len - 1  # its KV moved along (Seer's migration)
                resub.append(r)
            self.submit(resub, now)

    def run(self) -> list[tuple[int, int, str, float]]:
        case = self.case
        calls = [(t, 0, "submit", r) for t, *r in case.reqs]
        calls += [(t, 1, kind, d) for t, kind, d in case.timed]
        calls.sort(key=lambda x: (x[0], x[1]))
        after = sorted(case.after)
        n_done, i = 0, 0
        es = self.engines
        while True:
            e = min(es, key=lambda e: e.t_event)
            t_call = calls[i][0] if i < len(calls) else math.inf
            if e.t_event == math.inf and t_call == math.inf:
                break
            if e.t_event <= t_call:
                done = sorted(e.advance(), key=lambda c: c.rid)
                self.out += done
                for c in done:
                    n_done += 1
                    while after and after[0][0] == n_done:
                        _, delay, kind, d = after.pop(0)
                        calls.insert(i, (c.time + delay, 2, kind, d))
                        calls[i:] = sorted(calls[i:], key=lambda x: (x[0], x[1]))
                originals = [c for c in done if c.rid < FOLLOW]
                if case.follow and originals:
                    now = originals[0].time
                    follow = [Request(self.new_rid(), 50, 300, 1 + c.rid % 250,
                                      priority=case.priorities.get(c.rid, 0)) for c in originals]
                    self.submit(follow, now)
                continue
            t, _, kind, payload = calls[i]
            i += 1
            if kind == "submit" and isinstance(payload, list):
                r = Request(*payload)
                if r.rid in case.prefixes:
                    r.prefix, r.shared = case.prefixes[r.rid]
                r.priority = case.priorities.get(r.rid, 0)
                r.migrated = case.migrated.get(r.rid, 0)
                self.submit([r], t)
            else:
                self.outside(t, kind, payload)
        return sorted((c.rid, c.tokens, c.reason, c.time) for c in self.out)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True)  # reach shares are asserted: same examples every run
@given(cases())
def _fast_matches_reference(case: Case) -> None:
    fd, rd = Driver(FastEngine, case), Driver(ReferenceEngine, case)
    fast, _ = assert_engines_agree(fd, rd, case.spec.kv_capacity)
    # every request ends exactly once, finished or aborted
    assert len({c[0] for c in fast}) == len(fast) == len(fd.reqs)

    retractions = sum(e.retractions for e in fd.engines)
    reached = {
        "retracted": retractions > 0,
        "aborted with partial output": fd.hits["aborted with partial output"] > 0,
        "paused a busy engine": fd.hits["paused a busy engine"] > 0,
        "interrupting update": fd.hits["interrupting update"] > 0,
        "several engines": case.engines > 1,
        "tabulated cost": isinstance(case.spec.cost, TabulatedCost),
        "finished at prefill": any(c[1] == 1 and c[2] != "abort" for c in fast),
        "decaying ratio": case.spec.sglang_ratio,
        "ratio re-estimated after a retraction": case.spec.sglang_ratio and retractions > 0,
        "span cut where the decaying ratio may admit": sum(e.stats.ratio_cuts for e in fd.engines) > 0,
        "clipped estimate": 0 < case.spec.clip_max_new_tokens < max(r[3] for r in case.reqs),
        "requeued at the tail": case.spec.family.retract_to == "tail" and retractions > 0,
        "abort landed after a step in flight": fd.hits["abort landed after a step in flight"] > 0,
        "finished while an abort landed": fd.hits["finished while an abort landed"] > 0,
    }
    REACHED["examples"] += 1
    for name, hit in reached.items():
        if hit:
            event(name)
            REACHED[name] += 1
    target(float(retractions), label="retractions")
    target(float(fd.hits["aborted with partial output"]), label="partial aborts")
    target(float(fd.hits["paused a busy engine"]), label="busy pauses")
    target(float(sum(e.stats.ratio_cuts for e in fd.engines)), label="ratio cuts")
    # the retraction target favours head requeues (a request retracted to the head is readmitted
    # and retracted again): without this one, tail requeues can vanish from the examples
    target(float(retractions if case.spec.family.retract_to == "tail" else 0), label="tail retractions")
    target(float(sum(e.stats.abort_finishes for e in fd.engines)), label="finishes while aborts land")


# The chunked-prefill property checks the same and more through `_check`. Hypothesis seeds a
# derandomized test from its source: editing a property's body changes its examples and the
# reach shares measured on them (helpers such as `_check` can change freely).
def _check(case: Case) -> tuple[Driver, dict[str, bool]]:
    """Run both clusters through the case and require that they agree, chunked-prefill statistics
    included; return the fast one and what the example reached."""
    fd, rd = Driver(FastEngine, case), Driver(ReferenceEngine, case)
    fast, _ = assert_engines_agree(fd, rd, case.spec.kv_capacity)
    for ef in fd.engines:
        assert not ef.prefixes  # every shared prefix left with its last holder
    assert len({c[0] for c in fast}) == len(fast) == len(fd.reqs)
    retractions = sum(e.retractions for e in fd.engines)
    reached = {
        "retracted": retractions > 0,
        "aborted with partial output": fd.hits["aborted with partial output"] > 0,
        "paused a busy engine": fd.hits["paused a busy engine"] > 0,
        "interrupting update": fd.hits["interrupting update"] > 0,
        "several engines": case.engines > 1,
        "tabulated cost": isinstance(case.spec.cost, TabulatedCost),
        "decaying ratio": case.spec.sglang_ratio,
        "request prefilled over several passes":
            sum(e.stats.chunked_requests for e in fd.engines) > 0,
        "pass ended a chunked request and began others":
            sum(e.stats.chunk_tail_passes for e in fd.engines) > 0,
        "interrupted a prefill": fd.hits["interrupted a prefill"] > 0,
        "abort took a chunked request": sum(e.stats.abort_chunked for e in fd.engines) > 0,
        "admitted onto a held prefix": sum(e.stats.prefix_hits for e in fd.engines) > 0,
        "prefix freed with its last holder": sum(e.stats.prefix_drops for e in fd.engines) > 0,
        "group-affinity router": case.router == "group_affinity",
    }
    return fd, reached


# An abort that finds a request's chunked prefill unfinished (two 300-token prompts in 40-token
# passes, the abort at 50 ms): rare among the drawn examples (0-29 % across hypothesis seeds), so
# always run once here.
ABORT_MID_BATCH = Case(
    EngineSpec(COST, kv_capacity=3_000, max_running=32, max_prefill_tokens=600,
               chunked_prefill_size=40),
    1, "round_robin", [(0.0, 0, 300, 100, 50), (0.0, 1, 300, 100, 50)],
    [(0.05, "abort_late", 0.3)], [], False)


# The same two prompts without the abort: the pass that ends request 0's prefill begins request 1's.
CHUNK_TAIL = replace(ABORT_MID_BATCH, timed=[])


@settings(max_examples=CHUNK_EXAMPLES, deadline=None, derandomize=True)
@example(ABORT_MID_BATCH)
@example(CHUNK_TAIL)
@given(cases(chunked=True))
def _fast_matches_reference_chunked(case: Case) -> None:
    fd, reached = _check(case)
    REACHED_CHUNKED["examples"] += 1
    for name, hit in reached.items():
        if hit:
            event(name)
            REACHED_CHUNKED[name] += 1
    target(float(sum(e.stats.chunk_tail_passes for e in fd.engines)), label="tail passes")
    target(float(fd.hits["interrupted a prefill"]), label="interrupted prefills")
    target(float(sum(e.stats.abort_chunked for e in fd.engines)), label="chunked aborts")


SHARED_EXAMPLES = 100
REACHED_SHARED: Counter[str] = Counter()


@settings(max_examples=SHARED_EXAMPLES, deadline=None, derandomize=True)
@given(cases(shared=True))
def _fast_matches_reference_shared(case: Case) -> None:
    fd, reached = _check(case)
    REACHED_SHARED["examples"] += 1
    for name, hit in reached.items():
        if hit:
            event(name)
            REACHED_SHARED[name] += 1
    target(float(sum(e.stats.prefix_hits for e in fd.engines)), label="prefix hits")
    target(float(sum(e.retractions for e in fd.engines)), label="retractions")


def test_fast_engine_matches_reference_with_prefix_sharing():
    """Prefix sharing (issue 11): the same equivalence with groups of requests sharing a prefix,
    reaching requests admitted onto a prefix the engine holds, prefixes freed with their last
    holder, retractions and aborts of holders, the group-affinity router, and chunked prefill
    over cached prefixes."""
    REACHED_SHARED.clear()
    with _no_mined_constants():
        _fast_matches_reference_shared()
    n = REACHED_SHARED["examples"]
    assert n >= SHARED_EXAMPLES // 2, REACHED_SHARED
    shares = {k: REACHED_SHARED[k] / n for k in REACHED_SHARED if k != "examples"}
    print("prefix-sharing examples reached:", {k: round(v, 2) for k, v in sorted(shares.items())})
    assert shares.get("admitted onto a held prefix", 0.0) >= 0.3, shares
    assert shares.get("prefix freed with its last holder", 0.0) >= 0.3, shares
    for name in ("retracted", "several engines", "aborted with partial output",
                 "group-affinity router", "interrupting update", "paused a busy engine",
                 "request prefilled over several passes"):
        assert shares.get(name, 0.0) >= MIN_SHARE_OTHER, (name, shares)


def test_fast_engine_matches_reference_and_reaches_its_cases():
    REACHED.clear()
    with _no_mined_constants():
        _fast_matches_reference()
    n = REACHED["examples"]
    assert n >= EXAMPLES // 2, REACHED
    shares = {k: REACHED[k] / n for k in REACHED if k != "examples"}
    print("equivalence examples reached:", {k: round(v, 2) for k, v in sorted(shares.items())})
    for name, least in MIN_SHARE.items():
        assert shares.get(name, 0.0) >= least, (name, shares)
    for name in (
        "interrupting update",
        "several engines",
        "tabulated cost",
        "finished at prefill",
        "ratio re-estimated after a retraction",
        "clipped estimate",
        "requeued at the tail",
        "abort landed after a step in flight",
        "finished while an abort landed",
    ):
        assert shares.get(name, 0.0) >= MIN_SHARE_OTHER, (name, shares)
    for name, least in MIN_SHARE_RARE.items():
        assert shares.get(name, 0.0) >= least, (name, shares)


def test_fast_engine_matches_reference_with_chunked_prefill():
    """Chunked prefill (issue 11, SGLang's per-pass admission): the same equivalence, reaching
    requests prefilled over several passes, passes that end one and begin others, and prefills
    paused or aborted mid-way."""
    REACHED_CHUNKED.clear()
    with _no_mined_constants():
        _fast_matches_reference_chunked()
    n = REACHED_CHUNKED["examples"]
    assert n >= CHUNK_EXAMPLES // 2, REACHED_CHUNKED
    shares = {k: REACHED_CHUNKED[k] / n for k in REACHED_CHUNKED if k != "examples"}
    print("chunked-prefill examples reached:", {k: round(v, 2) for k, v in sorted(shares.items())})
    for name, least in MIN_SHARE_CHUNKED.items():
        assert shares.get(name, 0.0) >= least, (name, shares)
    for name in ("retracted", "several engines", "tabulated cost", "decaying ratio",
                 "interrupting update", "aborted with partial output",
                 "abort took a chunked request"):
        assert shares.get(name, 0.0) >= MIN_SHARE_OTHER, (name, shares)


def test_retraction_happens_and_evicts_fewest_generated():
    """A KV cache that fits the prompts but not the growth forces SGLang-style retraction."""
    spec = EngineSpec(COST, kv_capacity=1_000, max_running=8, new_token_ratio=0.0)
    for cls in (FastEngine, ReferenceEngine):
        e = cls(spec)
        e.submit([Request(0, 100, 800, 800), Request(1, 100, 800, 800)], 0.0)
        done = []
        while e.t_event < math.inf:
            done += e.advance()
        assert e.retractions >= 1
        assert sorted((c.rid, c.tokens, c.reason) for c in done) == [(0, 800, "length"), (1, 800, "length")]
        # request 1 (the later rid, tied on tokens) was the one evicted, so it finishes last
        assert max(done, key=lambda c: c.time).rid == 1


def test_decode_time_is_the_closed_form():
    """The prefill emits token 1; the other n-1 take (n-1)(a + bB + cK0) + cB(n-1)(n-2)/2."""
    spec = EngineSpec(COST, kv_capacity=100_000, max_running=8)
    e = FastEngine(spec)
    e.submit([Request(0, 1_000, 500, 500)], 0.0)
    assert e.advance() == []  # the prefill batch
    (done,) = e.advance()  # one jump to the finish
    expected = COST.prefill_time(1_000) + COST.decode_span(499, 1, 1_000)
    assert done.tokens == 500 and math.isclose(done.time, expected, rel_tol=1e-12)
    assert e.stats.iterations == 499 and e.t_event == math.inf


def test_abort_returns_partial_tokens_and_queued_requests():
    spec = EngineSpec(COST, kv_capacity=10_000, max_running=1)
    e = FastEngine(spec)
    e.submit([Request(0, 100, 1_000, 1_000), Request(1, 100, 1_000, 1_000)], 0.0)
    e.advance()  # prefill of request 0 (max_running=1 keeps request 1 queued): its first token
    t_mid = e.t + COST.decode_span(100, 1, 100) + 1e-9
    out = {c.rid: c for c in e.abort_all(t_mid)}
    assert out[0].reason == "abort" and out[0].tokens == 101
    assert out[1].reason == "abort" and out[1].tokens == 0
    assert e.load == 0 and e.t_event == math.inf


PRIORITY_EXAMPLES = 100
REACHED_PRIORITY: Counter[str] = Counter()
# measured on the derandomized run without mined constants: priority reordered admission 0.61,
# retracted among mixed priorities 0.18, prefilled over migrated KV 0.65, retracted with
# migrated KV 0.09, migrated KV in a chunked prefill 0.25


@settings(max_examples=PRIORITY_EXAMPLES, deadline=None, derandomize=True)
@given(cases(prioritized=True))
def _fast_matches_reference_prioritized(case: Case) -> None:
    fd, reached = _check(case)
    rd_jumps = fd.jumps
    retractions = sum(e.retractions for e in fd.engines)
    mixed = len(set(case.priorities.values())) > 1
    moved = sum(e.stats.migrated_tokens for e in fd.engines)
    reached |= {
        "priority reordered admission": rd_jumps > 0,
        "retracted among mixed priorities": mixed and retractions > 0,
        "requeued at the tail": case.spec.family.retract_to == "tail" and retractions > 0,
        "prefilled over migrated KV": moved > 0,
        "retracted with migrated KV": moved > 0 and retractions > 0,
        "migrated KV in a chunked prefill": moved > 0 and case.spec.prefill_chunk > 0,
    }
    REACHED_PRIORITY["examples"] += 1
    for name, hit in reached.items():
        if hit:
            event(name)
            REACHED_PRIORITY[name] += 1
    target(float(rd_jumps), label="queue jumps")
    target(float(retractions if mixed else 0), label="retractions among mixed priorities")


def test_fast_engine_matches_reference_with_priorities():
    """Request priorities and migrated KV (issue 21, Seer): higher priority is admitted first,
    arrival order among equals, retracted requests back at the head or tail of their class; a
    request's migrated input tokens are held, not computed, and lost when it is retracted. The
    same equivalence, reaching submissions that jump lower-priority queued requests, retractions
    among mixed priorities and of migrated requests, and chunked prefills over migrated KV."""
    REACHED_PRIORITY.clear()
    with _no_mined_constants():
        _fast_matches_reference_prioritized()
    n = REACHED_PRIORITY["examples"]
    assert n >= PRIORITY_EXAMPLES // 2, REACHED_PRIORITY
    shares = {k: REACHED_PRIORITY[k] / n for k in REACHED_PRIORITY if k != "examples"}
    print("priority examples reached:", {k: round(v, 2) for k, v in sorted(shares.items())})
    assert shares.get("priority reordered admission", 0.0) >= 0.2, shares
    assert shares.get("retracted among mixed priorities", 0.0) >= 0.1, shares
    assert shares.get("prefilled over migrated KV", 0.0) >= 0.3, shares
    assert shares.get("retracted with migrated KV", 0.0) >= 0.04, shares
    for name in ("several engines", "aborted with partial output", "interrupting update",
                 "paused a busy engine", "requeued at the tail", "migrated KV in a chunked prefill",
                 "request prefilled over several passes", "abort took a chunked request"):
        assert shares.get(name, 0.0) >= MIN_SHARE_OTHER, (name, shares)


def test_priority_admits_higher_first_and_keeps_arrival_order_among_equals():
    """One engine, one request at a time: admission follows priority, then arrival."""
    spec = EngineSpec(COST, kv_capacity=10_000, max_running=1)
    for cls in (FastEngine, ReferenceEngine):
        e = cls(spec)
        e.submit([Request(0, 10, 5, 5)], 0.0)  # runs first: the queue was empty
        e.submit([Request(1, 10, 5, 5), Request(2, 10, 5, 5, priority=2)], 0.0)
        e.submit([Request(3, 10, 5, 5, priority=2), Request(4, 10, 5, 5, priority=-1)], 0.0)
        done = []
        while e.t_event < math.inf:
            done += e.advance()
        assert [c.rid for c in sorted(done, key=lambda c: c.time)] == [0, 2, 3, 1, 4], cls
