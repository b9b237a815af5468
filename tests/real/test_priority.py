"""Request priority live (issue 21, Seer): on the wire to SGLang, and in the bundled engine, which
orders its waiting queue by it with --enable-priority-scheduling as SGLang does."""

from __future__ import annotations

import pytest
from runner_helpers import run_local, tiny_scenario

from real.clients.sglang_wire import generate_payload
from real.protocol import GenerateRequest
from real.torch_engine import BatchEngine, EngineConfig, EngineRequest, ModelConfig, TinyDecoder
from real.torch_engine.generate_api import parse_generate
from real.torch_engine.sampling import ParamError

CFG = ModelConfig(vocab_size=128, d_model=32, n_layers=1, n_heads=2, max_context=256)


def test_payload_carries_priority_only_when_set():
    plain = generate_payload(GenerateRequest((20, 21), 4), "r0")
    assert "priority" not in plain
    assert generate_payload(GenerateRequest((20, 21), 4, priority=7), "r1")["priority"] == 7


def test_bundled_server_parses_priority():
    req, _ = parse_generate({"input_ids": [20, 21], "priority": 3}, 128, None)
    assert req.priority == 3
    with pytest.raises(ParamError, match="priority"):
        parse_generate({"input_ids": [20, 21], "priority": "high"}, 128, None)


@pytest.mark.parametrize("enabled", [True, False])
def test_bundled_engine_admits_by_priority_when_enabled(enabled):
    eng = BatchEngine(TinyDecoder.random(CFG, seed=1),
                      EngineConfig(max_running_requests=1, enable_priority_scheduling=enabled))
    for rid, p in [("a", 0), ("b", 0), ("c", 5), ("d", 5), ("e", -1)]:
        eng.add(EngineRequest(rid, [20, 21, 22], 2, ignore_eos=True, temperature=0.0, priority=p))
    order = [r.rid for r in eng.waiting]
    assert order == (["c", "d", "a", "b", "e"] if enabled else ["a", "b", "c", "d", "e"])


def test_seer_live_sends_priorities_and_stays_on_policy():
    c = run_local(tiny_scenario(), "seer", {"chunk": 12})
    r = c.run.result
    assert r.summary()["offpolicy_token_fraction"] == 0.0
    assert sum(s.scheduler_stats.get("pieces_resent", 0) for s in r.steps) > 0


def test_live_most_room_spreads_one_send_by_requests_outstanding_or_picked():
    """Live `MOST_ROOM`: the slot with the fewest requests outstanding or already chosen for the
    same send (a send's requests are chosen before any starts), ties to the lowest index."""
    from real.runner.cluster import Cluster

    cluster = Cluster([object(), object(), object()], ["a", "b", "c"], progress_deadline_s=None)
    cluster.slots[0].outstanding = 2
    choose = cluster.most_room()
    got = [choose(GenerateRequest((1, 2), 4)).name for _ in range(5)]
    assert got == ["b", "c", "b", "c", "a"]
    cluster.slots[1].alive = False
    assert cluster.most_room()(GenerateRequest((1,), 1)).name == "c"  # picked: c 2, a 3 (2+1)
