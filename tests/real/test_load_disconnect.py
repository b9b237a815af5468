"""Clients that go away: their requests are aborted and every slot and KV token comes back."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator

import aiohttp
import pytest
from conftest import Proc, run, start_server
from http_util import internal


@pytest.fixture(scope="module")
def server(tmp_logs) -> Iterator[Proc]:
    # A KV budget small enough that the load test also exercises retraction.
    p = start_server(tmp_logs, "--kv-budget-tokens", "1500")
    try:
        yield p
    finally:
        p.stop()


async def _wait_drained(url: str, timeout: float) -> tuple[float, dict]:
    t0 = time.monotonic()
    while True:
        state = internal(url)
        if state["num_in_flight"] == 0 and state["num_running_reqs"] == 0 \
                and state["num_waiting_reqs"] == 0:
            return time.monotonic() - t0, state
        if time.monotonic() - t0 > timeout:
            return float("inf"), state
        await asyncio.sleep(0.02)


def test_non_streaming_client_disconnect_aborts_its_request(server):
    """Before: the request ran to completion holding its slot (1500 tokens here, ~6 s+)."""
    body = {"input_ids": [9, 10, 11], "sampling_params": {"max_new_tokens": 1500,
                                                          "ignore_eos": True}}

    async def main():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.5)) as s:
            with pytest.raises(asyncio.TimeoutError):
                async with s.post(server.url + "/generate", json=body) as r:
                    await r.read()
        return await _wait_drained(server.url, timeout=10)

    took, state = run(main())
    assert took < 2.0, state
    assert state["kv_used_tokens"] == 0 and state["free_slots"] == 8


def test_many_clients_some_disconnecting_free_every_slot_and_kv_token(server):
    rng = random.Random(5)
    n = 40
    plans = [{"stream": rng.random() < 0.5, "drop": rng.random() < 0.35,
              "ignore_eos": rng.random() < 0.7, "max_new": rng.randint(20, 300),
              "prompt": [rng.randrange(3, 500) for _ in range(rng.randint(5, 60))]}
             for _ in range(n)]

    async def client(s: aiohttp.ClientSession, p: dict) -> tuple[str, int]:
        body = {"input_ids": p["prompt"], "stream": p["stream"], "sampling_params": {
            "max_new_tokens": p["max_new"], "ignore_eos": p["ignore_eos"]}}
        if p["drop"] and not p["stream"]:
            try:
                await asyncio.wait_for(s.post(server.url + "/generate", json=body), timeout=0.3)
            except asyncio.TimeoutError:
                return "dropped", 0
        async with s.post(server.url + "/generate", json=body) as r:
            assert r.status == 200
            if not p["stream"]:
                return "done", len((await r.json())["output_ids"])
            chunks = 0
            async for line in r.content:
                if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                    chunks += 1
                    if p["drop"] and chunks == 3:
                        r.close()  # the client disconnects mid-stream
                        return "dropped", 0
            return "done", -1

    async def main():
        async with aiohttp.ClientSession() as s:
            results = await asyncio.gather(*(client(s, p) for p in plans))
        return results, await _wait_drained(server.url, timeout=20)

    results, (took, state) = run(main())
    assert took < 20, state
    assert state["kv_used_tokens"] == 0 and state["free_slots"] == 8, state
    assert state["step_errors"] == 0
    for p, (kind, got) in zip(plans, results, strict=True):
        if kind == "done" and not p["stream"] and p["ignore_eos"]:
            assert got == p["max_new"]
    assert sum(k == "dropped" for k, _ in results) >= 5
