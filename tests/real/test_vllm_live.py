"""Opt-in: the adapter scenarios against a real vLLM OpenAI-compatible server.

Set ``APRILSIM_VLLM_URL`` (e.g. ``http://127.0.0.1:8000``) to run them; docs/real.md has the
launch command. Prompts use ordinary token ids below ``APRILSIM_VLLM_VOCAB`` (default 30000).
The weight tests need the server started with ``VLLM_SERVER_DEV_MODE=1`` and skip otherwise.
"""

from __future__ import annotations

import os

import pytest
from conftest import run
from real_scenarios import scenario_abort_and_resume, scenario_generate_replay

from aprilsim.types import FinishReason
from real.clients.vllm import VLLMEngine
from real.protocol import GenerateRequest, SamplingParams

URL = os.environ.get("APRILSIM_VLLM_URL")
VOCAB = int(os.environ.get("APRILSIM_VLLM_VOCAB", "30000"))

pytestmark = [pytest.mark.live,
              pytest.mark.skipif(not URL, reason="APRILSIM_VLLM_URL not set "
                                                 "(a vLLM server to test against)")]


def test_live_health_models_and_metrics():
    async def main():
        async with VLLMEngine(URL) as e:
            return await e.health(), await e.models(), await e.server_info(), await e.loads()

    ok, models, info, loads = run(main())
    assert ok and models and isinstance(models[0]["id"], str)
    assert info.max_context_length is None or info.max_context_length > 0
    assert info.kv_capacity_tokens is None or info.kv_capacity_tokens > 0
    assert loads is not None and loads["num_running_reqs"] >= 0


def test_live_generate_replay():
    async def main():
        async with VLLMEngine(URL) as e:
            await scenario_generate_replay(e, VOCAB)

    run(main())


def test_live_seeded_free_run_is_reproducible():
    async def main():
        async with VLLMEngine(URL) as e:
            r = GenerateRequest((100, 200, 300), 32, SamplingParams(temperature=1.0, seed=1234))
            return await e.generate(r), await e.generate(r)

    a, b = run(main())
    assert a.error is None and a.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
    assert a.output_ids == b.output_ids


def test_live_abort_and_resume():
    async def main():
        async with VLLMEngine(URL) as e:
            async def busy():
                ld = await e.loads()
                return ld["num_running_reqs"] + ld["num_waiting_reqs"]

            await scenario_abort_and_resume(e, VOCAB, n=16, length=2000, min_running=4,
                                            loads_of=busy)

    run(main())


def test_live_weight_version_in_dev_mode():
    async def main():
        async with VLLMEngine(URL) as e:
            if not await e.pause():
                pytest.skip("server not in VLLM_SERVER_DEV_MODE=1: "
                            "no /pause, /update_weight_version")
            assert await e.resume()
            await e.update_weights("aprilsim-live-1")
            assert await e.weight_version() == "aprilsim-live-1"

    run(main())
