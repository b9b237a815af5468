"""The fast engine equals the per-iteration reference engine on agentic workloads (issue 37).

Whole runs of episodes (turns whose prompt is the context so far, tool calls between them) under
every agentic scheduler, on KV caches small enough to retract and to evict an episode's kept
context while its tool runs, with aborts landing at once or after some steps: the step records
(every figure, the episodes' included) and the end-of-run ledger must be the same on both
engines. The examples must reach what they are there for: prefix-cache hits on the turns that
follow a tool call, evictions, retractions, tool calls an abort cancelled and turns it cut.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, replace

from hypothesis import event, given, settings
from hypothesis import strategies as st
from sched_helpers import USER_SCHEDULER  # noqa: F401 - puts tests/ helpers on the path
from test_episodes import _scenario, _Spy
from test_whole_run_equivalence import _assert_same_run

from aprilsim.conformance import ConformanceRun
from aprilsim.engine.fast import FastEngine
from aprilsim.engine.reference import ReferenceEngine
from aprilsim.policies.registry import make_scheduler
from aprilsim.sim.build import build_simulation

SCHEDULERS = ["sync", "sync_turns", "april", "april", "fully_async", "env_async"]  # APRIL aborts
REACHED: Counter[str] = Counter()


@st.composite
def agentic_cases(draw):
    """A small agentic scenario and a scheduler: 1-2 engines of 3,000-12,000 KV tokens under
    the simpler admission rules (the whole-run equivalence's: they retract), 2-4 groups of 2-3
    episodes of 1-5 turns of ~120 or ~330 tokens, tool calls of 0.05-4 s and 10-300 tokens."""
    lo = draw(st.floats(0.05, 2.0))
    episodes = {"min_turns": draw(st.integers(1, 2)), "max_turns": draw(st.integers(2, 5)),
                "tool_s": {"low": lo, "high": lo + draw(st.floats(0.0, 2.0))},
                "tool_tokens": {"low": 10, "high": draw(st.integers(10, 300))}}
    cluster = {"kv_capacity": draw(st.sampled_from([3_000, 5_000, 12_000])),
               "abort_steps": draw(st.sampled_from([-1, 1, 20])),
               "prefix_cache_block": draw(st.sampled_from([1, 1, 16])),
               "new_token_ratio": 0.1, "new_token_ratio_decay_steps": 0,
               "clip_max_new_tokens": 0, "retract_to": "head",
               "chunked_prefill_size": draw(st.sampled_from([0, 512]))}
    sc = _scenario(steps=draw(st.integers(2, 3)), batch=draw(st.integers(2, 4)),
                   group=draw(st.integers(2, 3)), engines=draw(st.integers(1, 2)),
                   max_len=1536, episodes=episodes, mu=draw(st.sampled_from([4.8, 5.8])),
                   **cluster)
    sc = sc.model_copy(update={"seed": draw(st.integers(0, 10_000))})
    return sc, draw(st.sampled_from(SCHEDULERS))


def _run(sc, name, factory):
    spy = _Spy(make_scheduler(name, sc.settings_for(name)))
    sim = build_simulation(sc, spy, engine_factory=factory)
    res = sim.run()
    return ConformanceRun(sim, spy, sc, res)  # type: ignore[arg-type]


def _agent(r):
    return [asdict(s.agent) for s in r.result.steps]


def _assert_same_episodes(fast, ref) -> None:
    """The whole runs' records equal (`_assert_same_run`), their episodes' figures too (seconds
    to 1e-9: each engine sums them in its own order)."""
    bare = [replace(r, result=replace(r.result, steps=[_plain(s) for s in r.result.steps]))
            for r in (fast, ref)]
    _assert_same_run(*bare)
    for a, b in zip(_agent(fast), _agent(ref), strict=True):
        assert a.keys() == b.keys()
        for k in a:
            assert math.isclose(a[k], b[k], rel_tol=1e-9, abs_tol=1e-9), k


def _plain(rec):
    """An agentic step record as a plain StepRecord (its `agent` compared apart)."""
    from dataclasses import fields

    from aprilsim.metrics.records import StepRecord

    return StepRecord(**{f.name: getattr(rec, f.name) for f in fields(StepRecord)})


@settings(max_examples=60, deadline=None, derandomize=True)
@given(agentic_cases())
def _fast_matches_reference(case) -> None:
    sc, name = case
    fast = _run(sc, name, FastEngine)
    ref = _run(sc, name, ReferenceEngine)
    _assert_same_episodes(fast, ref)
    assert fast.sim.core.tools_cancelled == ref.sim.core.tools_cancelled
    REACHED["examples"] += 1
    stats = [e.stats for e in fast.sim.engines]
    for label, hit in (("cache hit", any(s.cache_hits for s in stats)),
                       ("eviction", any(s.cache_evictions for s in stats)),
                       ("retraction", any(s.retractions for s in stats)),
                       ("tool call cancelled", fast.sim.core.tools_cancelled > 0),
                       ("turn cut by an abort", fast.recorder.mid_turn > 0),
                       ("tool wait", any(a["tool_wait_s"] > 0 for a in _agent(fast)))):
        if hit:
            REACHED[label] += 1
            event(label)


# shares of the examples that must reach each (measured 1.0, 0.38, 0.13, 0.23, 0.25, 0.83)
MIN_REACH = {"cache hit": 0.9, "eviction": 0.2, "retraction": 0.07, "tool call cancelled": 0.12,
             "turn cut by an abort": 0.12, "tool wait": 0.5}


def test_fast_engine_matches_reference_on_episodes():
    from test_engine_equivalence import no_mined_constants

    REACHED.clear()
    with no_mined_constants():
        _fast_matches_reference()
    n = REACHED["examples"]
    shares = {k: REACHED[k] / n for k in MIN_REACH}
    print("agentic examples reached:", {k: round(v, 2) for k, v in shares.items()})
    for k, least in MIN_REACH.items():
        assert shares[k] >= least, (k, shares)


SCALE_REACHED: Counter[str] = Counter()


@st.composite
def scale_cases(draw):
    """The users' regime: 16k response budgets, turns of ~1,000-3,000 tokens up to 4,096 each,
    tool outputs of 200-3,000 tokens, KV 100k-200k tokens per engine under the presets' SGLang
    rules (new-token ratio decay, clip 4,096, aborts after a step)."""
    episodes = {"min_turns": 2, "max_turns": draw(st.integers(3, 6)), "max_turn_len": 4096,
                "tool_s": {"low": 0.5, "high": draw(st.floats(1.0, 20.0))},
                "tool_tokens": {"low": 200, "high": 3000}}
    sc = _scenario(steps=2, batch=draw(st.integers(3, 6)), group=4, engines=2, max_len=16_384,
                   episodes=episodes, mu=draw(st.sampled_from([6.9, 7.6])),
                   kv_capacity=draw(st.integers(100_000, 200_000)))
    sc = sc.model_copy(update={"seed": draw(st.integers(0, 10_000))})
    return sc, draw(st.sampled_from(["sync", "april", "env_async"]))


@settings(max_examples=4, deadline=None, derandomize=True)
@given(scale_cases())
def _fast_matches_reference_at_scale(case) -> None:
    sc, name = case
    fast = _run(sc, name, FastEngine)
    _assert_same_episodes(fast, _run(sc, name, ReferenceEngine))
    SCALE_REACHED["examples"] += 1
    stats = [e.stats for e in fast.sim.engines]
    SCALE_REACHED["cache hit"] += any(s.cache_hits for s in stats)
    SCALE_REACHED["eviction"] += any(s.cache_evictions for s in stats)


def test_fast_engine_matches_reference_on_episodes_at_users_scale():
    from test_engine_equivalence import no_mined_constants

    SCALE_REACHED.clear()
    with no_mined_constants():
        _fast_matches_reference_at_scale()
    print("agentic scale examples reached:", dict(SCALE_REACHED))
    assert SCALE_REACHED["cache hit"] == SCALE_REACHED["examples"] == 4
    assert SCALE_REACHED["eviction"] >= 1
