"""Faults: a server killed mid-rollout, a stream cut off, a 503, an error chunk mid-stream.

In each case the adapter either re-queues the remainder (retry with resume) or returns the
partial output as a failed result; the tests check that no sample and no streamed token is lost.
"""

from __future__ import annotations

import asyncio

from conftest import VOCAB, run
from fault_proxy import FaultProxy, Faults
from real_scenarios import replay_request, wait_until

from aprilsim.types import FinishReason
from real.clients.sglang import ClientConfig, RetryPolicy, SGLangClient
from real.protocol import resume_request

FAST_RETRY = ClientConfig(retry=RetryPolicy(max_attempts=3, initial_backoff_s=0.02),
                          read_timeout_s=20, connect_timeout_s=2)


def test_server_killed_mid_rollout_returns_partials(fresh_server, servers):
    """Kill -9 the only server: every request returns failed-with-partial; resuming the
    partials elsewhere completes each sample to its exact length."""
    length, n = 600, 4
    reqs = [replay_request(500 + i, 10, length, length, VOCAB) for i in range(n)]
    streamed: list[list[int]] = [[] for _ in range(n)]

    async def main():
        async with SGLangClient(fresh_server.url, config=FAST_RETRY) as c:
            def cb(i):
                return lambda p: streamed[i].extend(p.new_ids)
            tasks = [asyncio.create_task(c.generate(r, cb(i))) for i, r in enumerate(reqs)]
            assert await wait_until(lambda: all(len(s) >= 20 for s in streamed), timeout=30)
            fresh_server.kill()
            first = await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)
        async with SGLangClient(servers[0].url) as c2:
            second = await asyncio.gather(*(c2.generate(resume_request(r)) for r in first))
        return first, second

    first, second = run(main())
    for i, (a, b) in enumerate(zip(first, second, strict=True)):
        assert a.failed and a.finish_reason is FinishReason.ABORT
        assert a.attempts == 3 and "gave up" in a.error
        assert a.output_ids == streamed[i] and 20 <= len(a.output_ids) < length
        assert b.error is None and len(a.output_ids) + len(b.output_ids) == length


def test_stream_cut_off_is_resumed(servers):
    """The first two streams end after 5 chunks with no final chunk: the adapter resumes the
    remainder and the sample still gets exactly its length."""
    faults = Faults(n=2, cut_after=5)

    async def main():
        async with FaultProxy(servers[0].url, faults) as proxy, \
                SGLangClient(proxy.url, config=FAST_RETRY) as c:
            return await asyncio.gather(*(c.generate(replay_request(600 + i, 9, 80, 100, VOCAB))
                                          for i in range(2)))

    results = run(main())
    for r in results:
        assert r.error is None and r.finish_reason is FinishReason.STOP
        assert len(r.output_ids) == 80 and r.attempts == 2
        assert r.prompt_tokens == 9  # the original prompt, not prompt + partial


def test_503_is_retried_with_backoff(servers):
    faults = Faults(n=2, status_503=True)

    async def main():
        async with FaultProxy(servers[0].url, faults) as proxy, \
                SGLangClient(proxy.url, config=FAST_RETRY) as c:
            return await c.generate(replay_request(700, 5, 20, 20, VOCAB))

    r = run(main())
    assert r.error is None and len(r.output_ids) == 20 and r.attempts == 3
    assert faults.seen == 3


def test_503_past_the_retry_budget_is_reported_not_raised(servers):
    faults = Faults(n=10, status_503=True)

    async def main():
        async with FaultProxy(servers[0].url, faults) as proxy, \
                SGLangClient(proxy.url, config=FAST_RETRY) as c:
            return await c.generate(replay_request(701, 5, 20, 20, VOCAB))

    r = run(main())
    assert r.failed and r.attempts == 3 and "503" in r.error and "overloaded" in r.error
    assert r.output_ids == [] and faults.seen == 3


def test_error_chunk_mid_stream(servers):
    """An error chunk is an error: code 500 is retried (and resumed); code 400 is reported with
    the partial output."""

    async def attempt(code: int):
        faults = Faults(n=1, error_chunk=code)
        async with FaultProxy(servers[0].url, faults) as proxy, \
                SGLangClient(proxy.url, config=FAST_RETRY) as c:
            return await c.generate(replay_request(800, 5, 30, 30, VOCAB))

    retried = run(attempt(500))
    assert retried.error is None and len(retried.output_ids) == 30 and retried.attempts == 2
    fatal = run(attempt(400))
    assert fatal.failed and "injected failure" in fatal.error and fatal.attempts == 1
    assert len(fatal.output_ids) >= 1  # the chunk streamed before the error is kept
    rest = resume_request(fatal)
    assert rest is not None and rest.max_new_tokens == 30 - len(fatal.output_ids)


def test_worker_killed_behind_router(tmp_logs):
    """Two fresh servers behind a router; one is killed mid-rollout. Every sample comes back
    (complete, or failed-with-partial), and resuming the failed ones completes all of them."""
    from conftest import start_router, start_server

    s1, s2 = start_server(tmp_logs), start_server(tmp_logs)
    router = None
    try:
        router = start_router(tmp_logs, [s1.url, s2.url])
        length, n = 500, 6
        reqs = [replay_request(900 + i, 7, length, length, VOCAB) for i in range(n)]
        streamed = [0] * n

        async def main():
            cfg = ClientConfig(retry=RetryPolicy(max_attempts=4, initial_backoff_s=0.2),
                               read_timeout_s=20, connect_timeout_s=2)
            async with SGLangClient(router.url, config=cfg) as c:
                def cb(i):
                    def f(p):
                        streamed[i] = p.generated
                    return f
                tasks = [asyncio.create_task(c.generate(r, cb(i))) for i, r in enumerate(reqs)]
                assert await wait_until(lambda: min(streamed) >= 10, timeout=30)
                s2.kill()
                first = await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)
                todo = [(k, resume_request(r)) for k, r in enumerate(first) if not r.finished]
                second = await asyncio.gather(*(c.generate(rr, None) for _, rr in todo))
                return first, dict(zip([k for k, _ in todo], second, strict=True))

        first, second = run(main())
        for k, r in enumerate(first):
            assert len(r.output_ids) >= streamed[k] or r.finished
            total = len(r.output_ids) + (len(second[k].output_ids) if k in second else 0)
            assert total == length, (k, r, second.get(k))
    finally:
        if router is not None:
            router.stop()
        s1.stop()
        s2.stop()
