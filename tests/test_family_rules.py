"""Engine families as objects (`aprilsim.engine.families`): a new family is one module and one
registration, and both engines run it alike.

The toy family (`tests/toy_family.py`) answers every question of the `Rules` protocol
differently from SGLang (a quarter of each remainder reserved, at most two requests a batch, the
most generated preempted first and put back at the head, aborts two steps late, 4-token cache
blocks). Registered,
it is a scenario's `[cluster] family`, and on random workloads that retract, abort and share
prefixes the fast engine gives the per-iteration reference engine's completions, token counts
and counters: the reach of the property is asserted.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
from engine_agreement import assert_engines_agree
from hypothesis import event, given, settings, target
from hypothesis import strategies as st
from test_engine_equivalence import Driver, _no_mined_constants, cases
from test_engine_equivalence_scale import scale_cases
from toy_family import ToyFamily, ToyRules

from aprilsim.config import ScenarioError
from aprilsim.conformance import small_scenario
from aprilsim.engine.cost import PRESETS, EngineSpec
from aprilsim.engine.families import (
    FAMILIES,
    SIMPLE,
    Rules,
    Step,
    family_params,
    make_family,
    register,
)
from aprilsim.engine.families.protocol import MIXED
from aprilsim.engine.fast import FastEngine
from aprilsim.engine.reference import ReferenceEngine
from aprilsim.sim.run import simulate

EXAMPLES = 40
SCALE_EXAMPLES = 6
REACHED: Counter[str] = Counter()
# least shares (measured on the derandomized examples with no mined constants: retracted 0.42,
# abort landed late 0.33, a batch of batch_cap 0.7, cache blocks 0.23); the floors leave margin
MIN_SHARE = {"retracted": 0.2, "abort landed after a step in flight": 0.15,
             "a batch of batch_cap requests": 0.35, "served whole cache blocks": 0.1}


@pytest.fixture
def toy():
    """The toy family, registered for one test."""
    register("toy", ToyFamily)
    yield
    del FAMILIES["toy"]


def test_every_family_makes_rules_that_answer_the_protocol():
    spec = PRESETS["qwen3-4b-h100-tp2"]
    for name in FAMILIES:
        fam = make_family(name)
        assert fam.name == name and fam.live_prefix_cache in ("lru", "none")
        rules = fam.rules(spec)
        assert isinstance(rules, Rules) and rules.family == name
        assert (rules.abort_steps, rules.cache_block) == (fam.abort_steps, fam.cache_block)
        assert rules.kv_capacity == spec.kv_capacity
        assert rules.mixed_steps == (name == "vllm")  # vLLM V1 mixes prefill and decode
        assert fam.rules(spec) is not rules  # each engine gets its own (they keep state)
    assert {"sglang", "bundled", "vllm"} <= set(FAMILIES)
    assert EngineSpec(spec.cost).family == SIMPLE  # a bare spec: the simpler rules
    assert (SIMPLE.abort_steps, SIMPLE.retract_to) == (-1, "head")
    with pytest.raises(ValueError, match="unknown engine family 'sgl'"):
        make_family("sgl")
    with pytest.raises(ValueError, match="the vllm family has no rule 'batch_cap'"):
        make_family("vllm", batch_cap=3)
    with pytest.raises(ValueError, match="must be an engine family"):
        EngineSpec(spec.cost, family="sglang")


def test_a_new_family_is_one_module_and_its_registration(toy):
    assert family_params("toy") == ("abort_steps", "cache_block", "batch_cap")
    sc = small_scenario(steps=2, warmup=0, cluster={"family": "toy", "abort_steps": 3,
                                          "prefix_cache_block": 8})
    spec = sc.engine_spec()
    assert spec.family == ToyFamily(abort_steps=3, cache_block=8) and spec.abort_steps == 3
    assert isinstance(FastEngine(spec).rules, ToyRules)
    run = simulate(sc, "april")
    assert run.summary()["trained_samples"] == 2 * 6 * 4
    with pytest.raises(ScenarioError, match="cluster.retract_to: the toy engine family has no"):
        small_scenario(cluster={"family": "toy", "retract_to": "tail"}).engine_spec()
    with pytest.raises(ScenarioError, match="unknown engine family 'toys'.*toy"):
        small_scenario(cluster={"family": "toys"})


def test_the_scenario_key_picks_the_family_and_keeps_its_defaults():
    vllm = small_scenario(cluster={"family": "vllm"}).engine_spec()
    assert vllm.family == make_family("vllm") and vllm.abort_steps == 0
    assert vllm.family.cache_block == 16 and vllm.family.max_num_batched_tokens == 8192
    bundled = small_scenario(cluster={"family": "bundled", "retract_to": "head"}).engine_spec()
    assert bundled.family == make_family("bundled", retract_to="head")
    assert small_scenario().engine_spec().family == make_family("sglang")  # the default
    for name in ("vllm", "bundled"):  # each runs, with its own rules
        sc = small_scenario(steps=2, warmup=0, cluster={"family": name})
        assert simulate(sc, "april").summary()["trained_samples"] == 2 * 6 * 4


def test_the_engines_refuse_a_step_they_cannot_run():
    """A family whose prefill and decode share a step but gives no stepper (vLLM's gives its
    own, `VllmRules.stepper`) is refused by both engines with one line, and the reference engine
    will not run a step kind it does not know."""
    spec = EngineSpec(PRESETS["qwen3-4b-h100-tp2"].cost, kv_capacity=10_000)

    class Mixed(Rules):  # a family's rules written in Python: a subclass of the protocol
        def __init__(self, mixed_steps: bool):
            self.family, self.mixed_steps = "mixed", mixed_steps
            self.abort_steps, self.cache_block, self.clip = -1, 1, 0
            self.fewest_first = True

        def plan_step(self, view):
            return Step(MIXED)

    for engine in (FastEngine, ReferenceEngine):
        with pytest.raises(NotImplementedError, match="the mixed family mixes prefill and "
                                                      "decode in one step but gives"):
            engine(spec, rules=Mixed(True))
    ref = ReferenceEngine(spec, rules=Mixed(False))
    with pytest.raises(NotImplementedError, match="planned a step of kind 3"):
        ref.submit([], 0.0)


class VictimCheckedReference(ReferenceEngine):
    """The reference engine, checking that each step's victims are the running requests with
    the most generated tokens (the toy's order, not SGLang's)."""

    def _start_decode(self, step):
        if step.victims and self.running:
            assert min(v.gen for v in step.victims) >= max(r.gen for r in self.running)
        super()._start_decode(step)


@st.composite
def toy_cases(draw):
    case = draw(st.one_of(cases(), cases(shared=True)))
    spec = replace(case.spec, family=ToyFamily())
    if case.prefixes and draw(st.booleans()):
        spec = replace(spec, prefix_cache="lru")  # the retained cache, in 4-token blocks
    return replace(case, spec=spec)


class _BatchProbe(FastEngine):
    """The fast engine, counting prefill batches of the toy's `batch_cap` requests."""

    def _plan_prefill(self) -> bool:
        started = super()._plan_prefill()
        if started and len(self.pf.reqs) == self.rules.batch_cap:
            self.stats_capped = getattr(self, "stats_capped", 0) + 1
        return started


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True)  # reach shares are asserted
@given(toy_cases())
def _toy_fast_matches_reference(case) -> None:
    fd, rd = Driver(_BatchProbe, case), Driver(VictimCheckedReference, case)
    fast, _ = assert_engines_agree(fd, rd, case.spec.kv_capacity)
    assert len({c[0] for c in fast}) == len(fast) == len(fd.reqs)
    assert all(isinstance(e.rules, ToyRules) for e in fd.engines + rd.engines)
    retractions = sum(e.retractions for e in fd.engines)
    reached = {
        "retracted": retractions > 0,
        "abort landed after a step in flight": fd.hits["abort landed after a step in flight"] > 0,
        "a batch of batch_cap requests": any(getattr(e, "stats_capped", 0) for e in fd.engines),
        "served whole cache blocks": sum(e.stats.cache_block_dropped for e in fd.engines) > 0,
    }
    REACHED["examples"] += 1
    for name, hit in reached.items():
        if hit:
            event(name)
            REACHED[name] += 1
    target(float(retractions), label="retractions")


def test_fast_matches_reference_under_a_toy_family():
    REACHED.clear()
    with _no_mined_constants():
        _toy_fast_matches_reference()
    n = REACHED["examples"]
    assert n >= EXAMPLES // 2, REACHED
    shares = {k: REACHED[k] / n for k in MIN_SHARE}
    print("toy family examples reached:", {k: round(v, 2) for k, v in shares.items()})
    for name, floor in MIN_SHARE.items():
        assert shares[name] >= floor, (name, shares[name], floor)


@settings(max_examples=SCALE_EXAMPLES, deadline=None, derandomize=True)
@given(scale_cases())
def _toy_at_scale(case) -> None:
    case = replace(case, spec=replace(case.spec, family=ToyFamily()))
    fd, rd = Driver(FastEngine, case), Driver(VictimCheckedReference, case)
    assert_engines_agree(fd, rd, case.spec.kv_capacity)
    REACHED["scale examples"] += 1
    REACHED["scale retracted"] += sum(e.retractions for e in fd.engines) > 0


def test_fast_matches_reference_under_a_toy_family_at_users_scale():
    """100k-400k KV tokens, 16k caps, prompts to 4,000 tokens, resumed partials, aborts."""
    REACHED.clear()
    with _no_mined_constants():
        _toy_at_scale()
    print("toy family at scale:", dict(REACHED))
    assert REACHED["scale examples"] == SCALE_EXAMPLES
    assert REACHED["scale retracted"] >= SCALE_EXAMPLES // 2, REACHED
