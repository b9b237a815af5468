"""End to end: :class:`real.clients.vllm.VLLMEngine` against the fake vLLM server (loopback only).

The fake generates a deterministic chain (see ``vllm_fake``), so every test can check the ids it
got against what one uninterrupted run would produce: after a cut stream, a 503, an error chunk,
a silent server or an abort + resume, nothing is lost and nothing is duplicated.
"""

from __future__ import annotations

import asyncio

import pytest
from conftest import run
from real_scenarios import scenario_abort_and_resume, scenario_generate_replay
from vllm_fake import MODEL, FakeVLLM, chain

from aprilsim.types import FinishReason
from real.clients.sglang import RetryPolicy
from real.clients.vllm import NotSupported, VLLMConfig, VLLMEngine
from real.protocol import Engine, GenerateRequest, SamplingParams, resume_request

VOCAB = 1000
FAST = VLLMConfig(retry=RetryPolicy(max_attempts=3, initial_backoff_s=0.01), read_timeout_s=5.0)


def req(prompt=(11, 12, 13), n=20, replay=None, **sampling) -> GenerateRequest:
    return GenerateRequest(tuple(prompt), max_new_tokens=n, replay_len=replay,
                           sampling=SamplingParams(**sampling))


def test_is_an_engine_and_generates_replay_and_free():
    async def main():
        async with FakeVLLM(vocab=VOCAB) as fake, VLLMEngine(fake.url, config=FAST) as eng:
            assert isinstance(eng, Engine)
            await scenario_generate_replay(eng, VOCAB)
            assert all(b["model"] == MODEL for b in fake.bodies)  # asked of /v1/models
            assert all(b["ignore_eos"] and b["min_tokens"] == b["max_tokens"] for b in fake.bodies)
            r = await eng.generate(req(n=15, temperature=0.0, seed=5))
            assert r.output_ids == chain([11, 12, 13], 15, VOCAB)
            assert (r.finish_reason is FinishReason.LENGTH and r.prompt_tokens == 3
                    and r.attempts == 1)
            assert fake.bodies[-1]["seed"] == 5 and "ignore_eos" not in fake.bodies[-1]

    run(main())


def _prompt_reaching_eos(eos: int, at: int) -> list[int]:
    for last in range(VOCAB):
        c = chain([last], 40, VOCAB)
        if eos in c and c.index(eos) == at:
            return [7, last]
    raise AssertionError("no prompt reaches EOS there")


def test_eos_stops_free_run_and_replay_ignores_it():
    async def main():
        async with FakeVLLM(vocab=VOCAB, eos=999) as fake, VLLMEngine(fake.url, config=FAST) as eng:
            prompt = _prompt_reaching_eos(999, at=4)
            free = await eng.generate(req(prompt, n=30))
            assert free.finish_reason is FinishReason.STOP and free.output_ids[-1] == 999
            assert len(free.output_ids) == 5
            rep = await eng.generate(req(prompt, n=30, replay=12))
            assert (rep.finish_reason is FinishReason.STOP
                    and rep.output_ids == chain(prompt, 12, VOCAB))
            stop = await eng.generate(req(prompt, n=30,
                                          stop_token_ids=(chain(prompt, 3, VOCAB)[-1],)))
            assert stop.finish_reason is FinishReason.STOP and len(stop.output_ids) == 3

    run(main())


def test_ids_via_logprobs_for_older_servers():
    async def main():
        async with FakeVLLM(vocab=VOCAB) as fake, \
                VLLMEngine(fake.url, config=VLLMConfig(ids_via="logprobs")) as eng:
            r = await eng.generate(req(n=9))
            assert r.output_ids == chain([11, 12, 13], 9, VOCAB) and r.error is None
            assert (fake.bodies[-1]["logprobs"] == 0
                    and fake.bodies[-1]["return_tokens_as_token_ids"])

    run(main())


@pytest.mark.parametrize("fault", [("cut", 6), ("status", 503), ("error_chunk", 4), ("hang", 3),
                                   ("finish", "error", 5)])
def test_retryable_faults_resume_with_nothing_lost(fault):
    async def main():
        cfg = VLLMConfig(retry=RetryPolicy(max_attempts=3, initial_backoff_s=0.01),
                         read_timeout_s=0.5)
        async with FakeVLLM(vocab=VOCAB, faults=[fault]) as fake, \
                VLLMEngine(fake.url, config=cfg) as eng:
            seen: list[int] = []
            r = await eng.generate(req(n=30, replay=20),
                                   on_progress=lambda p: seen.extend(p.new_ids))
            assert r.error is None and r.attempts == 2
            assert r.output_ids == chain([11, 12, 13], 20, VOCAB) == seen
            assert r.finish_reason is FinishReason.STOP and r.prompt_tokens == 3
            first, second = fake.bodies
            k = len(second["prompt"]) - 3
            assert second["prompt"] == [11, 12, 13] + r.output_ids[:k]
            assert second["max_tokens"] == second["min_tokens"] == 20 - k
            if fault[0] in ("cut", "error_chunk", "hang", "finish"):
                assert k == fault[-1]

    run(main())


def test_fatal_status_and_exhausted_retries_keep_the_partial():
    async def main():
        faults = [("status", 400), ("cut", 4), ("cut", 3), ("cut", 2)]
        async with FakeVLLM(vocab=VOCAB, faults=faults) as fake, \
                VLLMEngine(fake.url, config=FAST) as eng:
            bad = await eng.generate(req())
            assert (bad.failed and bad.attempts == 1 and "HTTP 400" in bad.error
                    and bad.output_ids == [])
            r = await eng.generate(req(n=30))
            assert r.failed and r.finish_reason is FinishReason.ABORT and r.attempts == 3
            assert r.output_ids == chain([11, 12, 13], 9, VOCAB)  # 4 + 3 + 2, in order
            rest = await eng.generate(resume_request(r))
            assert r.output_ids + rest.output_ids == chain([11, 12, 13], 30, VOCAB)
            assert rest.finish_reason is FinishReason.LENGTH

    run(main())


def test_server_side_abort_is_an_abort_with_partial_not_an_error():
    async def main():
        async with FakeVLLM(vocab=VOCAB, faults=[("finish", "abort", 5)]) as fake, \
                VLLMEngine(fake.url, config=FAST) as eng:
            r = await eng.generate(req(n=20))
            assert r.finish_reason is FinishReason.ABORT and not r.failed and r.attempts == 1
            assert r.output_ids == chain([11, 12, 13], 5, VOCAB)

    run(main())


def test_abort_all_closes_streams_and_resume_finishes_exactly():
    async def main():
        async with FakeVLLM(vocab=VOCAB, step_s=0.005, max_running=4) as fake, \
                VLLMEngine(fake.url, config=FAST) as eng:
            async def idle():
                ld = await eng.loads()
                return ld["num_running_reqs"] + ld["num_waiting_reqs"]

            first, second = await scenario_abort_and_resume(eng, VOCAB, n=8, length=150,
                                                            min_running=4, loads_of=idle)
            assert len(fake.aborted) == 8  # the server saw every client leave
            for a, b in zip(first, second, strict=True):
                assert a.output_ids + b.output_ids == chain(list(a.request.prompt_ids), 150, VOCAB)
            assert eng.in_flight == 0

    run(main())


def test_generate_waits_for_abort_all_and_cancellation_closes_stream():
    async def main():
        async with FakeVLLM(vocab=VOCAB, step_s=0.005) as fake, \
                VLLMEngine(fake.url, config=FAST) as eng:
            t = asyncio.create_task(eng.generate(req(n=500)))
            while fake.running == 0:
                await asyncio.sleep(0.01)
            t.cancel()
            with pytest.raises(asyncio.CancelledError):
                await t
            for _ in range(100):
                if fake.aborted:
                    break
                await asyncio.sleep(0.01)
            assert len(fake.aborted) == 1 and eng.in_flight == 0

    run(main())


def test_info_health_load_and_weights():
    async def main():
        async with FakeVLLM(vocab=VOCAB, dev=True) as fake, VLLMEngine(fake.url) as eng:
            assert await eng.health()
            info = await eng.server_info()
            assert info.max_context_length == 4096 and info.kv_capacity_tokens == 512 * 16
            assert info.version == "0.33.0-fake" and info.workers == (fake.url,)
            assert (await eng.loads())["num_running_reqs"] == 0
            assert await eng.weight_version() is None
            await eng.update_weights("7", path="/ckpt/step7")
            assert fake.rpc_calls == [{"method": "reload_weights",
                                       "kwargs": {"weights_path": "/ckpt/step7"}}]
            assert await eng.weight_version() == "7"
            r = await eng.generate(req(n=3))
            assert r.weight_version == "7"
            assert await eng.pause() and fake.paused
            t = asyncio.create_task(eng.generate(req(n=3)))  # queued while paused (mode=keep)
            await asyncio.sleep(0.1)
            assert not t.done()
            assert await eng.resume()
            assert (await t).output_ids == chain([11, 12, 13], 3, VOCAB)
            fake.healthy = False
            assert not await eng.health()
        async with FakeVLLM(vocab=VOCAB) as fake, VLLMEngine(fake.url) as eng:
            assert await eng.weight_version() is None
            assert not await eng.pause() and not await eng.resume()
            await eng.update_weights("1")  # a relabel alone: warned about, not fatal to a run
            with pytest.raises(NotSupported):
                await eng.update_weights("1", path="/ckpt")  # loading weights cannot be faked
            assert (await eng.server_info()).max_running_requests is None
            url = fake.url
        async with VLLMEngine(url, config=VLLMConfig(connect_timeout_s=0.5,
                                                     control_timeout_s=1)) as gone:
            assert not await gone.health() and await gone.loads() is None

    run(main())
