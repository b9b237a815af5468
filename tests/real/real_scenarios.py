"""Adapter scenarios shared by the bundled-engine tests and the opt-in live SGLang tests.

Each scenario drives an :class:`real.protocol.Engine` and asserts behaviour; it takes the token
range to draw prompts from, since a live model's vocabulary is not ours.
"""

from __future__ import annotations

import asyncio
import time

from aprilsim.types import FinishReason
from real.protocol import GenerateRequest, GenerateResult, Progress, SamplingParams, resume_request
from real.samples import synth_token_ids


def replay_request(key: int, prompt_len: int, replay_len: int, max_new: int, vocab: int,
                   temperature: float = 1.0) -> GenerateRequest:
    return GenerateRequest(prompt_ids=synth_token_ids(key, prompt_len, vocab),
                           max_new_tokens=max_new, replay_len=replay_len,
                           sampling=SamplingParams(temperature=temperature), tag=key)


async def scenario_generate_replay(engine, vocab: int) -> list[GenerateResult]:
    """Replay generates exactly the asked length; stop vs length; progress adds up."""
    reqs = [replay_request(1, 7, 5, 64, vocab), replay_request(2, 30, 17, 64, vocab),
            replay_request(3, 3, 40, 40, vocab)]
    seen: dict[int, list[int]] = {i: [] for i in range(len(reqs))}

    def on_progress(i):
        def cb(p: Progress) -> None:
            seen[i].extend(p.new_ids)
            assert p.generated == len(seen[i])
        return cb

    results = await asyncio.gather(*(engine.generate(r, on_progress(i))
                                     for i, r in enumerate(reqs)))
    for i, (req, res) in enumerate(zip(reqs, results, strict=True)):
        assert res.error is None, res.error
        assert len(res.output_ids) == req.replay_len
        assert seen[i] == res.output_ids
        assert all(0 <= t for t in res.output_ids)
        assert res.prompt_tokens == len(req.prompt_ids)
        assert res.timings.first_token is not None and res.timings.latency > 0
    assert [r.finish_reason for r in results] == [FinishReason.STOP, FinishReason.STOP,
                                                  FinishReason.LENGTH]
    return results


async def wait_until(pred, timeout: float, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        await asyncio.sleep(interval)
    return pred()


async def scenario_abort_and_resume(
    engine, vocab: int, n: int, length: int, min_running: int, loads_of=None,
) -> tuple[list[GenerateResult], list[GenerateResult]]:
    """abort_all returns every request (running: partial; queued: empty), then resume finishes.

    ``min_running``: how many requests must have streamed tokens before the abort.
    ``loads_of``: optional coroutine returning the engines' total running+waiting after abort.
    """
    reqs = [replay_request(100 + i, 8 + i, length, length, vocab) for i in range(n)]
    progress = [0] * n

    def cb(i):
        def f(p: Progress) -> None:
            progress[i] = p.generated
        return f

    tasks = [asyncio.create_task(engine.generate(r, cb(i))) for i, r in enumerate(reqs)]
    started = await wait_until(lambda: sum(p > 0 for p in progress) >= min_running, timeout=30)
    assert started, f"only {sum(p > 0 for p in progress)} requests started: {progress}"
    await engine.abort_all()
    assert all(t.done() for t in tasks), "abort_all returned before every request did"
    first = [t.result() for t in tasks]
    for i, res in enumerate(first):
        assert res.error is None, res.error
        assert res.finish_reason is FinishReason.ABORT
        assert len(res.output_ids) < length
        assert len(res.output_ids) >= progress[i]  # never fewer than streamed (maybe one more)
        if not res.output_ids:
            # Aborted in the waiting queue: SGLang omits prompt_tokens for these.
            assert res.prompt_tokens is None or res.prompt_tokens == len(reqs[i].prompt_ids)
    assert sum(len(r.output_ids) > 0 for r in first) >= min_running
    if loads_of is not None:
        assert await loads_of() == 0
    # Resume: prompt + partial, the remaining budget; totals come out exact.
    resumed_reqs = [resume_request(r) for r in first]
    assert all(rr is not None for rr in resumed_reqs)
    for r, rr in zip(first, resumed_reqs, strict=True):
        assert rr.max_new_tokens == length - len(r.output_ids)
        assert rr.prompt_ids[len(r.request.prompt_ids):] == tuple(r.output_ids)
    second = await asyncio.gather(*(engine.generate(rr) for rr in resumed_reqs))
    for r1, r2 in zip(first, second, strict=True):
        assert r2.error is None, r2.error
        assert r2.finish_reason is FinishReason.LENGTH
        assert len(r1.output_ids) + len(r2.output_ids) == length
    return first, second
