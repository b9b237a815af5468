"""vLLM V1's step scheduling (vLLM 0.32, `vllm/v1/core/sched/scheduler.py`), reproduced exactly
for text generation: FCFS, chunked prefill, prefix caching on or off, one full-attention KV group,
no speculative decoding, no KV connector, the synchronous `Scheduler` (the engine steps, then
the outputs come back, then it schedules again).

Each `schedule()`, as vLLM's `Scheduler.schedule`:

1. Running requests, in running order, while the token budget (`max_num_batched_tokens`) lasts:
   each gets min(its uncomputed tokens, the budget, max_model_len - computed - 1) tokens (a
   decode is 1; a prefill in progress gets its next chunk). KV blocks are allocated for them
   (`KVCacheManager.allocate_slots`); if blocks run short the LAST running request is preempted
   (its blocks freed, its computed tokens reset to 0, put at the HEAD of the waiting queue) and
   the allocation retried; if the request preempts itself, the running pass stops.
2. Only if nothing was preempted this step: waiting requests in queue order, while budget and
   `max_num_seqs` allow. Each looks up its longest prefix-cache hit (full blocks only, at most
   num_tokens - 1 tokens), and is admitted only if the blocks for its WHOLE current sequence fit
   (`scheduler_reserve_full_isl`, on by default) and, when requests are running, with the
   watermark left free; it is scheduled for its uncached tokens up to the budget (a chunk; with
   `enable_chunked_prefill` off, a request whose uncached tokens exceed the budget left is not
   scheduled). The first that does not fit stops admission (head-of-line, FCFS).

Every block that becomes full of computed tokens enters the prefix cache at allocation; a request
in prefill samples nothing; `update` appends one token per request that finished its prefill or
decodes, and finishes those that reach `max_tokens`, max_model_len or their stop token (freeing
their blocks, tail first). `abort` frees at once. See `docs/simulator.md` ("vLLM family") for
what this mirrors, function by function, and how it is checked against vLLM's own scheduler.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from aprilsim.engine.families.vllm_blocks import BlockPool

WAITING, RUNNING, PREEMPTED, FINISHED = 0, 1, 2, 3
NO_PARENT = 0x5EED  # the first block's parent in the hash chain (vLLM's NONE_HASH)


@dataclass(frozen=True, slots=True)
class VllmConfig:
    """The scheduler's knobs, with vLLM's names. `num_blocks` counts the null block (vLLM's
    `num_gpu_blocks`), so `num_blocks - 1` blocks hold KV."""

    num_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    block_size: int = 16
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    watermark: float = 0.0
    scheduler_reserve_full_isl: bool = True

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError("max_num_batched_tokens must be >= max_num_seqs (as vLLM checks)")
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError("watermark must be in [0, 1)")


@dataclass(slots=True)
class StepPlan:
    """One step's plan: (request id, tokens) in vLLM's order with, alike, each one's tokens
    already in KV (what its attention reads besides its new tokens: the cost model's context),
    the requests preempted (in the order chosen), those admitted with their prefix-cache hit
    tokens, and (request id, output index) of those that sample a token this step (all scheduled
    but prefill chunks that leave tokens uncomputed)."""

    scheduled: list[tuple[int, int]] = field(default_factory=list)
    context: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    admitted: list[tuple[int, int]] = field(default_factory=list)
    samples: list[tuple[int, int]] = field(default_factory=list)


class _Req:
    """One request's scheduler state (vLLM's `Request` plus its manager bookkeeping)."""

    __slots__ = ("rid", "tokens", "num_prompt", "max_tokens", "stop", "computed", "blocks",
                 "cached", "keys", "status", "chunk", "preemptions")

    def __init__(self, rid: int, tokens: list[int], max_tokens: int, stop: int) -> None:
        self.rid = rid
        self.tokens = tokens
        self.num_prompt = len(tokens)
        self.max_tokens = max_tokens
        self.stop = stop
        self.computed = 0
        self.blocks: list[int] = []
        self.cached = 0  # blocks entered in the prefix cache (num_cached_block)
        self.keys: list[int] = []  # chained hashes of its full blocks (request.block_hashes)
        self.status = WAITING
        self.chunk = False  # is_prefill_chunk
        self.preemptions = 0


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class VllmSteps:
    """vLLM V1's scheduler state: `add`, `abort`, `schedule` -> `StepPlan`, `update`."""

    def __init__(self, config: VllmConfig) -> None:
        self.cfg = config
        self.pool = BlockPool(config.num_blocks, config.enable_prefix_caching)
        self.watermark_blocks = int(config.watermark * config.num_blocks)
        self.requests: dict[int, _Req] = {}
        self.waiting: deque[_Req] = deque()
        self.running: list[_Req] = []
        self._last: list[_Req] = []
        self._left = 0  # the budget the last plan left (`admit_more`)
        self.preemptions = 0

    # -- requests -------------------------------------------------------------------------
    def add(self, rid: int, prompt: list[int], max_tokens: int, stop_token: int = -1) -> None:
        """Queue a request (FCFS: queue order is add order) for `max_tokens` outputs at most;
        `stop_token` finishes it when sampled (-1: none). Ids must be new."""
        if rid in self.requests:
            raise ValueError(f"request {rid} already added")
        if not prompt or max_tokens < 1:
            raise ValueError("a request needs a prompt and max_tokens >= 1")
        r = _Req(rid, list(prompt), max_tokens, stop_token)
        self._hash_blocks(r)
        self.requests[rid] = r
        self.waiting.append(r)

    def abort(self, rid: int) -> bool:
        """Finish `rid` now (vLLM's `finish_requests(..., FINISHED_ABORTED)` between steps):
        out of its queue, its blocks freed tail first. False if it was not live."""
        r = self.requests.pop(rid, None)
        if r is None:
            return False
        if r.status == RUNNING:
            self.running.remove(r)
        else:
            self.waiting.remove(r)
        r.status = FINISHED
        self._free(r)
        return True

    def tokens(self, rid: int) -> list[int]:
        """A live request's tokens: prompt, then outputs."""
        return self.requests[rid].tokens

    def num_output(self, rid: int) -> int:
        """Tokens a live request has generated."""
        r = self.requests[rid]
        return len(r.tokens) - r.num_prompt

    def has_work(self) -> bool:
        """Unfinished requests remain (vLLM's `has_unfinished_requests`)."""
        return bool(self.requests)

    def reset_prefix_cache(self) -> bool:
        """vLLM's `Scheduler.reset_prefix_cache()`: done only when no block is in use."""
        return self.pool.reset_prefix_cache()

    @property
    def num_free_blocks(self) -> int:
        """Free blocks, cached ones included (vLLM's `BlockPool.get_num_free_blocks`)."""
        return self.pool.num_free

    # -- hashing --------------------------------------------------------------------------
    def _hash_blocks(self, r: _Req) -> None:
        """Extend `r.keys` over its new full blocks (vLLM's request block hasher: each hash
        chains its parent's, so equal keys mean equal token prefixes). Python's 64-bit hash of
        ints and tuples is deterministic; vLLM hashes the same chain with sha256."""
        bs = self.cfg.block_size
        keys, toks = r.keys, r.tokens
        for i in range(len(keys), len(toks) // bs):
            keys.append(hash((keys[i - 1] if i else NO_PARENT, tuple(toks[i * bs:(i + 1) * bs]))))

    # -- one step ---------------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        """Plan one step (vLLM's `Scheduler.schedule`); computed tokens advance at once, as in
        `_update_after_schedule`. Call `update` with the sampled tokens before the next one."""
        plan = StepPlan()
        self._last = []
        budget = self._schedule_running(plan, self.cfg.max_num_batched_tokens)
        if not plan.preempted:
            budget = self._schedule_waiting(plan, budget)
        self._left = budget
        samples = plan.samples
        for r in self._last:
            if not r.chunk:
                samples.append((r.rid, len(r.tokens) - r.num_prompt))
        return plan

    def admit_more(self, plan: StepPlan) -> None:
        """Requests added since `plan` was made join it as if they had been queued before it:
        its waiting pass goes on from where it stopped (nothing changes unless it stopped on an
        empty queue: a refused head, the budget or `max_num_seqs` stop the newcomers too; a
        step that preempted admits nothing)."""
        if plan.preempted:
            return
        n = len(self._last)
        self._left = self._schedule_waiting(plan, self._left)
        for r in self._last[n:]:
            if not r.chunk:
                plan.samples.append((r.rid, len(r.tokens) - r.num_prompt))

    def update(self, sampled: Mapping[int, int]) -> list[int]:
        """Append each sampling request's token (`sampled[rid]` for each (rid, _) of the plan's
        `samples`) and finish those that stop (vLLM's `update_from_output` and `check_stop`):
        returns the finished ids in the order vLLM processes them."""
        bs, mml = self.cfg.block_size, self.cfg.max_model_len
        finished = []
        for r in self._last:
            if r.chunk or r.status != RUNNING:
                continue
            tok = sampled[r.rid]
            toks = r.tokens
            toks.append(tok)
            if len(toks) % bs == 0:
                self._hash_blocks(r)
            if tok == r.stop or len(toks) >= mml or len(toks) - r.num_prompt >= r.max_tokens:
                r.status = FINISHED
                del self.requests[r.rid]
                self._free(r)
                finished.append(r.rid)
        if finished:
            self.running = [x for x in self.running if x.status != FINISHED]
        self._last = []
        return finished

    def _scheduled(self, plan: StepPlan, r: _Req, n: int) -> None:
        """Record `n` tokens for `r` and advance its computed tokens (`_update_after_schedule`:
        no later decision of the step reads them)."""
        plan.scheduled.append((r.rid, n))
        plan.context.append(r.computed)
        self._last.append(r)
        r.computed += n
        r.chunk = r.computed < len(r.tokens)

    def _schedule_running(self, plan: StepPlan, budget: int) -> int:
        """The running pass; returns the budget left."""
        running, bs, mml = self.running, self.cfg.block_size, self.cfg.max_model_len
        caching = self.cfg.enable_prefix_caching
        sched, context, last = plan.scheduled, plan.context, self._last
        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            c = r.computed
            ntok = len(r.tokens)
            n = ntok - c  # min(uncomputed, budget, mml - computed - 1), unrolled
            if n > budget:
                n = budget
            if n > mml - c - 1:
                n = mml - c - 1
            if n <= 0:
                i += 1
                continue
            end = c + n
            # allocate_slots has work only past the blocks held or on filling a block
            if ((end > len(r.blocks) * bs or (caching and end // bs > r.cached))
                    and not self._grow_or_preempt(plan, r, n)):
                break
            sched.append((r.rid, n))  # as _scheduled, inlined
            context.append(c)
            last.append(r)
            r.computed = end
            r.chunk = end < ntok
            budget -= n
            i += 1
        return budget

    def _grow_or_preempt(self, plan: StepPlan, r: _Req, n: int) -> bool:
        """Allocate for `r`, preempting the last running request until it fits; False if `r`
        itself was preempted."""
        running = self.running
        while not self._grow(r, n):
            victim = running.pop()  # FCFS: the last running request
            self._preempt(victim)
            plan.preempted.append(victim.rid)
            if victim is r:
                return False
        return True

    def _schedule_waiting(self, plan: StepPlan, budget: int) -> int:
        """The waiting pass (run only when nothing was preempted this step); returns the budget
        left."""
        bs, waiting, running = self.cfg.block_size, self.waiting, self.running
        chunking = self.cfg.enable_chunked_prefill
        while budget > 0 and waiting and len(running) < self.cfg.max_num_seqs:
            r = waiting[0]
            hits = self._hits(r)
            hit = len(hits) * bs
            n = len(r.tokens) - hit
            if n > budget:
                if not chunking:  # it waits for a step with the budget for all of it
                    break
                n = budget
            if not self._admit(r, hits, hit, n):
                break
            waiting.popleft()
            running.append(r)
            r.status = RUNNING
            r.computed = hit
            plan.admitted.append((r.rid, hit))
            self._scheduled(plan, r, n)
            budget -= n
        return budget

    # -- KV blocks (KVCacheManager) -------------------------------------------------------
    def _hits(self, r: _Req) -> list[int]:
        """The longest prefix-cache hit, full blocks of at most num_tokens - 1 tokens
        (`KVCacheManager.get_computed_blocks`)."""
        if not self.cfg.enable_prefix_caching:
            return []
        return self.pool.longest_hit(r.keys, (len(r.tokens) - 1) // self.cfg.block_size)

    def _grow(self, r: _Req, n: int) -> bool:
        """`allocate_slots` for a running request scheduling `n` more tokens."""
        bs = self.cfg.block_size
        need = min(r.computed + n, self.cfg.max_model_len)
        k = _cdiv(need, bs) - len(r.blocks)
        if k > self.pool.num_free:
            return False
        if k > 0:
            r.blocks += self.pool.get_new_blocks(k)
        self._cache(r, min(r.computed + n, len(r.tokens)))
        return True

    def _admit(self, r: _Req, hits: list[int], hit: int, n: int) -> bool:
        """`allocate_slots` for a waiting request with prefix hit `hits` (`hit` tokens)
        scheduling `n` tokens: the full-sequence check, the watermark, then the chunk."""
        cfg, pool = self.cfg, self.pool
        bs, mml = cfg.block_size, cfg.max_model_len
        reserve = self.watermark_blocks if self.running else 0
        reserve += list(map(pool.ref.__getitem__, hits)).count(0)  # hits off the free queue
        if cfg.scheduler_reserve_full_isl:
            full = _cdiv(min(len(r.tokens), mml), bs)
            if max(full - len(hits), 0) + reserve > pool.num_free:
                return False
        need = min(hit + n, mml)
        if max(_cdiv(need, bs) - len(hits), 0) + reserve > pool.num_free:
            return False
        if hits:
            pool.touch(hits)
            r.blocks = list(hits)
            r.cached = len(hits)
        k = _cdiv(need, bs) - len(r.blocks)
        if k > 0:
            r.blocks += pool.get_new_blocks(k)
        self._cache(r, min(hit + n, len(r.tokens)))
        return True

    def _cache(self, r: _Req, num_tokens: int) -> None:
        """Enter the request's newly full blocks in the prefix cache (`cache_blocks`)."""
        if not self.cfg.enable_prefix_caching:
            return
        full = num_tokens // self.cfg.block_size
        if r.cached < full:
            self.pool.cache_full(r.blocks, r.keys, r.cached, full)
            r.cached = full

    def _preempt(self, r: _Req) -> None:
        """`_preempt_request`: blocks freed, computed tokens reset, to the head of waiting."""
        self._free(r)
        r.status = PREEMPTED
        r.computed = 0
        r.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(r)

    def _free(self, r: _Req) -> None:
        """Free the request's blocks tail first (`SingleTypeKVCacheManager.free`)."""
        self.pool.free_blocks(r.blocks[::-1])
        r.blocks = []
        r.cached = 0
