"""Agentic episodes (issue 37): the workload's plans, the core's turns and tool calls, the engine's
view of a turn, the per-turn barrier, aborts mid-tool, the metrics and the scenario keys.

The engines' equivalence on episode workloads is `test_episodes_engines.py`; the live driver's
parity is `tests/real/test_parity.py`; replay of multi-turn dumps is `test_replay_agentic.py`.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import event, example, given, settings, target
from hypothesis import strategies as st

from aprilsim.cli import main
from aprilsim.config import ScenarioError, example_scenario_text, scenario_from_dict
from aprilsim.conformance import agentic_scenario, check_scheduler, run_under_check
from aprilsim.metrics.gain import decompose
from aprilsim.metrics.records import AgentStepRecord, StepRecord
from aprilsim.metrics.trace import Trace
from aprilsim.policies.base import SamplesReturned
from aprilsim.scenario_limits import parse_toml
from aprilsim.sim.build import build_simulation
from aprilsim.sim.run import simulate
from aprilsim.workload import counter_rng as crn
from aprilsim.workload.episodes import EpisodeModel, TurnLengths, Uniform, plan_episode
from aprilsim.workload.lengths import Parametric


def _scenario(*, steps: int = 3, batch: int = 4, group: int = 3, engines: int = 2,
              max_len: int = 2048, episodes: dict | None = None, mu: float = 4.8,
              **cluster) -> object:
    """A small agentic scenario (turns of median e^mu tokens, group-affinity routing, the
    retained prefix cache; `cluster` overrides)."""
    data = {"name": "ep", "steps": steps, "warmup_steps": 0, "batch_size": batch,
            "group_size": group, "max_response_len": max_len,
            "lengths": {"family": "lognormal", "mu": mu, "sigma": 0.7},
            "prompts": {"family": "lognormal", "mu": 4.5, "sigma": 0.3, "max_len": 512},
            "trainer": {"base_s": 1.0, "per_token_s": 1e-5, "sync_s": 0.5},
            "cluster": {"engines": engines, "router": "group_affinity", "prefix_cache": "lru",
                        **cluster},
            "workload": {"episodes": episodes or {"min_turns": 2, "max_turns": 4,
                                                  "tool_s": {"low": 0.2, "high": 1.5}}}}
    return scenario_from_dict(data)


# ------------------------------------------------------------------ the workload
def test_an_episode_is_the_same_whoever_draws_it():
    """Common random numbers per (seed, group, sample, turn): drawing 3 groups or 7 at once,
    or another batch size first, gives group k the same plan."""
    w1, w2 = _scenario().workload_for(), _scenario().workload_for()
    a = w1.generate(3, 0)
    w2.generate(1, 0, group_size=5)  # another draw first: a fresh prompt index
    b = _scenario().workload_for().generate(7, 0)
    for g, h in zip(a, b[:3]):
        for s, t in zip(g.samples, h.samples):
            assert s.episode._ends == t.episode._ends
            assert s.episode._tool_s == t.episode._tool_s
            assert s.episode._tool_tokens == t.episode._tool_tokens
            assert s._target_len == s.episode._ends[-1]
    c = _scenario().model_copy(update={"seed": 1}).workload_for().generate(3, 0)
    assert [s.episode._ends for s in c[0].samples] != [s.episode._ends for s in a[0].samples]


PLAN_REACH = {"truncated": 0, "answer": 0, "cut tool output": 0, "examples": 0}


# a tool output cut at the context limit: rare in the draws, so always in the examples
@example(lengths=[100, 100], tools=[5_000] + [0] * 15, max_len=4096, cap=4096)
@example(lengths=[3_000, 50, 50], tools=[20_000, 10] + [0] * 14, max_len=16_384, cap=16_384)
@settings(max_examples=80, deadline=None, derandomize=True)
@given(lengths=st.lists(st.integers(1, 20_000), min_size=1, max_size=16),
       tools=st.lists(st.integers(0, 6_000), min_size=16, max_size=16),
       max_len=st.sampled_from([512, 4096, 16_384, 32_768]),
       cap=st.sampled_from([256, 1024, 4096, 16_384]))
def _plan_never_passes_its_limits(lengths, tools, max_len, cap):
    """The plan keeps the turn limit, the per-turn cap and the context limit (generated + tool
    tokens <= max_response_len, the last turn cut there), in the users' regime (16k-32k caps,
    thousands of tool tokens)."""
    secs = [0.5] * 16
    ends, s, toks = plan_episode(lengths, secs, tools, max_len, cap)
    turns = [b - a for a, b in zip([0, *ends[:-1]], ends)]
    assert 1 <= len(ends) <= len(lengths) and len(toks) == len(s) == len(ends) - 1
    assert all(1 <= n <= cap for n in turns)
    resp = ends[-1] + sum(toks)
    assert resp <= max_len
    PLAN_REACH["examples"] += 1
    if resp == max_len:
        PLAN_REACH["truncated"] += 1
        event("truncated at the context limit")
    else:
        PLAN_REACH["answer"] += 1
        assert len(ends) == len(lengths)  # no limit hit: every turn ran
    if any(t < min(x, max_len) for t, x in zip(toks, tools)):
        PLAN_REACH["cut tool output"] += 1
        event("a tool output cut to leave one token")
    target(resp / max_len, label="context used")


def test_a_plan_never_passes_its_limits_and_plans_reach_both_ends():
    for k in PLAN_REACH:
        PLAN_REACH[k] = 0
    _plan_never_passes_its_limits()
    n = PLAN_REACH["examples"]
    assert n >= 40 and PLAN_REACH["truncated"] >= 5 and PLAN_REACH["answer"] >= 5
    assert PLAN_REACH["cut tool output"] >= 2


def test_hard_prompts_take_more_and_longer_turns():
    """The prompt effect that lengthens a group's responses also gives it more turns."""
    m = EpisodeModel(max_turns=8, min_turns=1, tool_s=Uniform(0.1, 1.0),
                     tool_tokens=Uniform(10, 20))
    keys = np.arange(400, dtype=np.int64)
    u = crn.normals(0, crn.PROMPT_EFFECT, keys)
    how = TurnLengths(Parametric("lognormal", {"mu": 5.0, "sigma": 0.8}), 0.6, 1.0, 1 << 20)
    eps = m.draw(0, keys, 4, u, how)
    turns = np.array([np.mean([len(e._ends) for e in row]) for row in eps])
    per_turn = np.array([np.mean([e._ends[-1] / len(e._ends) for e in row]) for row in eps])
    assert np.corrcoef(u, turns)[0, 1] > 0.4
    assert np.corrcoef(u, per_turn)[0, 1] > 0.4
    assert set(np.unique([len(e._ends) for row in eps for e in row])) == set(range(1, 9))


# ------------------------------------------------------------------ the engine's view of a turn
def _one_episode(**cluster):
    sc = _scenario(steps=1, batch=1, group=1, engines=1, **cluster)
    trace = Trace("sync", 1)
    sim = build_simulation(sc, "sync", trace=trace)
    res = sim.run()
    (g,) = sim.groups.values()
    return g.samples[0], res, trace


def test_each_turn_is_a_request_whose_prompt_is_the_context_so_far():
    """One episode alone on one engine: a request per turn, each sent when its tool call
    returned; with the retained cache a turn prefills only its tool tokens and the one token
    SGLang always computes; without it, its whole context."""
    s, res, trace = _one_episode()
    ep = s.episode
    spans = sorted(trace.requests, key=lambda r: r.submit_s)
    assert len(spans) == len(ep._ends) >= 2 and ep.turn == len(ep._ends) - 1
    assert [r.tokens for r in spans] == [b - a for a, b in zip([0, *ep._ends[:-1]], ep._ends)]
    for k, (a, b) in enumerate(zip(spans, spans[1:])):
        assert math.isclose(b.submit_s, a.end_s + ep._tool_s[k], rel_tol=1e-12)
    assert s.generated == s._target_len and ep.appended == sum(ep._tool_tokens)
    rec = res.steps[0]
    assert isinstance(rec, AgentStepRecord)
    assert rec.prefill_tokens == s.prompt_len + sum(t + 1 for t in ep._tool_tokens)
    assert rec.agent.cache_hit_tokens > 0 and rec.agent.tool_calls == len(ep._tool_tokens)
    assert math.isclose(rec.agent.tool_time_s, sum(ep._tool_s))
    # nothing else runs: every tool call is a stretch where the engine has nothing to do
    assert math.isclose(rec.agent.tool_wait_s, sum(ep._tool_s), rel_tol=1e-9)
    s2, res2, _ = _one_episode(prefix_cache="none")
    contexts = [s2.prompt_len + a + sum(ep._tool_tokens[:k])
                for k, a in enumerate([0, *ep._ends[:-1]])]
    assert res2.steps[0].prefill_tokens == sum(contexts)
    assert res2.steps[0].agent.cache_hit_tokens == 0


def test_single_turn_runs_keep_their_records():
    """A workload without [workload.episodes]: plain StepRecords, no agentic summary keys."""
    sc = agentic_scenario()
    plain = sc.model_copy(update={"workload": sc.workload.model_copy(update={"episodes": None})})
    r = simulate(plain, "sync")
    assert all(type(s) is StepRecord for s in r.steps)
    assert "turns_per_episode" not in r.summary()
    assert "tool_wait" not in r.summary()["engine_time_s"]


# ------------------------------------------------------------------ schedulers and the core
class _Spy:
    """Counts what came back from aborts: episodes stopped mid-turn or with a tool call pending."""

    def __init__(self, inner):
        self.inner, self.name, self.mode = inner, inner.name, inner.mode
        self.sample_events = getattr(inner, "sample_events", True)
        self.turn_events = getattr(inner, "turn_events", False)
        self.mid_tool = self.mid_turn = 0

    def handle(self, event, ctx):
        if isinstance(event, SamplesReturned):
            for s in event.samples:
                if s.episode is not None and s.episode.calling:
                    self.mid_tool += 1
                elif s.episode is not None and s.generated:
                    self.mid_turn += 1
        return self.inner.handle(event, ctx)

    def step_stats(self):
        return self.inner.step_stats()


def test_april_aborts_episodes_mid_tool_and_resumes_them_at_their_turn():
    """APRIL's abort stops turns in flight and cancels tool calls; resumed next step, a
    cancelled call runs again and the episode goes on at the turn where it stopped: every
    trained episode ran its whole plan, and only returned calls count as tool time."""
    from aprilsim.policies.registry import make_scheduler

    sc = _scenario(steps=5, batch=4, group=3, episodes={
        "min_turns": 3, "max_turns": 6, "tool_s": {"low": 1.0, "high": 4.0}})
    spy = _Spy(make_scheduler("april", {"ratio": 2.0}))
    sim = build_simulation(sc, spy)
    sim.run()
    assert sim.core.tools_cancelled > 0 and spy.mid_tool > 0 and spy.mid_turn > 0
    trained = [s for g in sim.groups.values() for s in g.samples if s.status.value == "trained"]
    assert trained
    for s in trained:
        ep = s.episode
        assert s.generated == s._target_len and ep.turn == len(ep._ends) - 1 and not ep.calling
        assert ep.appended == sum(ep._tool_tokens)
        assert math.isclose(ep.tool_time_s, sum(ep._tool_s))
    resumed = [s for s in trained if len({seg.version for seg in s.segments}) > 1]
    assert resumed  # episodes whose turns ran under two policy versions
    row = simulate(sc, "april").summary()
    assert row["policy_versions_per_episode"] > 1.0 and row["offpolicy_turn_fraction"] > 0


def test_sync_turns_starts_every_next_turn_together():
    """The per-turn barrier: within a step, the next turns of the batch go out at once, after
    the last tool call of the turn before; the agent loop (sync) sends each episode's own."""
    sc = _scenario(steps=2, batch=4, group=3)
    starts = {}
    for name in ("sync", "sync_turns"):
        trace = Trace(name, 2)
        simulate(sc, name, trace=trace)
        starts[name] = len({round(r.submit_s, 9) for r in trace.requests})
        assert check_scheduler(name, scenarios={"agentic": sc})
    assert starts["sync_turns"] <= 2 * 4  # at most one send per turn per step
    assert starts["sync"] > 4 * starts["sync_turns"]
    a, b = simulate(sc, "sync").summary(), simulate(sc, "sync_turns").summary()
    assert a["generated_tokens"] == b["generated_tokens"]  # the same episodes
    assert b["tool_wait_share"] > a["tool_wait_share"] and b["mean_rollout_time_s"] > \
        a["mean_rollout_time_s"]


def test_a_long_tool_workload_waits_on_tools_and_the_gain_parts_add_up():
    """Long tool calls and few episodes: much of the rollout, every episode in flight waits
    on a tool; the decomposition's tool-wait part is that idle time, and the parts still add
    up to the measured gain exactly."""
    sc = _scenario(steps=3, batch=2, group=2, episodes={
        "min_turns": 4, "max_turns": 6, "tool_s": {"low": 5.0, "high": 10.0}})
    base, april = simulate(sc, "sync").summary(), simulate(sc, "april").summary()
    assert base["tool_wait_share"] > 0.3
    t = base["engine_time_s"]
    assert t["tool_wait"] > 0 and t["idle"] >= -1e-9
    assert math.isclose(t["tool_wait"], sc.cluster.engines * base["tool_wait_share"]
                        * base["mean_rollout_time_s"] * base["steps"], rel_tol=1e-9)
    d = decompose(april, base)
    assert "tool_wait" in d["parts"]
    assert math.isclose(sum(d["parts"].values()), d["gain"], abs_tol=1e-9)


@pytest.mark.parametrize("name", ["sync", "sync_turns", "april", "fully_async", "env_async"])
def test_the_agentic_schedulers_pass_the_conformance_checks(name):
    passed = check_scheduler(name, scenarios={"agentic": agentic_scenario()})
    assert "check_episodes[agentic]" in passed


def test_a_scheduler_cannot_call_tools_of_an_episode_without_a_pending_call():
    from dataclasses import dataclass

    from aprilsim.policies.base import CallTools, RolloutStarted, SchedulerError, Submit
    from aprilsim.types import samples_of

    @dataclass
    class Bad:
        name = "bad"
        mode = "colocated"

        def handle(self, event, ctx):
            if isinstance(event, RolloutStarted):
                s = samples_of(ctx.new_groups(ctx.batch_size))
                return [Submit(s), CallTools(s[:1])]
            return ()

        def step_stats(self):
            return {}

    with pytest.raises(SchedulerError, match="no tool call pending"):
        run_under_check(Bad, None, agentic_scenario())


# ------------------------------------------------------------------ scenario keys and the CLI
@pytest.mark.parametrize(("episodes", "msg"), [
    ({"max_turns": 2, "min_turns": 3}, "min_turns 3 is above max_turns 2"),
    ({"max_turns": 0}, "workload.episodes.max_turns"),
    ({"max_turns": 2, "tool_s": {"low": 2.0, "high": 1.0}}, "workload.episodes.tool_s"),
    ({"max_turns": 2, "tool_tokens": {"low": 1}}, "workload.episodes.tool_tokens"),
    ({"max_turns": 2, "tool_s": {"family": "lognormal", "mus": 1}}, "tool_s.mus"),
    ({"max_turns": 2, "turns": 3}, "workload.episodes.turns: unknown key"),
    ({"max_turns": 10**6}, "requests per step"),  # a request per turn: the run-size bound
])
def test_bad_episode_keys_are_one_line_errors(episodes, msg):
    with pytest.raises(ScenarioError, match=msg) as e:
        _scenario(episodes=episodes).workload_for()
    assert "\n" not in str(e.value)


def test_the_agentic_example_is_a_valid_sourced_scenario(tmp_path):
    text = example_scenario_text("agentic")
    assert "Search-R1" in text and "ASSUMPTION" in text and "2510.11345" in text
    sc = scenario_from_dict(parse_toml(text, "agentic"))
    assert sc.workload.episodes is not None and "sync_turns" in sc.compare
    r = CliRunner().invoke(main, ["scenario", "--example", "agentic"])
    assert r.exit_code == 0 and r.output == text
    r = CliRunner().invoke(main, ["scenario", "--example", "agentc"])
    assert r.exit_code == 2 and "did you mean 'agentic'" in r.output
    p = tmp_path / "a.toml"
    p.write_text(text)
    r = CliRunner().invoke(main, ["simulate", str(p), "--steps", "2", "-s", "sync", "-s",
                                  "sync_turns", "--set", "batch_size=4"])
    assert r.exit_code == 0, r.output
    assert "episodes/s" in r.output and "tool-wait" in r.output and "tool wait" in r.output
