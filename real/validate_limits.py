"""The engines' limits and rules the simulation of a validate takes, and where each came from.

The family comes from the engine validate connected to (:func:`real.clients.connect.engine_family`:
the client's kind, the server's version); its rules (abort landing, where a retracted request
re-queues, the prefix cache) are the family object's (:func:`engine_rules`: the one place that
reads them, from ``aprilsim.engine.families``). The numbers, best first:

- ``max_running``: what the server reports (SGLang and bundled ``/server_info``, vLLM's
  ``max_num_seqs`` in dev mode), else ``--max-running``, else **probed**: as many short requests
  as the runs may hold on one engine sent at once, the most the engine's own metrics show
  running together (vLLM ``/metrics``; the rebuilt streams elsewhere);
- ``kv_capacity``: the server's (vLLM: ``num_gpu_blocks x block_size`` of
  ``vllm:cache_config_info``, so its KV blocks);
- vLLM's ``max_num_batched_tokens`` (dev mode's scheduler config): the token budget of one step,
  the simulated vLLM family's;
- the prefix cache's grain: vLLM's block size, SGLang's page size.
"""

from __future__ import annotations

import math
from typing import Any

from aprilsim.config import Scenario

DEFAULT_MAX_RUNNING = 64  # assumed only where nothing reports, gives or probes it
PROBE_CAP = 512  # at most this many requests in the concurrency probe


def engine_rules(engine: Any, version: str | None, kv_block: int | None = None) -> dict[str, Any]:
    """The engine family a live engine runs (`real.clients.connect.engine_family`) with its
    rules' parameters (when an abort lands, where a retracted request re-enters the queue, the
    prefix cache's grain) and the prefix cache its servers keep by default: what the matched
    simulation takes (`aprilsim.validate.scaled.matched_engine`), read from the family object
    (`aprilsim.engine.families`). The server's own cache grain (`kv_block`: vLLM's KV block
    size, SGLang's page size) replaces the family's default one."""
    from aprilsim.engine.families import family_params, make_family
    from real.clients.connect import engine_family

    name = engine_family(engine, version)
    fam = make_family(name)
    rules: dict[str, Any] = {"family": name}
    for key in family_params(name):
        rules["prefix_cache_block" if key == "cache_block" else key] = getattr(fam, key)
    rules["prefix_cache"] = fam.live_prefix_cache
    if fam.live_prefix_cache == "none":
        rules.pop("prefix_cache_block", None)  # no cache: no grain to speak of
        return rules
    # validate's syncs relabel the weights the engines hold (no checkpoint is loaded): a live
    # cache outlives every sync, and so must the simulation's
    rules["prefix_cache_flush"] = False
    if kv_block:
        rules["prefix_cache_block"] = int(kv_block)
    return rules


def kv_block_size(info: Any) -> int | None:
    """The prefix cache's grain a server reports, or None: vLLM's KV block size
    (``vllm:cache_config_info`` in /metrics), SGLang's resolved ``page_size`` (/server_info,
    the same on every worker)."""
    raw = getattr(info, "raw", None) or {}
    block = getattr(raw.get("metrics"), "block_size", None)
    if block:
        return int(block)
    pages = {w.get("page_size") for w in raw.get("workers") or [] if isinstance(w, dict)}
    if len(pages) == 1:
        (page,) = pages
        if isinstance(page, int) and not isinstance(page, bool) and page >= 1:
            return page
    return None


def probe_need(sc: Scenario, specs: list[str], n_engines: int) -> int:
    """How many requests the runs may hold on one engine at once: the largest over-provisioning
    ratio of the schedulers (APRIL's ``ratio``; 2 for the others, which may hold a step ahead)
    times a batch's samples, spread over the engines; at most PROBE_CAP."""
    ratio = 2.0
    for s in specs:
        r = sc.knobs_of(s).get("ratio")  # the knob as it runs: defaults, table, spec
        if isinstance(r, (int, float)):
            ratio = max(ratio, float(r))
    return min(PROBE_CAP, math.ceil(ratio * sc.batch_size * sc.group_size / max(1, n_engines)))


async def max_running_of(engine: Any, info: Any, opts: Any, need: int,
                         vocab: int) -> tuple[int, str]:
    """The concurrency the simulation assumes, and where it came from (see the docstring)."""
    if info.max_running_requests:
        return int(info.max_running_requests), "reported by the server"
    if opts.max_running:
        return int(opts.max_running), "--max-running"
    if opts.target.local is not None:
        return DEFAULT_MAX_RUNNING, "assumed"
    from real.calibrate import PROBE_GEN, probe_concurrency

    seen = await probe_concurrency(engine, need, vocab,
                                   gen=min(PROBE_GEN, (info.max_context_length or 2048) - 16))
    if seen >= need:
        return seen, f"probed: all {need} requests sent at once ran together (at least {seen})"
    return seen, f"probed: {need} requests sent at once, at most {seen} ran together"


async def engine_limits(engine: Any, opts: Any, need: int,
                        vocab: int) -> tuple[dict[str, Any], list[str], dict[str, Any]]:
    """(the limits and rules :func:`aprilsim.validate.scaled.matched_engine` takes, notes for
    the report, the facts behind them) for the engines behind ``engine`` (the first one);
    ``need``: how many requests a probe of the concurrency sends (:func:`probe_need`)."""
    from real.clients.connect import engine_family

    info = await engine.server_info()
    family = engine_family(engine, info.version)
    running, how = await max_running_of(engine, info, opts, need, vocab)
    limits: dict[str, Any] = {"max_running": running,
                              "kv_capacity": int(info.kv_capacity_tokens or 1 << 30),
                              **engine_rules(engine, info.version, kv_block_size(info))}
    notes = [f"engine family {family} (from the engine: {type(_base(engine)).__name__}, "
             f"version {info.version or 'not reported'})",
             f"max_running {running}: {how}"]
    m = (info.raw or {}).get("metrics")
    if info.kv_capacity_tokens:
        blocks = (f" ({info.kv_capacity_tokens // m.block_size} blocks of {m.block_size} tokens)"
                  if getattr(m, "block_size", None) else "")
        notes.append(f"kv_capacity {info.kv_capacity_tokens}{blocks}: reported by the server")
    else:
        notes.append("kv_capacity: not reported (unbounded in the simulation)")
    batched = ((info.raw or {}).get("scheduler_config") or {}).get("max_num_batched_tokens")
    if isinstance(batched, int) and batched > 0:
        key = "max_num_batched_tokens" if family == "vllm" else "max_prefill_tokens"
        limits[key] = batched
        notes.append(f"max_num_batched_tokens {batched}: reported by the server (the simulated "
                     "token budget per step)")
    elif family == "vllm":
        notes.append("max_num_batched_tokens: not reported (vLLM reports its scheduler config "
                     "only in dev mode); the simulation's step budget stays 8192")
    facts = {"family": family, "max_running_source": how, "probe_need": need}
    return limits, notes, facts


def _base(engine: Any) -> Any:
    from real.clients.connect import unwrap

    return unwrap(engine)
