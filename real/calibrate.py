"""Live calibration: drive engines through the Engine protocol with controlled batches and time
their steps (``aprilsim calibrate --local N | --engines URL,...``).

Every engine family the runner reaches is measured through the same
:func:`real.clients.connect.connect` (``vllm+http://...``: vLLM; ``http://...``: SGLang, an
sglang-router or a bundled ``python -m real.serve``). Before the sweep: the vocabulary
(``--vocab-size``, else what the server states, else probed:
:func:`real.clients.connect.engine_vocab`) and the concurrency (the server's
``max_running_requests``, else probed: as many requests as the sweep needs sent at once, the most
seen running together).

The sweep, per engine: for every prompt length L (the KV load) and batch size B up to the
concurrency (default 1, 2, 4, ... up to ``max_batch``, 64 or what a scenario's rollouts reach),
submit B requests of L prompt tokens at once in replay mode (exactly ``gen_tokens`` each): a
prefill of B*L tokens, then decode iterations at batch B with K growing from B*L. A few
single-request prefills of other sizes follow. Batches run one after the other.

Timing, by what the engine offers (best first):

- its iteration log (the bundled engine: ``BatchEngine.iterations`` in process,
  ``GET /iteration_log`` over HTTP): every step's compute time, exact batch and KV;
- vLLM's ``/metrics``: per run, the engine core's inter-token latency (one decode iteration at
  batch B, KV from B*L to B*(L+gen)) and prefill time, from the histograms' sums and counts;
- the token stream (SGLang and any other): the iterations rebuilt from the arrivals of all the
  batch's tokens (:mod:`aprilsim.validate.reconstruct`; includes HTTP delivery, so coarser).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

from aprilsim.engine.calibration import Record, records_from_iterations

from .protocol import Engine, GenerateRequest

DEFAULT_MAX_BATCH = 64
LOCAL_MAX_BATCH = 16  # --local: the small default sweep (a CPU toy engine; about 20 s)
DEFAULT_KV_LOADS = (16, 128, 512)
DEFAULT_GEN_TOKENS = 24
PREFILL_SIZES = (32, 128, 512)
PREFILL_REPEATS = 3  # prefill steps are few and noisy on a shared CPU: fit their medians
PROBE_GEN = 512  # tokens per request of the concurrency probe: long enough that all overlap
PROBE_SETTLE_S = 1.0  # once all run, read the running count this long before aborting the rest

Progress_ = Callable[[str], None] | None


def batch_grid(cap: int, given: Sequence[int] | None = None) -> list[int]:
    """Decode batch sizes of the sweep: ``given`` clipped to ``cap``, else 1, 2, 4, ... and
    ``cap`` itself (the largest batch the rollouts reach)."""
    if given:
        return sorted({max(1, min(b, cap)) for b in given})
    out = {cap}
    b = 1
    while b < cap:
        out.add(b)
        b *= 2
    return sorted(out)


def plan_sweep(cap: int, max_context: int, kv_capacity: int | None,
               batch_sizes: Sequence[int] | None, kv_loads: Sequence[int] | None,
               gen_tokens: int) -> list[tuple[int, int, int]]:
    """(batch, prompt length, tokens to generate) per run, within the engine's context and KV:
    a batch whose KV would not fit is left out (it would be preempted, not timed)."""
    room = max_context - gen_tokens - 8
    ls = sorted({max(1, min(x, room)) for x in (kv_loads or DEFAULT_KV_LOADS)})
    runs = []
    for L in ls:
        for b in batch_grid(cap, batch_sizes):
            if kv_capacity is None or b * (L + gen_tokens) <= 0.9 * kv_capacity:
                runs.append((b, L, gen_tokens))
    runs += [(1, max(1, min(n, room)), 1) for n in PREFILL_SIZES
             for _ in range(PREFILL_REPEATS)]  # prefill-only runs
    return runs


def _ids(vocab: int, seed: int, i: int, n: int) -> tuple[int, ...]:
    """Prompt ids below the vocabulary (3 and up: ids 0-2 are pad/bos/eos in most)."""
    span = max(vocab - 3, 1)
    return tuple(3 + (seed * 7919 + i * 131 + j * 17) % span for j in range(n))


async def _run_batch(engine: Engine, batch: int, prompt_len: int, gen: int, vocab: int,
                     seed: int) -> None:
    """Submit `batch` replay requests together and wait for all."""
    reqs = [GenerateRequest(prompt_ids=_ids(vocab, seed, i, prompt_len), max_new_tokens=gen,
                            replay_len=gen) for i in range(batch)]
    results = await asyncio.gather(*(engine.generate(r) for r in reqs))
    bad = [r.error for r in results if r.error]
    if bad:
        raise ValueError(f"calibration request failed: {bad[0]}")


class _Timing:
    """How one engine's steps are timed (iteration log, vLLM metrics, or token stream)."""

    name = "token stream"

    def __init__(self, engine, label: str) -> None:
        from .clients.connect import stamped

        self.engine = stamped(engine)
        self.label = label
        self.walls: list[tuple[int, float]] = []  # (prompt tokens, client seconds), one token each

    async def begin(self) -> None:
        self.engine.take()

    async def run(self, batch: int, prompt_len: int, gen: int, vocab: int,
                  seed: int) -> list[Record]:
        await self.begin_run()
        t0 = time.perf_counter()
        await _run_batch(self.engine, batch, prompt_len, gen, vocab, seed)
        if batch == 1 and gen == 1:  # client time of a one-token request (`client_overhead_s`)
            self.walls.append((prompt_len, time.perf_counter() - t0))
        return await self.end_run(batch, prompt_len, gen)

    async def begin_run(self) -> None:
        self.engine.take()

    async def end_run(self, batch: int, prompt_len: int, gen: int) -> list[Record]:
        from aprilsim.validate.reconstruct import reconstruct

        rows = reconstruct(self.engine.take())
        return records_from_iterations(rows, f"{self.label} token stream")

    async def finish(self) -> list[Record]:
        return []


class _LogTiming(_Timing):
    """The bundled engine's own iteration log, read once at the end."""

    name = "iteration log"

    def __init__(self, engine, label: str, fetch: Callable[[int], Any]) -> None:
        super().__init__(engine, label)
        self.fetch, self.since = fetch, 0

    async def begin(self) -> None:
        self.since = max((int(r["seq"]) for r in await self.fetch(0)), default=0)

    async def end_run(self, batch: int, prompt_len: int, gen: int) -> list[Record]:
        self.engine.take()  # the log has it
        return []

    async def finish(self) -> list[Record]:
        rows = [r for r in await self.fetch(self.since) if int(r["seq"]) > self.since]
        rows.sort(key=lambda r: int(r["seq"]))
        return records_from_iterations(rows, f"{self.label} iteration log")


class _MetricsTiming(_Timing):
    """vLLM: per run, the deltas of the engine core's latency histograms."""

    name = "vLLM /metrics"
    prefix_hits = prefix_queries = 0.0  # prompt tokens vLLM's prefix cache was asked / served

    async def begin_run(self) -> None:
        self.before = await self.engine.inner.counters() or {}

    async def end_run(self, batch: int, prompt_len: int, gen: int) -> list[Record]:
        from .clients.vllm_wire import counter_delta

        want = batch * (gen - 1)  # inter-token gaps the run makes
        for _ in range(20):  # the server records a step's stats just after sending its tokens
            d = counter_delta(self.before, await self.engine.inner.counters() or {})
            if d.get("itl_count", 0) >= want and d.get("prefill_count", 0) >= batch:
                break
            await asyncio.sleep(0.05)
        self.prefix_hits += d.get("prefix_hits", 0)  # the engine's prefix cache, if it has one
        self.prefix_queries += d.get("prefix_queries", 0)
        out = []
        if d.get("prefill_count", 0) > 0 and d.get("prefill_sum_s", 0) > 0:
            out.append(Record("prefill", batch, 0.0, batch * prompt_len,
                              d["prefill_sum_s"] / d["prefill_count"],
                              float(batch * prompt_len ** 2)))
        if gen > 1 and d.get("itl_count", 0) > 0 and d.get("itl_sum_s", 0) > 0:
            kv = batch * (prompt_len + gen / 2)  # the run's mean KV load
            out.append(Record("decode", batch, kv, 0, d["itl_sum_s"] / d["itl_count"]))
        return out


async def _timing_for(engine, label: str, url: str | None) -> _Timing:
    """The best timing the engine offers."""
    from .clients.connect import unwrap

    inner = getattr(engine, "engine", None)
    if inner is not None and hasattr(inner, "iterations"):  # an in-process bundled engine
        async def fetch_local(since: int) -> list[dict]:
            return [r.to_dict() for r in list(inner.iterations) if r.seq > since]
        return _LogTiming(engine, label, fetch_local)
    if url is not None:
        import aiohttp

        async def fetch(since: int) -> list[dict]:
            async with aiohttp.ClientSession() as s, s.get(
                    f"{url}/iteration_log", params={"since": since},
                    timeout=aiohttp.ClientTimeout(total=30)) as r:
                r.raise_for_status()
                return list((await r.json())["records"])
        try:
            await fetch(0)
            return _LogTiming(engine, label, fetch)
        except (aiohttp.ClientError, asyncio.TimeoutError, KeyError, ValueError, TypeError):
            pass
    base = unwrap(engine)
    if hasattr(base, "counters") and (await base.counters() or {}).get("itl_count") is not None:
        return _MetricsTiming(engine, label)
    return _Timing(engine, label)


async def probe_concurrency(engine: Engine, need: int, vocab: int,
                            gen: int = PROBE_GEN, settle_s: float = PROBE_SETTLE_S) -> int:
    """The most requests the engine runs at once, up to ``need``: ``need`` requests of ``gen``
    tokens sent together (long enough that all overlap even where the client sends them slowly),
    the most ``/metrics`` reports running while they run (vLLM), else the largest decode batch
    rebuilt from their token streams. Once every request has streamed a token, or the count
    reached ``need``, and ``settle_s`` has passed, the rest is aborted."""
    from aprilsim.validate.reconstruct import reconstruct

    from .clients.connect import stamped, unwrap

    s = stamped(engine)
    base = unwrap(engine)
    seen = 0
    reqs = [GenerateRequest(prompt_ids=_ids(vocab, 99, i, 8), max_new_tokens=gen, replay_len=gen)
            for i in range(need)]
    tasks = [asyncio.ensure_future(s.generate(r)) for r in reqs]
    t_all = None
    while not all(t.done() for t in tasks):
        m = await base.metrics() if hasattr(base, "metrics") else None
        if m is not None:
            seen = max(seen, int(m.running))
        if t_all is None and (seen >= need
                              or len(s.logs) >= need and all(lg.events for lg in s.logs)):
            t_all = time.monotonic()
        if t_all is not None and time.monotonic() - t_all > settle_s:
            await engine.abort_all()
            break
        await asyncio.sleep(0.02)
    await asyncio.gather(*tasks, return_exceptions=True)
    if seen:  # the engine's own running count: exact, where the stream is a timing estimate
        return max(1, min(need, seen))  # (on a loaded client, tokens of two iterations coalesce)
    rows = reconstruct(s.take())
    from_stream = max((r["batch_size"] + r.get("mixed_decode", 0) for r in rows), default=0)
    return max(1, min(need, from_stream))


def server_facts(engine: Engine, info) -> list[str]:
    """What the server says of itself that the simulation takes: the engine family (from the
    client's kind and the server's version), the KV capacity and its blocks (vLLM's
    ``cache_config_info``), vLLM's ``max_num_batched_tokens`` (dev mode's scheduler config)."""
    from .clients.connect import engine_family

    out = [f"engine family {engine_family(engine, info.version)} (from the server: version "
           f"{info.version or 'not reported'}); simulate it with its family's rules"]
    m = (info.raw or {}).get("metrics")
    if info.kv_capacity_tokens:
        block = getattr(m, "block_size", None)
        out.append(f"kv_capacity {info.kv_capacity_tokens} (reported by the server"
                   + (f": {info.kv_capacity_tokens // block} blocks of {block} tokens)"
                      if block else ")"))
    batched = ((info.raw or {}).get("scheduler_config") or {}).get("max_num_batched_tokens")
    if isinstance(batched, int) and batched > 0:
        out.append(f"max_num_batched_tokens {batched} (reported by the server)")
    return out


async def _measure_engine(engine: Engine, timing: _Timing, vocab: tuple[int, str], max_batch: int,
                          batch_sizes: Sequence[int] | None, kv_loads: Sequence[int] | None,
                          gen_tokens: int, progress: Progress_,
                          label: str) -> tuple[list[Record], dict]:
    info = await engine.server_info()
    measured, assumed = [f"vocabulary {vocab[0]} ({vocab[1]})"], []
    if info.max_running_requests:
        conc = int(info.max_running_requests)
        measured.append(f"max_running {conc} (reported by the server)")
    else:
        need = max(max_batch, max(batch_sizes or (1,)))
        conc = await probe_concurrency(engine, need, vocab[0],
                                       gen=min(PROBE_GEN, (info.max_context_length or 2048) - 16))
        if conc >= need:
            assumed.append(f"max_running >= {conc}: the server does not report it and ran all "
                           f"{need} probe requests at once (not written to the preset)")
        else:
            measured.append(f"max_running {conc} (probed: {need} requests sent at once)")
    max_context = info.max_context_length or 2048
    if not info.max_context_length:
        assumed.append("context length 2048 (not reported)")
    cap = min(conc, max_batch)
    runs = plan_sweep(cap, max_context, info.kv_capacity_tokens, batch_sizes, kv_loads, gen_tokens)
    await _run_batch(engine, 1, 8, 4, vocab[0], seed=0)  # warm-up, not recorded
    await timing.begin()
    records: list[Record] = []
    for i, (b, L, g) in enumerate(runs):
        if progress is not None:
            progress(f"calibrating {label}: run {i + 1}/{len(runs)} (batch {b}, prompt {L})")
        records += await timing.run(b, L, g, vocab[0], seed=i + 1)
    records += await timing.finish()
    decode_b = sorted({r.batch_size for r in records if r.phase == "decode"})
    measured.append(f"decode batch sizes {decode_b[0] if decode_b else '-'}-"
                    f"{decode_b[-1] if decode_b else '-'} (sweep up to {cap}), prompt lengths "
                    f"{', '.join(str(x) for x in sorted({L for _, L, g in runs if g > 1}))}, "
                    f"timed by {timing.name}")
    measured += server_facts(engine, info)
    if not info.kv_capacity_tokens:
        assumed.append("kv_capacity: not reported (not written: the scenario's preset holds)")
    queries = getattr(timing, "prefix_queries", 0)
    share = timing.prefix_hits / queries if queries else None  # type: ignore[attr-defined]
    if share is not None:  # the sweep's prompts are distinct: this says the cache is on
        measured.append(f"prefix caching on: {int(queries)} prompt tokens looked up in the sweep, "
                        f"{100 * share:.1f}% served (distinct prompts; a workload figure: model "
                        "it with [cluster] prefix_cache = \"lru\")")
    known = bool(info.max_running_requests) or any(m.startswith("max_running") for m in measured)
    from .clients.connect import engine_family

    out = {"max_running": conc if known else None, "kv_capacity": info.kv_capacity_tokens,
           "vocab_size": vocab[0],
           "family": engine_family(engine, info.version),
           "measured": measured, "assumed": assumed, "timing": timing.name,
           "batch_sizes": decode_b, "client_walls": list(timing.walls)}
    if share is not None:
        out["prefix_hit_share"] = share
    return records, out


async def _measure_local(n: int, batch_sizes, kv_loads, gen_tokens, progress, max_batch: int,
                         ) -> tuple[list[Record], dict]:
    import torch

    from .runner.local import LocalSpec, start_local

    torch.set_num_threads(1)  # as `aprilsim run --local`: one intra-op thread, tiny model
    spec = LocalSpec()
    workers = await start_local(n, spec)
    records: list[Record] = []
    info: dict = {}
    walls: list[tuple[int, float]] = []
    try:
        for w in workers:
            timing = await _timing_for(w, w.name, None)
            recs, info = await _measure_engine(w, timing, (spec.vocab_size, "the bundled model"),
                                               max_batch, batch_sizes, kv_loads, gen_tokens,
                                               progress, w.name)
            records += recs
            walls += info["client_walls"]
    finally:
        for w in workers:
            await w.close()
    info["source"] = (f"{n} bundled engine(s) in process (d_model {spec.d_model}, "
                      f"{spec.n_layers} layers, CPU), live sweep")
    info["label"] = "bundled-local"
    info["client_walls"] = walls
    return records, info


async def measure_http(specs: Sequence[str], batch_sizes, kv_loads, gen_tokens, progress,
                       max_batch: int, vocab_size: int | None) -> tuple[list[Record], dict]:
    """The sweep on engines behind URLs (``specs``, as :func:`real.clients.connect.connect`
    takes them): the records of every engine and the first engine's server info."""
    from .clients.connect import connect, engine_vocab, split_engine_url

    records: list[Record] = []
    info: dict = {}
    timing_names, measured, assumed = [], [], []
    walls: list[tuple[int, float]] = []
    for spec in specs:
        kind, url = split_engine_url(spec)
        engine = connect(spec)
        try:
            if not await engine.health():
                raise ValueError(f"{spec}: the engine does not answer /health")
            vocab = await engine_vocab(engine, vocab_size)
            timing = await _timing_for(engine, url, url if kind != "vllm" else None)
            timing_names.append(timing.name)
            recs, info = await _measure_engine(engine, timing, vocab, max_batch, batch_sizes,
                                               kv_loads, gen_tokens, progress, spec)
            records += recs
            walls += info["client_walls"]
            measured += [f"{spec}: {m}" for m in info["measured"]]
            assumed += [f"{spec}: {a}" for a in info["assumed"]]
        finally:
            await engine.close()
    info.update(measured=measured, assumed=assumed, client_walls=walls,
                timing=timing_names[0] if len(set(timing_names)) == 1 else "mixed timings",
                source=f"engines {', '.join(specs)} ({', '.join(sorted(set(timing_names)))}), "
                       "live sweep",
                label="calibrated-live")
    return records, info


def measure(local: int | None = None, engines: Sequence[str] | None = None,
            batch_sizes: Sequence[int] | None = None, kv_loads: Sequence[int] | None = None,
            gen_tokens: int = DEFAULT_GEN_TOKENS, progress: Progress_ = None,
            max_batch: int | None = None, vocab_size: int | None = None,
            scenario: str | None = None, scale: float | None = None,
            ) -> tuple[list[Record], dict]:
    """Run the sweep on `local` in-process engines or on the servers at `engines`; returns the
    timing records and what is known of the engine (max_running, kv_capacity, source, wall_s,
    and the lists of what was measured and what was assumed). ``scenario`` (a file) sets the
    largest batch and the KV loads to what its rollouts reach at ``scale``."""
    t = time.monotonic()
    if scenario is not None:  # the batch sizes and KV loads its rollouts reach on these engines
        from aprilsim.config import ScenarioError, load_scenario
        from aprilsim.engine.calibration.reach import scenario_reach

        try:
            sc = load_scenario(scenario)
        except ScenarioError as e:
            raise ValueError(str(e)) from None
        n = local if local is not None else len(list(engines or ()))
        peak, loads = scenario_reach(sc, max(1, n), 1.0 if scale is None else scale)
        max_batch, kv_loads = max_batch or peak, kv_loads or loads
    mb = max_batch or (LOCAL_MAX_BATCH if local is not None else DEFAULT_MAX_BATCH)
    if local is not None:
        records, info = asyncio.run(_measure_local(local, batch_sizes, kv_loads, gen_tokens,
                                                   progress, mb))
    else:
        records, info = asyncio.run(measure_http(list(engines or ()), batch_sizes, kv_loads,
                                                  gen_tokens, progress, mb, vocab_size))
    info["wall_s"] = round(time.monotonic() - t, 2)
    if progress is not None:
        progress(f"calibration sweep done ({len(records)} records, {info['wall_s']} s)")
    return records, info
