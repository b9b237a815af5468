"""The adapter through the real sglang-router (PyPI ``sglang-router``) in front of two servers."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

from conftest import VOCAB, run
from real_scenarios import replay_request, scenario_abort_and_resume, scenario_generate_replay

from real.clients.sglang import SGLangClient


def _total_requests(url: str) -> int:
    with urllib.request.urlopen(url + "/server_info", timeout=5) as r:
        return json.loads(r.read())["internal_states"][0]["total_requests"]


def test_worker_discovery_through_router(router, servers):
    async def main():
        async with SGLangClient(router.url) as c:
            return await c.workers(), await c.server_info(), await c.health()

    workers, info, healthy = run(main())
    assert sorted(workers) == sorted(s.url for s in servers)
    assert info.max_running_requests == 16 and info.kv_capacity_tokens == 2 * 8 * 2048
    assert healthy


def test_generation_through_router_reaches_both_workers(router, servers):
    before = [_total_requests(s.url) for s in servers]

    async def main():
        async with SGLangClient(router.url) as c:
            await scenario_generate_replay(c, VOCAB)
            return await asyncio.gather(*(c.generate(replay_request(i, 6, 12, 12, VOCAB))
                                          for i in range(6)))

    rs = run(main())
    assert all(len(r.output_ids) == 12 and r.error is None for r in rs)
    after = [_total_requests(s.url) for s in servers]
    assert sum(after) - sum(before) == 9
    assert all(a > b for a, b in zip(after, before, strict=True))  # round robin used both


def test_router_does_not_proxy_abort(router):
    """Why abort fans out to workers: the router answers /abort_request with an error."""
    req = urllib.request.Request(router.url + "/abort_request", method="POST",
                                 data=json.dumps({"rid": "", "abort_all": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            status = r.status
    except urllib.error.HTTPError as e:
        status = e.code
    assert status >= 400


def test_abort_fans_out_to_workers_then_resume(router, servers):
    async def main():
        async with SGLangClient(router.url) as c:
            async def busy():
                loads = await asyncio.gather(*(c.loads(s.url) for s in servers))
                return sum(ld["num_running_reqs"] + ld["num_waiting_reqs"] for ld in loads)

            return await scenario_abort_and_resume(c, VOCAB, n=10, length=600, min_running=8,
                                                   loads_of=busy)

    first, second = run(main())
    assert sum(len(r.output_ids) > 0 for r in first) >= 8
