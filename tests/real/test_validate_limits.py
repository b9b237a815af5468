"""The engines' limits and family a validate takes from the engine it connects to (issue 34,
item 4): vLLM's concurrency probed where the server does not report it, its KV blocks, its
``max_num_batched_tokens`` where dev mode reports it, and a warning when the engine's own metrics
show more requests running than the simulation assumed."""

from __future__ import annotations

from types import SimpleNamespace

from conftest import run
from vllm_fake import FakeVLLM

from aprilsim.config import load_scenario
from aprilsim.engine.cost import PRESETS
from aprilsim.validate.scaled import matched_engine
from real.clients.vllm import VLLMEngine
from real.runner.options import EngineTarget
from real.validate_limits import engine_limits, probe_need


def _opts(url: str, **kw):
    return SimpleNamespace(target=EngineTarget(engines=(f"vllm+{url}",)), max_running=None, **kw)


def test_vllm_s_concurrency_is_probed_and_its_blocks_read():
    """A vLLM that runs 6 requests at once and reports 512 blocks of 16 tokens: the probe of 16
    overlapping requests sees 6 (and aborts the rest); the KV capacity and blocks come from its
    metrics; its family is vLLM's."""
    async def main():
        async with FakeVLLM(max_running=6, step_s=0.005) as fake:  # a wave outlasts the settle
            e = VLLMEngine(fake.url)
            try:
                limits, notes, facts = await engine_limits(e, _opts(fake.url), 16, 1000)
            finally:
                await e.close()
            return limits, notes, facts, fake
    limits, notes, facts, fake = run(main())
    assert limits["max_running"] == 6 and facts["max_running_source"].startswith("probed: 16")
    assert limits["kv_capacity"] == 512 * 16 and limits["family"] == "vllm"
    assert "retract_to" not in limits  # vLLM's rules preempt the last running request, to the head
    assert facts["family"] == "vllm" and any("engine family vllm" in n for n in notes)
    assert any("512 blocks of 16 tokens" in n for n in notes)
    assert any("max_num_batched_tokens: not reported" in n for n in notes)
    assert len(fake.aborted) > 0  # the probe did not wait for 512 tokens of every request


def test_given_or_reported_limits_are_not_probed():
    async def main():
        async with FakeVLLM(max_running=6, step_s=0.005) as fake:  # a wave outlasts the settle
            e = VLLMEngine(fake.url)
            try:
                got = await engine_limits(e, SimpleNamespace(target=EngineTarget(engines=("x",)),
                                                             max_running=40), 16, 1000)
            finally:
                await e.close()
            return got, len(fake.bodies)
    (limits, _, facts), requests = run(main())
    assert limits["max_running"] == 40 and facts["max_running_source"] == "--max-running"
    assert requests == 0


def test_dev_mode_s_scheduler_config_gives_the_step_budget(monkeypatch):
    """vLLM in dev mode reports its scheduler config: max_num_seqs is the concurrency and
    max_num_batched_tokens the simulated vLLM family's step budget."""
    async def fake_request(self, method, path, body=None):
        if path.startswith("/server_info"):
            return 200, {"vllm_config": {"scheduler_config": {"max_num_seqs": 96,
                                                              "max_num_batched_tokens": 2048}}}
        return await orig(self, method, path, body)
    orig = VLLMEngine._request
    monkeypatch.setattr(VLLMEngine, "_request", fake_request)

    async def main():
        async with FakeVLLM(max_running=6, step_s=0.005) as fake:  # a wave outlasts the settle
            e = VLLMEngine(fake.url)
            try:
                return await engine_limits(e, _opts(fake.url), 16, 1000)
            finally:
                await e.close()
    limits, notes, facts = run(main())
    assert limits["max_running"] == 96 and facts["max_running_source"] == "reported by the server"
    assert limits["max_num_batched_tokens"] == 2048 and "max_prefill_tokens" not in limits
    spec = matched_engine(PRESETS["qwen3-4b-h100-tp2"].cost, **limits)
    assert spec.family.max_num_batched_tokens == 2048  # the simulation's step budget
    assert any("max_num_batched_tokens 2048: reported" in n for n in notes)


def test_the_probe_holds_as_many_requests_as_the_runs_may():
    sc = load_scenario("experiments/scenarios/validate_live.toml")
    assert probe_need(sc, ["sync"], 1) == 2 * 8 * 4  # a step ahead
    assert probe_need(sc, ["april@ratio=3"], 2) == 3 * 8 * 4 // 2
    assert probe_need(sc.model_copy(update={"batch_size": 512}), ["sync"], 1) == 512  # capped


def test_more_running_than_assumed_is_warned():
    """The issue's case: the simulation assumed 64 running requests, vLLM's metrics showed 96."""
    from real.validate_report import running_warnings

    o = SimpleNamespace(label="april@ratio=3", round=0, running=[[(0.1, 40, 0), (0.2, 96, 3)]])
    v = SimpleNamespace(limits={"max_running": 64}, live=[o],
                        facts={"max_running_source": "probed: all 64 requests ran together"})
    (w,) = running_warnings(v)
    assert "up to 96 requests running at once (in 1 run(s))" in w and "assumed max_running 64" in w
    assert "--max-running 96" in w
    v.limits["max_running"] = 96
    assert running_warnings(v) == []
