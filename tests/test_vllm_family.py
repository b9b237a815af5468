"""The vLLM family in the simulator's engines: the fast engine reproduces the per-step reference
engine exactly under vLLM's rules (mixed prefill+decode steps under one token budget, block KV,
preemption to the head of the queue with recompute, prefix caching, aborts, pauses, interrupting
updates), on small engines where every rule bites and at the users' scale (16k caps, 100k-400k
KV tokens, GRPO groups). Each property counts what its examples reached (`event`, `target`) and
asserts the shares over a derandomized run; the explicit `@example` cases reach every asserted
case whatever examples hypothesis draws.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from cli_helpers import aprilsim
from engine_agreement import assert_engines_agree
from hypothesis import HealthCheck, event, example, given, settings, target
from sched_helpers import run, small_scenario
from test_whole_run_equivalence import _assert_same_run
from vllm_cases import (
    PRESET,
    SMALL_COST,
    ProbedReference,
    VllmCase,
    VllmDriver,
    scale_vllm_cases,
    small_vllm_cases,
    vllm_spec,
)

from aprilsim.engine.fast import FastEngine
from aprilsim.engine.reference import ReferenceEngine

TINY = """name = "tiny"
steps = 3
batch_size = 4
group_size = 2
max_response_len = 512
compare = ["sync", "april"]
[cluster]
engines = 2
[lengths]
family = "lognormal"
mu = 5.0
sigma = 0.5
"""
SMALL_EXAMPLES = 150
SCALE_EXAMPLES = 12
REACHED: Counter[str] = Counter()
REACHED_SCALE: Counter[str] = Counter()
# each asserted in at least this share of the drawn small examples. The derandomized examples
# still differed between runs on a loaded machine (hypothesis' generation has time-dependent
# heuristics): over four runs preempted 0.58-0.62, partial abort 0.32-0.91, mixed step
# 0.85-0.96, uncomputed chunk 0.30-0.81, readmitted 0.58-0.62, resumed hit 0.19-0.74; the
# thresholds are under half the least, and the explicit cases reach each in every run
SMALL_SHARES = {"preempted": 0.25, "aborted with partial output": 0.15, "mixed step": 0.4,
                "prefill chunk left tokens uncomputed": 0.12,
                "admitted a preempted request": 0.25,
                "prefix hit on a resumed sample's own blocks": 0.08}
SCALE_CASES = ("preempted", "mixed step", "admitted a preempted request",
               "prefix hit on a resumed sample's own blocks", "aborted with partial output")


def _run(case: VllmCase) -> dict[str, bool]:
    """Run both clusters through `case`, require that they agree, and return what it reached."""
    fd, rd = VllmDriver(FastEngine, case), VllmDriver(ProbedReference, case)
    fast, _ = assert_engines_agree(fd, rd, case.spec.kv_capacity)
    assert len({c[0] for c in fast}) == len(fast) == len(fd.reqs)  # each request ends once
    probe: Counter[str] = Counter()
    for e in rd.engines:
        probe.update(e.probe)
    reached = {name: n > 0 for name, n in probe.items()}
    reached["preempted"] = sum(e.retractions for e in fd.engines) > 0
    reached["aborted with partial output"] = fd.hits["aborted with partial output"] > 0
    reached["paused a busy engine"] = fd.hits["paused a busy engine"] > 0
    reached["preemptions"] = sum(e.retractions for e in fd.engines)  # type: ignore[assignment]
    return reached


def _count(into: Counter[str], reached: dict[str, bool]) -> None:
    into["examples"] += 1
    target(float(reached.pop("preemptions")), label="preemptions")
    for name, hit in reached.items():
        if hit:
            event(name)
            into[name] += 1


# KV pressure on a small engine: 12 requests of 3 prompts (200 tokens, some carrying 150 tokens
# of their sample's output) growing to 600 tokens in 1,600 KV tokens with a 64-token budget:
# mixed steps, chunked prefills, preemptions and readmissions; an update at 1.5 s aborts with
# partial output and resubmits, the resumed samples hitting their own cached blocks.
PRESSURE = VllmCase(
    vllm_spec(SMALL_COST, 1_600, 8, max_num_batched_tokens=64),
    1, "round_robin",
    [(0.0, rid, 200 + (150 if rid % 4 == 3 else 0), 400, 400 - 20 * rid) for rid in range(12)],
    [(1.5, "update", 0.2), (2.5, "pause", 0.3)], [], False,
    prompt_of={rid: rid % 3 for rid in range(12)},
    carried_of={rid: 150 if rid % 4 == 3 else 0 for rid in range(12)})

# The users' scale on one engine: 64 requests of 8-request groups, 2,000-token prompts, 16k caps
# (half run to it) in 120k KV tokens under vLLM's default budget; an update at 30 s.
AT_SCALE = VllmCase(
    vllm_spec(PRESET.cost, 120_000, 256, max_num_batched_tokens=8_192),
    1, "round_robin",
    [(0.0, rid, 2_000, 16_384, 16_384 if rid % 2 else 1_000 + 97 * rid) for rid in range(64)],
    [(30.0, "update", 1.0)], [], False,
    prompt_of={rid: rid // 8 for rid in range(64)})


@settings(max_examples=SMALL_EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@example(PRESSURE)
@given(small_vllm_cases())
def _small_engines_agree(case: VllmCase) -> None:
    _count(REACHED, _run(case))


@settings(max_examples=SCALE_EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@example(AT_SCALE)
@given(scale_vllm_cases())
def _engines_agree_at_scale(case: VllmCase) -> None:
    _count(REACHED_SCALE, _run(case))


def test_the_explicit_cases_reach_what_the_properties_assert():
    """The `@example` cases alone reach every asserted case (hypothesis may draw others in CI)."""
    small = _run(PRESSURE)
    for name in SMALL_SHARES:
        assert small.get(name), (name, small)
    big = _run(AT_SCALE)
    for name in SCALE_CASES:
        assert big.get(name), (name, big)


def test_fast_engine_matches_reference_under_vllm_rules():
    REACHED.clear()
    _small_engines_agree()
    n = REACHED["examples"]
    assert n >= SMALL_EXAMPLES // 2, REACHED
    shares = {k: REACHED[k] / n for k in REACHED if k != "examples"}
    print("vllm small examples reached:", {k: round(v, 2) for k, v in sorted(shares.items())})
    for name, least in SMALL_SHARES.items():
        assert shares.get(name, 0.0) >= least, (name, shares)


def test_fast_engine_matches_reference_under_vllm_rules_at_scale():
    REACHED_SCALE.clear()
    _engines_agree_at_scale()
    n = REACHED_SCALE["examples"]
    print("vllm examples at scale reached:", dict(REACHED_SCALE))
    assert n >= SCALE_EXAMPLES // 2, REACHED_SCALE
    for name in SCALE_CASES:
        assert REACHED_SCALE[name] >= 1, (name, REACHED_SCALE)


@pytest.mark.parametrize("name", ["sync", "april", "fully_async"])
def test_whole_runs_agree_under_vllm_rules(name):
    """A whole run under `[cluster] family = "vllm"` on a tight KV cache (5,000 tokens, 3,072-
    token cap: preemptions) is the same run on the fast engine and on the reference engine, for
    a scheduler that waits for its batch, one that aborts and resumes (APRIL) and one that
    interrupts on updates (fully_async)."""
    sc = small_scenario(engines=2, batch=6, group=4, max_len=3072, steps=3, seed=4)
    sc = sc.model_copy(update={"cluster": sc.cluster.model_copy(
        update={"family": "vllm", "kv_capacity": 5_000, "max_num_batched_tokens": 512})})
    fast = run(sc, name, {})
    ref = run(sc, name, {}, engine_factory=ReferenceEngine)
    _assert_same_run(fast, ref)
    assert sum(r.retractions for r in fast.result.steps) > 0, "the KV cache never ran out"


def test_simulate_runs_the_vllm_family_from_the_command_line(tmp_path):
    """`aprilsim simulate --set cluster.family=vllm` runs end to end, with vLLM's keys settable,
    and differs from the same scenario under SGLang's rules; a bad key gives one line, exit 2."""
    s = tmp_path / "s.toml"
    s.write_text(TINY)
    vllm = aprilsim("simulate", s, "--set", "cluster.family=vllm", "--set",
                    "cluster.max_num_batched_tokens=1024", "--json")
    assert vllm.returncode == 0, vllm.stderr
    sglang = aprilsim("simulate", s, "--json")
    rows_v, rows_s = json.loads(vllm.stdout), json.loads(sglang.stdout)
    assert [r["scheduler"] for r in rows_v] == ["sync", "april"]
    assert all(r["rollout_throughput_tok_s"] > 0 for r in rows_v)
    assert [r["rollout_throughput_tok_s"] for r in rows_v] != [
        r["rollout_throughput_tok_s"] for r in rows_s]
    bad = aprilsim("simulate", s, "--set", "cluster.family=vllm", "--set",
                   "cluster.max_num_batched_tokens=0")
    assert bad.returncode == 2 and "max_num_batched_tokens" in bad.stderr + bad.stdout
    assert "Traceback" not in bad.stderr + bad.stdout
