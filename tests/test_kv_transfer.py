"""Seer's migration with a transfer cost (issue 38): the KV of a resumed piece crosses a
Mooncake-style pool (`[cluster] kv_transfer`), the piece starts once it has arrived, routing by
room counts what is on its way, and `sync@dispatch=group` is veRL's group-level dispatch."""

from __future__ import annotations

import math

import pytest
from sched_helpers import small_scenario as helper_scenario

from aprilsim.config import ScenarioError, default_scenario
from aprilsim.conformance import small_scenario
from aprilsim.engine.cost import PRESETS, CostModel, EngineSpec
from aprilsim.engine.kv_transfer import (
    MOONCAKE_GB_S_PER_GPU,
    KvTransferSpec,
    kv_bytes_of,
    transfer_delay,
)
from aprilsim.metrics.trace import Trace
from aprilsim.sim.build import build_simulation
from aprilsim.simulate_cli import apply_sets

ONE_LONG = {"family": "lognormal", "mu": 7.6, "sigma": 0.01}  # one response of ~2,000 tokens


def test_presets_carry_the_kv_bytes_of_their_model_shape():
    """Per GPU and token: layers x KV heads per GPU x head size x (K, V) x bf16 bytes."""
    assert PRESETS["qwen3-4b-h100-tp2"].kv_bytes_per_token == 36 * 4 * 128 * 2 * 2
    assert PRESETS["qwen3-8b-h100-tp1"].kv_bytes_per_token == 36 * 8 * 128 * 2 * 2
    assert PRESETS["qwen3-4b-mi300x-tp2"].kv_bytes_per_token == 36 * 4 * 128 * 2 * 2
    assert all(p.kv_bytes_per_token > 0 for p in PRESETS.values())


def test_a_preset_without_kv_bytes_estimates_them_from_its_kv_read_cost():
    """c prices reading one token's KV; at the presets' 70 % of 3.35 TB/s that is the bytes."""
    spec = EngineSpec(cost=CostModel(a=0.004, b=2e-5, c=73_728 / (0.7 * 3.35e12), p0=0.01,
                                     p1=1e-6))
    assert math.isclose(kv_bytes_of(spec), 73_728)


@pytest.mark.parametrize("pool,hops", [("global", 2), ("p2p", 1), ("free", 0)])
def test_delay_is_hops_times_latency_plus_bytes_over_bandwidth(pool, hops):
    kt = KvTransferSpec(pool=pool, bandwidth_gb_s=10.0, latency_s=0.002)
    assert kt.hops == hops
    assert math.isclose(kt.delay(16_384, 73_728), hops * (0.002 + 16_384 * 73_728 / 10e9))
    assert kt.delay(0, 73_728) == 0.0
    own = KvTransferSpec(pool=pool, bandwidth_gb_s=10.0, latency_s=0.0, bytes_per_token=100.0)
    assert math.isclose(own.delay(1000, 73_728), hops * 1000 * 100 / 10e9)  # its own bytes win


def test_the_default_is_a_global_pool_at_mooncakes_bandwidth_per_gpu():
    spec = default_scenario().engine_spec()
    assert spec.kv_transfer == KvTransferSpec()
    assert spec.kv_transfer.pool == "global" and spec.kv_transfer.bandwidth_gb_s == 190 / 8
    assert MOONCAKE_GB_S_PER_GPU == 23.75
    # a 16k-token Qwen3-4B piece: 1.2 GB per GPU, ~51 ms per hop, two hops
    assert 0.1 < transfer_delay(spec, 16_384) < 0.11


@pytest.mark.parametrize("bad,msg", [
    ({"pool": "disk"}, "pool"),
    ({"bandwidth_gb_s": 0}, "bandwidth_gb_s"),
    ({"latency_s": -1}, "latency_s"),
    ({"bytes_per_token": -5}, "bytes_per_token"),
    ({"speed": 3}, "speed"),
])
def test_bad_kv_transfer_keys_give_one_line_errors(bad, msg):
    with pytest.raises(ScenarioError, match=msg) as e:
        small_scenario(cluster={"kv_transfer": bad}).engine_spec()
    assert "\n" not in str(e.value)


def _one_sample_run(kt: dict, chunk: int = 300):
    sc = small_scenario(engines=1, batch=1, group=1, steps=1, warmup=0, lengths=ONE_LONG,
                        cluster={"kv_transfer": kt})
    sim = build_simulation(sc, "seer", settings={"chunk": chunk})
    return sim.run(), sim


@pytest.mark.parametrize("pool,hops", [("p2p", 1), ("global", 2)])
def test_each_resumed_piece_waits_for_its_kv(pool, hops):
    """One response in pieces on one engine: nothing overlaps a transfer, so the rollout is
    longer by exactly hops x latency per resumed piece (bandwidth made free), and the pieces
    still prefill nothing they carry."""
    free, sim_free = _one_sample_run({"pool": "free"})
    paid, sim_paid = _one_sample_run({"pool": pool, "latency_s": 0.25, "bandwidth_gb_s": 1e6})
    (g,) = sim_free.groups.values()
    length = g.samples[0].generated
    resumed = math.ceil(length / 300) - 1
    assert resumed >= 5
    extra = paid.steps[0].rollout_time_s - free.steps[0].rollout_time_s
    assert math.isclose(extra, resumed * hops * 0.25, rel_tol=1e-6)
    moved = [sum(e.stats.migrated_tokens for e in s.engines) for s in (sim_free, sim_paid)]
    assert moved[0] == moved[1] > 0


def test_bandwidth_term_scales_with_what_the_piece_carries():
    """Bandwidth only: the extra time is the carried tokens over all resumed pieces."""
    free, sim = _one_sample_run({"pool": "free"})
    bw = 0.05  # GB/s: slow enough to see, one hop
    paid, _ = _one_sample_run({"pool": "p2p", "latency_s": 0.0, "bandwidth_gb_s": bw})
    (g,) = sim.groups.values()
    s = g.samples[0]
    carried = [s.prompt_len + k * 300 - 1 for k in range(1, math.ceil(s.generated / 300))]
    want = sum(carried) * 73_728 / (bw * 1e9)
    got = paid.steps[0].rollout_time_s - free.steps[0].rollout_time_s
    assert math.isclose(got, want, rel_tol=1e-6)


def _with_pool(sc, **kt):
    table = ",".join(f"{k}={v!r}".replace("'", '"') for k, v in kt.items())
    return apply_sets(sc, (f"cluster.kv_transfer={{{table}}}",))


def test_an_abort_drops_pieces_whose_kv_is_on_its_way():
    """A slow pool under APRIL-style aborts would lose pieces in transit; seer never aborts, so
    a slow pool only delays: every sample is trained, nothing wasted, all tokens generated."""
    sc = _with_pool(helper_scenario(steps=3), pool="global", latency_s=2.0)
    res = build_simulation(sc, "seer", settings={"chunk": 200}).run()
    base = build_simulation(helper_scenario(steps=3), "seer", settings={"chunk": 200}).run()
    s, b = res.summary(), base.summary()
    assert s["trained_samples"] == b["trained_samples"] > 0 and s["wasted_tokens"] == 0
    assert s["generated_tokens"] == b["generated_tokens"]
    assert s["mean_rollout_time_s"] > b["mean_rollout_time_s"]


def test_routing_by_room_counts_pieces_on_their_way():
    """Pieces sent one by one while earlier ones are in transit spread over the engines: the
    engine that will receive them counts them as queued (else they all pick the same one, and
    the default scenario's seer lost 9 % of its throughput to a 50 ms transfer)."""
    sc = default_scenario().model_copy(update={"steps": 3, "warmup_steps": 1})
    runs = {pool: build_simulation(_with_pool(sc, pool=pool), "seer").run().summary()
            for pool in ("free", "global")}
    assert runs["global"]["engine_busy_fraction"] > runs["free"]["engine_busy_fraction"] - 0.01
    ratio = runs["global"]["rollout_throughput_tok_s"] / runs["free"]["rollout_throughput_tok_s"]
    assert 0.98 < ratio <= 1.0


def test_group_dispatch_is_sync_on_the_group_affinity_router():
    """`sync@dispatch=group` (veRL's dispatch) places exactly as the group-affinity router."""
    sc = helper_scenario(steps=3, engines=3)
    a = build_simulation(sc, "sync", settings={"dispatch": "group"}).run().summary()
    grouped = helper_scenario(steps=3, engines=3, router="group_affinity")
    b = build_simulation(grouped, "sync").run().summary()
    assert a == b
    c = build_simulation(sc, "sync").run().summary()
    assert c["mean_rollout_time_s"] != a["mean_rollout_time_s"]  # round robin differs


def test_group_dispatch_keeps_each_group_on_one_engine():
    sc = helper_scenario(steps=2, engines=3)
    trace = Trace("sync", 3)
    build_simulation(sc, "sync", settings={"dispatch": "group"}, trace=trace).run()
    homes: dict[int, set[int]] = {}
    for span in trace.requests:
        homes.setdefault(span.group_id, set()).add(span.engine)
    assert homes and all(len(e) == 1 for e in homes.values())
    assert len({next(iter(e)) for e in homes.values()}) == 3  # groups spread over all engines


def test_bad_dispatch_is_refused():
    with pytest.raises(ValueError, match="dispatch"):
        build_simulation(helper_scenario(steps=2), "sync", settings={"dispatch": "verl"})
