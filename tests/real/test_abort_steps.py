"""`aprilsim validate` lands simulated aborts and re-queues retracted requests as the live
engine family does; the rules are stated once, by the family objects
(``aprilsim.engine.families``: SGLang's are its presets' ``SGLANG_RULES["family"]``)."""

from __future__ import annotations

from dataclasses import replace

from aprilsim.engine.cost import PRESETS, SGLANG_RULES
from aprilsim.engine.families import FAMILIES, make_family
from aprilsim.validate.scaled import matched_engine
from real.clients.connect import engine_family, stamped
from real.clients.sglang import SGLangClient
from real.clients.vllm import VLLMEngine
from real.validate import engine_rules


def test_engine_family_from_the_client_and_the_server_version():
    sglang, vllm = SGLangClient("http://127.0.0.1:9"), VLLMEngine.__new__(VLLMEngine)
    assert engine_family(sglang, "0.5.23") == "sglang"
    assert engine_family(sglang, None) == "sglang"
    assert engine_family(object(), None) == "sglang"  # an unknown client: SGLang's API
    assert engine_family(sglang, "aprilsim-torch-0.2") == "bundled"  # python -m real.serve
    assert engine_family(object(), "aprilsim-torch-local") == "bundled"  # in-process
    assert engine_family(vllm, None) == "vllm"
    assert engine_family(stamped(vllm), None) == "vllm"  # through validate's stamping wrapper


def test_abort_steps_and_retraction_by_engine_family():
    assert engine_rules(object(), "aprilsim-torch-0.2") == {
        "family": "bundled", "retract_to": "tail", "abort_steps": 0, "prefix_cache": "none"}
    assert engine_rules(object(), "0.5.23") == {
        "family": "sglang", "retract_to": "tail", "abort_steps": 1,
        "prefix_cache": "lru",  # the radix cache,
        "prefix_cache_flush": False,  # validate's syncs only relabel: the live cache stays
        "prefix_cache_block": 1}  # token by token
    assert engine_rules(VLLMEngine.__new__(VLLMEngine), None) == {
        "family": "vllm", "abort_steps": 0, "prefix_cache": "lru", "prefix_cache_flush": False,
        "prefix_cache_block": 16,  # whole KV blocks (vLLM's default block size)
        "max_num_batched_tokens": 8192, "enable_prefix_caching": True,  # vLLM's defaults
        "enable_chunked_prefill": True, "watermark": 0.0, "scheduler_reserve_full_isl": True}


def test_sglangs_rules_are_stated_once():
    """What validate simulates an SGLang engine with is what every SGLang preset runs, and the
    matched engine of each family runs that family's rules."""
    sglang = make_family("sglang")
    assert SGLANG_RULES["family"] == sglang
    for name, spec in PRESETS.items():
        if spec.sglang_ratio:  # the presets that run SGLang's rules
            assert spec.family == sglang, name
    for name in FAMILIES:  # every family's rules make a valid engine, its aborts a step late
        assert not replace(PRESETS["qwen3-4b-h100-tp2"], family=make_family(name)).aborts_at_once
    for engine, version in ((object(), "0.5.23"), (object(), "aprilsim-torch-0.2"),
                            (VLLMEngine.__new__(VLLMEngine), None)):
        limits = engine_rules(engine, version)
        spec = matched_engine(PRESETS["qwen3-4b-h100-tp2"].cost, max_running=8,
                              kv_capacity=10_000, **limits)
        assert spec.family == make_family(limits["family"]), limits
        assert spec.family.rules(spec).family == limits["family"]


def test_the_bundled_engine_runs_sglangs_rules_from_the_same_table():
    from real.torch_engine import EngineConfig

    cfg = EngineConfig()
    assert (cfg.init_new_token_ratio, cfg.min_new_token_ratio_factor,
            cfg.new_token_ratio_decay_steps, cfg.retract_decode_steps,
            cfg.clip_max_new_tokens) == tuple(SGLANG_RULES[k] for k in (
                "new_token_ratio", "min_new_token_ratio_factor", "new_token_ratio_decay_steps",
                "retract_decode_steps", "clip_max_new_tokens"))
