"""Agentic episodes on live engines (issue 37): the runner drives turns against two bundled
`python -m real.serve` servers, tool calls as timed waits whose output ids join the context of
the next turn, with the simulator's records: the ledger balances, every trained episode ran its
whole plan, and a sync run trains what `aprilsim simulate` trains."""

from __future__ import annotations

import pytest
from conftest import VOCAB, run
from runner_helpers import as_conformance_run, assert_batches, assert_ledger, live_run

from aprilsim.conformance import check_episodes, small_scenario
from aprilsim.sim.run import simulate
from real.clients.sglang import SGLangClient
from real.runner.cluster import Cluster
from real.samples import episode_context


def tiny_agentic(steps: int = 2):
    """Seconds on a CPU: ~12-token prompts, 2-3 turns of ~15 tokens, tool calls of 0.05-0.3 s
    returning 4-16 tokens, within the servers' 2,048-token context."""
    sc = small_scenario(
        name="tiny-agentic", steps=steps, warmup=0, batch=3, group=3, max_len=160,
        rewards=(1.0, 1.0), trainer={"base_s": 0.01, "per_token_s": 0.0, "sync_s": 0.01},
        lengths={"family": "lognormal", "mu": 2.7, "sigma": 0.4},
        prompts={"family": "lognormal", "mu": 2.5, "sigma": 0.3, "max_len": 32},
        cluster={"router": "group_hash"})
    data = sc.model_dump()
    data.pop("base_dir")
    data["workload"] = {"episodes": {"min_turns": 2, "max_turns": 3,
                                     "tool_s": {"low": 0.05, "high": 0.3},
                                     "tool_tokens": {"low": 4, "high": 16}}}
    from aprilsim.config import scenario_from_dict

    return scenario_from_dict(data)


@pytest.mark.parametrize("name", ["sync", "sync_turns", "april", "env_async"])
def test_episodes_on_two_bundled_servers(servers, name):
    sc = tiny_agentic()

    async def main():
        cluster = Cluster([SGLangClient(s.url) for s in servers], names=[s.url for s in servers])
        try:
            return await live_run(sc, name, cluster, vocab=VOCAB)
        finally:
            await cluster.close()

    case = run(main())
    assert_ledger(case)
    assert_batches(case)
    check_episodes(as_conformance_run(case), "live")
    r, rt = case.run.result, case.run.runtime
    trained = [s for g in rt.groups.values() for s in g.samples if s.status.value == "trained"]
    assert trained and all(s.episode.turn == len(s.episode._ends) - 1 for s in trained)
    assert sum(s.agent.tool_calls for s in r.steps) > 0
    assert all(b > 0 for b in r.steps[0].busy_by_engine_s)  # both servers ran turns
    for s in trained:  # what the last turn was sent: the prompt, then every turn and tool output
        ctx = episode_context(s, rt._ids[s.uid], VOCAB)
        assert len(ctx) == s.generated + s.episode.appended
    if name in ("sync", "sync_turns"):  # the very episodes the simulator trains
        sim = simulate(sc, name)
        assert [x.trained_tokens for x in r.steps] == [x.trained_tokens for x in sim.steps]
        assert [x.agent.trained_tool_tokens for x in r.steps] == \
            [x.agent.trained_tool_tokens for x in sim.steps]
        assert r.end_state == sim.end_state
