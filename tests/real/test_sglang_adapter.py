"""The SGLang adapter end to end against live bundled-engine servers (SGLang's native API)."""

from __future__ import annotations

import asyncio

import pytest
from conftest import VOCAB, run
from real_scenarios import replay_request, scenario_abort_and_resume, scenario_generate_replay

from aprilsim.types import FinishReason
from real.clients.sglang import ClientConfig, RetryPolicy, SGLangClient
from real.protocol import GenerateRequest, SamplingParams


def test_generate_replay_cumulative(servers):
    async def main():
        async with SGLangClient(servers[0].url) as c:
            assert await c._incremental_for(servers[0].url) is False
            await scenario_generate_replay(c, VOCAB)

    run(main())


def test_incremental_and_cumulative_streams_agree(servers, incremental_server):
    """Greedy decoding on identical weights: both streaming modes rebuild the same ids."""
    req = GenerateRequest(prompt_ids=(20, 30, 40, 50), max_new_tokens=50, replay_len=50,
                          sampling=SamplingParams(temperature=0.0))

    async def main():
        async with SGLangClient(servers[0].url) as cum, SGLangClient(incremental_server.url) as inc:
            assert await inc._incremental_for(incremental_server.url) is True
            a, b = await asyncio.gather(cum.generate(req), inc.generate(req))
            # and with the mode unknown: inferred from completion_tokens
            unknown = SGLangClient(incremental_server.url)
            unknown._incremental[incremental_server.url] = None  # type: ignore[assignment]
            c = await unknown.generate(req)
            await unknown.close()
        return a, b, c

    a, b, c = run(main())
    assert len(a.output_ids) == 50
    assert a.output_ids == b.output_ids == c.output_ids
    assert a.finish_reason is b.finish_reason is FinishReason.LENGTH


def test_stop_token_ends_early(servers):
    """Without replay, the stop ids (EOS) end the response with finish reason stop."""

    async def main():
        async with SGLangClient(servers[0].url) as c:
            probe = await c.generate(GenerateRequest((11, 12, 13), 20,
                                                     SamplingParams(temperature=0.0)))
            first = probe.output_ids[0]
            return probe, await c.generate(
                GenerateRequest((11, 12, 13), 20,
                                SamplingParams(temperature=0.0, stop_token_ids=(first,))))

    probe, stopped = run(main())
    assert stopped.finish_reason is FinishReason.STOP
    assert stopped.output_ids == probe.output_ids[:1]


def test_abort_running_and_queued_then_resume(servers):
    """12 requests on a server that runs 8: 8 come back partial, 4 from the waiting queue."""

    async def main():
        async with SGLangClient(servers[0].url) as c:
            async def busy():
                ld = await c.loads(servers[0].url)
                return ld["num_running_reqs"] + ld["num_waiting_reqs"]

            first, _ = await scenario_abort_and_resume(c, VOCAB, n=12, length=600, min_running=8,
                                                       loads_of=busy)
            return first

    first = run(main())
    queued = [r for r in first if not r.output_ids]
    assert len(queued) == 4
    assert all(r.prompt_tokens is None and r.abort_message == "Abort in waiting queue"
               for r in queued)
    running = [r for r in first if r.output_ids]
    assert all(r.prompt_tokens == len(r.request.prompt_ids) for r in running)


def test_server_info_health_weight_version(servers):
    async def main():
        async with SGLangClient(worker_urls=[s.url for s in servers]) as c:
            return await c.health(), await c.server_info(), await c.weight_version()

    ok, info, version = run(main())
    assert ok
    assert info.max_running_requests == 16  # 8 per worker, two workers
    assert info.kv_capacity_tokens == 2 * 8 * 2048
    assert info.max_context_length == 2048
    assert info.workers == tuple(s.url for s in servers)
    assert version == "default"


def test_bad_request_is_not_retried(servers):
    """A 4xx (context too long) comes back as a failed result at once, no retries."""
    cfg = ClientConfig(retry=RetryPolicy(max_attempts=3, initial_backoff_s=0.01))

    async def main():
        async with SGLangClient(servers[0].url, config=cfg) as c:
            return await c.generate(GenerateRequest((20,) * 10, 5000))

    res = run(main())
    assert res.failed and res.attempts == 1
    assert "HTTP 400" in res.error and "context" in res.error
    assert res.finish_reason is FinishReason.ABORT and res.output_ids == []


def test_resume_of_finished_or_empty_is_skipped():
    from real.protocol import GenerateResult, Timings, resume_request

    req = GenerateRequest((1, 2), 10, replay_len=4)
    done = GenerateResult("r", req, [5, 6, 7, 8], FinishReason.STOP, Timings())
    assert resume_request(done) is None
    all_used = GenerateResult("r", GenerateRequest((1, 2), 3), [5, 6, 7], FinishReason.ABORT,
                              Timings())
    assert resume_request(all_used) is None


@pytest.mark.parametrize("n_workers", [2])
def test_direct_worker_list_spreads_load(servers, n_workers):
    """Without a router, generation goes to the worker with the fewest requests in flight."""

    async def main():
        async with SGLangClient(worker_urls=[s.url for s in servers[:n_workers]]) as c:
            rs = await asyncio.gather(*(c.generate(replay_request(i, 5, 30, 30, VOCAB))
                                        for i in range(6)))
            return rs

    rs = run(main())
    assert {r.worker for r in rs} == {s.url for s in servers[:n_workers]}
    assert all(len(r.output_ids) == 30 for r in rs)
