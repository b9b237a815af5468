"""Opt-in: the same adapter scenarios against a real SGLang server or router.

Set ``APRILSIM_SGLANG_URL`` (e.g. ``http://127.0.0.1:30000``, a router or one server) to run
them; docs/real.md has a script that starts SGLang servers and sglang-router on a GPU node.
Prompts use ordinary token ids below ``APRILSIM_SGLANG_VOCAB`` (default 30000).
"""

from __future__ import annotations

import os

import pytest
from conftest import run
from real_scenarios import scenario_abort_and_resume, scenario_generate_replay

from real.clients.sglang import SGLangClient

URL = os.environ.get("APRILSIM_SGLANG_URL")
VOCAB = int(os.environ.get("APRILSIM_SGLANG_VOCAB", "30000"))

pytestmark = [pytest.mark.live,
              pytest.mark.skipif(not URL, reason="APRILSIM_SGLANG_URL not set")]


def test_live_health_and_server_info():
    async def main():
        async with SGLangClient(URL) as c:
            return await c.health(), await c.workers(), await c.server_info()

    ok, workers, info = run(main())
    assert ok and workers
    assert info.max_running_requests is None or info.max_running_requests > 0
    assert info.kv_capacity_tokens is None or info.kv_capacity_tokens > 0


def test_live_generate_replay():
    async def main():
        async with SGLangClient(URL) as c:
            await scenario_generate_replay(c, VOCAB)

    run(main())


def test_live_abort_and_resume():
    async def main():
        async with SGLangClient(URL) as c:
            async def busy():
                loads = [await c.loads(w) for w in await c.workers()]
                return sum(ld["num_running_reqs"] + ld["num_waiting_reqs"] for ld in loads if ld)

            await scenario_abort_and_resume(c, VOCAB, n=16, length=4000, min_running=4,
                                            loads_of=busy)

    run(main())
