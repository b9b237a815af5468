"""Live calibration: drive engines through the Engine protocol with controlled batches and time
their steps (``aprilsim calibrate --local N | --engines URL,...``).

The sweep, per engine: for every prompt length L (the KV load) and batch size B, submit B requests
of L prompt tokens at once in replay mode (EOS ignored, exactly ``gen_tokens`` each). The engine
prefills them together, then runs ``gen_tokens`` decode iterations at batch B with K growing from
B*L: decode records over (B, K) and prefill records of B*L tokens. A few single-request prefills
of other sizes follow. Batches run one after the other, so nothing else shares the engine.

Timings come from the bundled engine's per-iteration records (`BatchEngine.iterations` in
process, ``GET /iteration_log?since=N`` over HTTP): compute time per step, exact batch and KV.
An engine without that endpoint (SGLang) is timed from the token stream instead: the gap between
consecutive tokens of a request is one decode iteration (includes HTTP and detokenisation
latency, so coarser), and the first token's latency after submission is the prefill.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

from aprilsim.engine.calibration import Record, records_from_iterations

from .protocol import Engine, GenerateRequest, Progress

DEFAULT_BATCH_SIZES = (1, 2, 4, 8)
DEFAULT_KV_LOADS = (16, 256)
DEFAULT_GEN_TOKENS = 24
PREFILL_SIZES = (32, 128, 512)
PREFILL_REPEATS = 3  # prefill steps are few and noisy on a shared CPU: fit their medians

Progress_ = Callable[[str], None] | None


def _sweep(max_running: int, max_context: int, batch_sizes: Sequence[int] | None,
           kv_loads: Sequence[int] | None, gen_tokens: int) -> list[tuple[int, int, int]]:
    """(batch, prompt length, tokens to generate) per run, clipped to the engine's limits."""
    bs = sorted({min(b, max_running) for b in (batch_sizes or DEFAULT_BATCH_SIZES)})
    room = max_context - gen_tokens - 8
    ls = sorted({max(1, min(x, room)) for x in (kv_loads or DEFAULT_KV_LOADS)})
    runs = [(b, L, gen_tokens) for L in ls for b in bs]
    runs += [(1, max(1, min(n, room)), 1) for n in PREFILL_SIZES
             for _ in range(PREFILL_REPEATS)]  # prefill-only runs
    return runs


async def _run_batch(engine: Engine, batch: int, prompt_len: int, gen: int, vocab: int,
                     seed: int, stamps: list[list[float]] | None = None) -> float:
    """Submit `batch` replay requests together and wait for all; returns the submission time."""
    t0 = time.monotonic()

    def request(i: int) -> GenerateRequest:
        ids = tuple(3 + (seed * 7919 + i * 131 + j) % max(vocab - 3, 1) for j in range(prompt_len))
        return GenerateRequest(prompt_ids=ids, max_new_tokens=gen, replay_len=gen)

    def recorder(i: int):
        if stamps is None:
            return None
        stamps.append([])
        mine = stamps[-1]

        def on_progress(p: Progress) -> None:
            mine.extend([time.monotonic()] * max(len(p.new_ids), 1))
        return on_progress

    results = await asyncio.gather(*(engine.generate(request(i), recorder(i)) for i in range(batch)))
    bad = [r.error for r in results if r.error]
    if bad:
        raise ValueError(f"calibration request failed: {bad[0]}")
    return t0


def _stream_records(batch: int, prompt_len: int, t0: float, stamps: list[list[float]]) -> list[Record]:
    """Records from token timestamps (engines with no iteration log)."""
    out: list[Record] = []
    firsts = [s[0] for s in stamps if s]
    if len(firsts) == batch:
        out.append(Record("prefill", batch, 0.0, batch * prompt_len, max(max(firsts) - t0, 1e-6),
                          float(batch * prompt_len**2)))
    s = stamps[0]
    for i in range(1, len(s)):
        dt = s[i] - s[i - 1]
        if dt > 0:
            out.append(Record("decode", batch, float(batch * (prompt_len + i)), 0, dt))
    return out


async def _measure_engine(engine: Engine, fetch_log: Callable[[int], Any] | None, vocab: int,
                          batch_sizes: Sequence[int] | None, kv_loads: Sequence[int] | None,
                          gen_tokens: int, progress: Progress_, label: str) -> tuple[list[Record], dict]:
    info = await engine.server_info()
    max_running = info.max_running_requests or 8
    max_context = info.max_context_length or 2048
    runs = _sweep(max_running, max_context, batch_sizes, kv_loads, gen_tokens)
    await _run_batch(engine, 1, 8, 4, vocab, seed=0)  # warm-up, not recorded
    since = 0
    if fetch_log is not None:
        since = max((r["seq"] for r in await fetch_log(0)), default=0)
    records: list[Record] = []
    for i, (b, L, g) in enumerate(runs):
        if progress is not None:
            progress(f"calibrating {label}: run {i + 1}/{len(runs)} (batch {b}, prompt {L})")
        stamps: list[list[float]] | None = None if fetch_log is not None else []
        t0 = await _run_batch(engine, b, L, g, vocab, seed=i + 1, stamps=stamps)
        if stamps is not None:
            records += _stream_records(b, L, t0, stamps)
    if fetch_log is not None:
        rows = [r for r in await fetch_log(since) if r["seq"] > since]
        records += records_from_iterations(rows, f"{label} iteration log")
    return records, {"max_running": max_running, "kv_capacity": info.kv_capacity_tokens}


async def _measure_local(n: int, batch_sizes, kv_loads, gen_tokens, progress) -> tuple[list[Record], dict]:
    import torch

    from .runner.local import LocalSpec, start_local

    torch.set_num_threads(1)  # as `aprilsim run --local`: one intra-op thread, tiny model
    spec = LocalSpec()
    workers = await start_local(n, spec)
    records: list[Record] = []
    info: dict = {}
    try:
        for w in workers:
            eng = w.engine

            async def fetch(since: int, eng=eng) -> list[dict]:
                return [r.to_dict() for r in list(eng.iterations) if r.seq > since]

            recs, info = await _measure_engine(w, fetch, spec.vocab_size, batch_sizes, kv_loads,
                                               gen_tokens, progress, w.name)
            records += recs
    finally:
        for w in workers:
            await w.close()
    info["source"] = (f"{n} bundled engine(s) in process (d_model {spec.d_model}, "
                      f"{spec.n_layers} layers, CPU), live sweep")
    info["label"] = "bundled-local"
    return records, info


async def _measure_http(urls: Sequence[str], batch_sizes, kv_loads, gen_tokens, progress,
                        vocab: int = 512) -> tuple[list[Record], dict]:
    import aiohttp

    from .sglang_http import SGLangClient

    records: list[Record] = []
    info: dict = {}
    timing = []
    async with aiohttp.ClientSession() as session:
        for url in urls:
            base = url.rstrip("/")
            client = SGLangClient(base)
            try:
                async def fetch(since: int, base=base) -> list[dict]:
                    async with session.get(f"{base}/iteration_log", params={"since": since}) as r:
                        r.raise_for_status()
                        return list((await r.json())["records"])

                try:
                    await fetch(0)
                    fetch_log: Callable | None = fetch
                except (aiohttp.ClientError, KeyError, ValueError):
                    fetch_log = None  # SGLang: time from the token stream
                timing.append("iteration log" if fetch_log else "token stream")
                recs, info = await _measure_engine(client, fetch_log, vocab, batch_sizes,
                                                   kv_loads, gen_tokens, progress, base)
                records += recs
            except aiohttp.ClientError as e:
                raise ValueError(f"{base}: {e}") from None
            finally:
                await client.close()
    info["source"] = f"engines {', '.join(urls)} ({', '.join(sorted(set(timing)))}), live sweep"
    info["label"] = "calibrated-live"
    return records, info


def measure(local: int | None = None, engines: Sequence[str] | None = None,
            batch_sizes: Sequence[int] | None = None, kv_loads: Sequence[int] | None = None,
            gen_tokens: int = DEFAULT_GEN_TOKENS, progress: Progress_ = None,
            ) -> tuple[list[Record], dict]:
    """Run the sweep on `local` in-process engines or on the servers at `engines`; returns the
    timing records and what is known of the engine (max_running, kv_capacity, source, wall_s)."""
    t = time.monotonic()
    if local is not None:
        records, info = asyncio.run(_measure_local(local, batch_sizes, kv_loads, gen_tokens, progress))
    else:
        records, info = asyncio.run(_measure_http(list(engines or ()), batch_sizes, kv_loads,
                                                  gen_tokens, progress))
    info["wall_s"] = round(time.monotonic() - t, 2)
    if progress is not None:
        progress(f"calibration sweep done ({len(records)} records, {info['wall_s']} s)")
    return records, info
