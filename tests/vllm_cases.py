"""Workloads for the vLLM family's fast == reference properties (tests/test_vllm_family.py): a
cluster of engines under vLLM's rules driven through the equivalence tests' outside calls, its
requests carrying token content (`families.vllm_content`): groups sharing a prompt, resumed
partials carrying their own output (what vLLM's prefix cache serves), and a reference engine
that counts what a case reached (preemptions, mixed steps, chunked prefills, prefix hits).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st
from test_engine_equivalence import FOLLOW, Case, Driver

from aprilsim.config import default_scenario
from aprilsim.engine.cost import CostModel, EngineSpec
from aprilsim.engine.families import make_family
from aprilsim.engine.families.vllm_reference import RefStepper
from aprilsim.engine.reference import ReferenceEngine
from aprilsim.engine.request import Request

PRESET = default_scenario().engine_spec()  # the presets' default cost
SMALL_COST = CostModel(a=0.005, b=1e-4, c=2e-7, p0=0.01, p1=1e-5, p2=1e-8, pr=1e-3)


@dataclass
class VllmCase(Case):
    """A `Case` whose requests name their group's prompt (`prompt_of`, rid -> prompt key) and
    the output they carry as resumed partials (`carried_of`, rid -> tokens), and whose
    interrupting updates flush the engines' prefix caches or not (`flush`)."""

    prompt_of: dict[int, int] = field(default_factory=dict)
    carried_of: dict[int, int] = field(default_factory=dict)
    flush: bool = False


class VllmDriver(Driver):
    """The equivalence tests' driver with vLLM's token content on every request: an original
    request is its own sample of its group's prompt; a follow-up is a new sample; a partial
    resubmitted after an interrupting update continues its sample (the output it carries is the
    sample's, which the engine's prefix cache may still hold)."""

    def __init__(self, engine_cls: Any, case: VllmCase) -> None:
        super().__init__(engine_cls, case)
        self.vcase = case
        self.content: dict[int, tuple[int, int, int]] = {}  # rid -> (prompt, seq, carried)

    def submit(self, reqs: list[Request], now: float) -> None:
        for r in reqs:
            if r.rid not in self.content:
                self.content[r.rid] = (self.vcase.prompt_of.get(r.rid, -1), r.rid,
                                       self.vcase.carried_of.get(r.rid, 0))
            r.prompt, r.seq, r.carried = self.content[r.rid]
        super().submit(reqs, now)

    def outside(self, now: float, kind: str, dur: float) -> None:
        if kind != "update":
            super().outside(now, kind, dur)
            return
        es = self.engines
        aborted = [c for e in es for c in e.abort_all(now)]
        self.out += aborted
        partial = [c for c in aborted if c.tokens > 0]
        self.hits["aborted with partial output"] += len(partial)
        self.hits["interrupting update"] += 1
        for e in es:
            if self.vcase.flush:
                e.flush_prefix_cache()
            e.block_until(now + dur)
        resub = []
        for c in partial:
            inp, max_new, tgt = self.reqs[c.rid]
            prompt, seq, carried = self.content[c.rid]
            r = Request(self.new_rid(), inp + c.tokens, max_new - c.tokens, tgt - c.tokens)
            self.content[r.rid] = (prompt, seq, carried + c.tokens)
            resub.append(r)
        self.submit(resub, now)


class ProbedStepper(RefStepper):
    """The reference engine's vLLM stepper, counting the cases the properties are for."""

    probe: Counter[str]

    def _price(self) -> None:
        super()._price()
        plan = self.plan
        assert plan is not None
        b, tokens, rows = self.counts
        self.probe["mixed step"] += b > 0 and rows > 0
        ids = {rid for rid, _ in plan.scheduled}
        self.probe["prefill chunk left tokens uncomputed"] += len(ids) > len(plan.samples)
        self.probe["admitted a preempted request"] += sum(
            self.reqs[rid][0].retractions > 0 for rid, _ in plan.admitted)
        self.probe["prefix hit on a resumed sample's own blocks"] += sum(
            hit > 0 and self.reqs[rid][0].carried > 0 for rid, hit in plan.admitted)
        self.probe["preempted in a step that also ran a prefill"] += (bool(plan.preempted)
                                                                      and rows > 0)


class ProbedReference(ReferenceEngine):
    """The reference engine with a `ProbedStepper`."""

    def __init__(self, spec: EngineSpec, name: int = 0) -> None:
        super().__init__(spec, name)
        self.mixed = ProbedStepper(self, self.rules)
        self.mixed.probe = Counter()

    @property
    def probe(self) -> Counter[str]:
        return self.mixed.probe


def vllm_spec(cost: Any, kv: int, max_running: int, **family: Any) -> EngineSpec:
    """An engine of `kv` KV tokens under vLLM's rules with `family`'s parameters."""
    return EngineSpec(cost, kv_capacity=kv, max_running=max_running,
                      family=make_family("vllm", **family))


@st.composite
def small_vllm_cases(draw: Any) -> VllmCase:
    """Small engines (1,000-6,000 KV tokens in blocks of 1-32) under vLLM's rules with small
    token budgets, so that steps mix decodes with prefill chunks, blocks run out and requests
    are preempted; groups of requests share prompts; aborts, pauses, updates, follow-ups."""
    block = draw(st.sampled_from([16, 16, 1, 4, 32]))
    kv = draw(st.integers(1_000, 6_000))
    max_running = draw(st.integers(1, 32))
    budget = draw(st.sampled_from([max_running, 64, 200, 2_048]))
    spec = vllm_spec(SMALL_COST, kv, max_running,
                     max_num_batched_tokens=max(budget, max_running), cache_block=block,
                     enable_prefix_caching=draw(st.sampled_from([True, True, False])),
                     watermark=draw(st.sampled_from([0.0, 0.0, 0.01, 0.2])),
                     scheduler_reserve_full_isl=draw(st.sampled_from([True, True, False])),
                     abort_steps=draw(st.sampled_from([0, 0, 2])))
    n_groups = draw(st.integers(1, 5))
    plens = [draw(st.integers(1, 300)) for _ in range(n_groups)]
    reqs, prompt_of, carried_of = [], {}, {}
    for rid in range(draw(st.integers(2, 30))):
        key = rid % n_groups
        prompt_of[rid] = key
        carried = carried_of[rid] = draw(st.sampled_from([0, 0, 0, 20, 150]))
        inp = plens[key] + carried
        room = (kv // block) * block - inp - block  # it must fit in the blocks alone
        max_new = draw(st.integers(1, max(1, min(1_500, room))))
        tgt = draw(st.one_of(st.just(max_new), st.just(1), st.integers(1, max_new)))
        reqs.append((draw(st.floats(0, 3, allow_nan=False)), rid, inp, max_new, tgt))
    kinds = st.sampled_from(["submit", "abort", "pause", "update", "abort_late"])
    dur = st.floats(0.05, 2.0)
    timed = draw(st.lists(st.tuples(st.floats(0, 15, allow_nan=False), kinds, dur), max_size=3))
    after = [(draw(st.integers(1, 4)), draw(st.floats(0, 0.2)), "pause", draw(dur)),
             (draw(st.integers(1, 6)), draw(st.floats(0, 0.2)),
              draw(st.sampled_from(["abort", "update", "abort_late"])), draw(dur))]
    return VllmCase(spec, draw(st.integers(1, 3)), draw(st.sampled_from(["round_robin",
                                                                         "least_loaded"])),
                    sorted(reqs), sorted(timed), after, draw(st.booleans()),
                    prompt_of=prompt_of, carried_of=carried_of, flush=draw(st.booleans()))


@st.composite
def scale_vllm_cases(draw: Any) -> VllmCase:
    """The users' regime: one or two engines of 100k-400k KV tokens (blocks of 16) under vLLM's
    default rules (8,192-token budget, 256 sequences) or a smaller budget; prompts of 100-4,000
    tokens in GRPO groups of 8, 16k caps (remainders for resumed partials), long-tailed lengths,
    more requests than the cache holds; two arrival waves, aborts, pauses, updates."""
    kv = draw(st.one_of(st.integers(100_000, 160_000), st.integers(100_000, 400_000)))
    spec = vllm_spec(PRESET.cost, kv, draw(st.sampled_from([256, 128])),
                     max_num_batched_tokens=draw(st.sampled_from([8_192, 8_192, 2_048, 16_384])),
                     abort_steps=draw(st.sampled_from([0, 0, 3])))
    n = draw(st.integers(kv // 3_500, kv // 2_500))
    plens = [draw(st.integers(100, 4_000)) for _ in range(n // 8 + 1)]
    reqs, prompt_of, carried_of = [], {}, {}
    for rid in range(n):
        prompt_of[rid] = rid // 8
        carried = carried_of[rid] = draw(st.sampled_from([0, 0, 0, 2_000, 9_000]))
        max_new = 16_384 - carried
        tgt = draw(st.one_of(st.just(max_new), st.integers(1, max_new),
                             st.integers(1, min(max_new, 6_000))))
        t = draw(st.sampled_from([0.0, 0.0, 0.0, 5.0, 40.0]))
        reqs.append((t, rid, plens[rid // 8] + carried, max_new, tgt))
    dur = st.floats(0.05, 3.0)
    kinds = st.sampled_from(["abort_late", "pause", "submit", "update"])
    timed = draw(st.lists(st.tuples(st.floats(0, 200, allow_nan=False), kinds, dur),
                          max_size=2))
    return VllmCase(spec, draw(st.integers(1, 2)), "round_robin", sorted(reqs), sorted(timed),
                    [], False, prompt_of=prompt_of, carried_of=carried_of,
                    flush=draw(st.booleans()))


__all__ = ["FOLLOW", "ProbedReference", "VllmCase", "VllmDriver", "scale_vllm_cases",
           "small_vllm_cases", "vllm_spec"]
