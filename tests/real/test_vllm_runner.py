"""The live runner on vLLM engines: ``vllm+http://`` URLs through
:func:`real.clients.connect.connect`, two fake vLLM servers (one in dev mode, one without weight
endpoints), same records as simulate."""

from __future__ import annotations

import pytest
from conftest import VOCAB, run
from runner_helpers import assert_batches, assert_ledger, live_run, tiny_scenario
from vllm_fake import FakeVLLM

from aprilsim.sim.run import simulate
from real.clients.connect import connect, split_engine_url
from real.clients.sglang import SGLangClient
from real.clients.vllm import VLLMEngine
from real.protocol import WeightSync
from real.runner.cluster import Cluster


def test_connect_picks_the_adapter_by_url():
    assert split_engine_url("vllm+http://h:8000/") == ("vllm", "http://h:8000")
    assert split_engine_url("http://h:30000") == ("sglang", "http://h:30000")
    assert split_engine_url("sglang+https://h") == ("sglang", "https://h")
    v, s = connect("vllm+http://h:8000"), connect("http://h:30000")
    assert isinstance(v, VLLMEngine) and v.url == "http://h:8000" and isinstance(v, WeightSync)
    assert isinstance(s, SGLangClient)


@pytest.mark.parametrize("name", ["sync", "april"])
def test_runner_on_fake_vllm_servers(name):
    async def main():
        async with FakeVLLM(vocab=VOCAB, eos=VOCAB - 1, dev=True) as a, \
                FakeVLLM(vocab=VOCAB, eos=VOCAB - 1) as b:
            urls = [f"vllm+{a.url}", f"vllm+{b.url}"]
            cluster = Cluster([connect(u) for u in urls], names=urls)
            try:
                case = await live_run(tiny_scenario(steps=2), name, cluster, vocab=VOCAB)
            finally:
                await cluster.close()
            assert a.finished and b.finished and a.weight_version == "2"
            return case

    case = run(main())
    assert_ledger(case)
    assert_batches(case)
    r = case.run.result
    if name == "sync":
        sim = simulate(case.scenario, "sync")
        assert [s.trained_tokens for s in r.steps] == [s.trained_tokens for s in sim.steps]
    else:  # discards: only groups completing with the N-th (slime drops them)
        dropped = sum(s.scheduler_stats.get("dropped_groups", 0) for s in r.steps)
        assert r.end_state["samples_discarded"] == dropped * case.scenario.group_size
