"""vLLM's scheduler (`VllmSteps`' rules) for the fast engine: the same steps, planned so that a
stretch of pure-decode steps is one event.

Why stretches exist: under vLLM's rules the running list is always [decoding requests...][at
most one request mid-prefill, last] (a waiting request is admitted at the end of the list, and
only the last admission of a step can be left mid-prefill, the budget then spent), the budget
covers every decode (max_num_batched_tokens >= max_num_seqs), so every decoding request gets
exactly one token per step: its generated count is `base + it` (`it`: steps done) and it needs a
new KV block at the steps where its computed tokens are a multiple of the block size, a phase
(`phase`) fixed while it decodes. So with no request mid-prefill and no admission possible, the
next steps are identical decodes, and how many blocks m of them take is a count over the phases
(`alloc`). They stay so until a request finishes (a heap of finish steps), the blocks run out
(the step that would fail is planned exactly, preempting as vLLM does), or an outside call:
admission cannot become possible meanwhile (free blocks only fall, the queue head's prefix hits
only shrink).

Every other step is planned exactly, as `VllmSteps.schedule` plans it, on the run-based block
pool (`vllm_pool`); a decoding request's blocks are counted, not listed, and its own run of
blocks is brought up to date only when it leaves (`materialize`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from heapq import heappop, heappush
from typing import Any

from aprilsim.engine.families.vllm_pool import Piece, Pool, Run
from aprilsim.engine.request import Request

SHIFT = 32  # finish-heap keys: step << SHIFT | rid


class VReq:
    """One request in the scheduler: its `Request`, its content's keys (`prompt`: its prompt's,
    whose `pb` full blocks are block i of that prompt; `sample`: the key of its own blocks
    beyond), its computed tokens and cached blocks (`held`: the runs it holds in block order,
    its prefix hit's and its prompt's; blocks [glo, ghi) of its sample: the run it fills, made a
    `Run` when it leaves (no other request looks its sample up meanwhile); ghi -1: none), and
    while it decodes
    `base` (generated = base + it), `phase`, `fin` (the step at whose end it stops)."""

    __slots__ = ("base", "computed", "dec", "fin", "gen", "ghi", "glo", "held", "input_len",
                 "max_new", "ntok0", "order", "pb", "phase", "priority", "prompt", "req", "rid",
                 "sample", "shared", "target")

    def __init__(self, req: Request, prompt: int, pb: int, sample: int) -> None:
        self.req = req
        self.rid = req.rid
        self.input_len, self.shared, self.priority = req.input_len, req.shared, req.priority
        self.gen = req.gen
        self.ntok0 = req.input_len + req.shared  # its tokens when sent (prompt + carried)
        self.max_new, self.target = req.max_new, req.target_new
        self.pb = pb
        self.prompt = prompt
        self.sample = sample
        self.computed = 0
        self.held: list[Run] = []
        self.glo = self.ghi = -1
        self.base = self.phase = self.order = self.fin = 0
        self.dec = False


@dataclass(slots=True)
class Exact:
    """One step planned exactly: rows (request, tokens, context) in vLLM's order, the requests
    preempted, admitted (with their prefix-cache hit tokens), the budget left, and the decode
    rows' count and context, the prefill rows' tokens, attention term and count."""

    rows: list[tuple[VReq, int, int]] = field(default_factory=list)
    dec: int = 0  # decoding requests scheduled (one token each, not in `rows`)
    preempted: list[VReq] = field(default_factory=list)
    admitted: list[tuple[VReq, int]] = field(default_factory=list)
    left: int = 0
    b: int = 0
    k: int = 0
    tokens: int = 0
    sq: int = 0
    prows: int = 0


class Core:
    """The scheduler's state between steps (module docstring), with `Pool` for its blocks."""

    def __init__(self, rules: Any) -> None:
        self.bs: int = rules.block_size
        self.budget: int = rules.budget
        self.max_seqs: int = rules.max_running
        self.caching: bool = rules.caching
        self.chunking: bool = rules.chunking
        self.reserve_full: bool = rules.reserve_full
        self.wm: int = rules.watermark_blocks
        self.pool = Pool(rules.num_blocks, rules.caching)
        self.it = 0
        self.running: dict[int, VReq] = {}
        self.waiting: deque[VReq] = deque()
        self.pf: VReq | None = None  # the request mid-prefill (last in `running`)
        self.cnt = [0] * self.bs  # decoding requests by phase
        self.b = 0  # decoding requests
        self.sum_c0 = 0  # sum of (ntok0 + base - 1): their computed tokens are that + b * it
        self.heap: list[int] = []  # finish steps (stale entries skipped)
        self.orders = 0
        self.preemptions = 0

    # ------------------------------------------------------------------ decoding requests
    def alloc(self, m: int) -> int:
        """Blocks the decoding requests take over the next m steps (steps it .. it+m-1)."""
        bs, cnt = self.bs, self.cnt
        q, r = divmod(m, bs)
        n = self.b * q
        if r:  # the phases that allocate at offsets 0 .. r-1: j, j-1, ... (cyclically)
            j = -self.it % bs
            if j >= r - 1:
                n += sum(cnt[j - r + 1:j + 1])
            else:
                n += sum(cnt[:j + 1]) + sum(cnt[bs - (r - 1 - j):])
        return n

    def span_limit(self, free: int) -> int:
        """The most steps from now whose allocations fit in `free` blocks."""
        b = self.b
        q = free // b
        left = free - b * q
        bs, cnt, it = self.bs, self.cnt, self.it
        r = 0
        while r < bs - 1:
            c = cnt[(-it - r) % bs]
            if c > left:
                break
            left -= c
            r += 1
        return bs * q + r

    def first_finish(self) -> int:
        """The step at whose end the first decoding request stops."""
        heap, running = self.heap, self.running
        while True:
            key = heap[0]
            r = running.get(key & 0xFFFF_FFFF)
            if r is not None and r.dec and r.fin == key >> SHIFT:
                return key >> SHIFT
            heappop(heap)

    def start_decoding(self, r: VReq, it: int) -> None:
        """`r` sampled its first token of this run: from step `it` on it decodes."""
        r.dec = True
        r.base = base = r.gen - it
        c0 = r.ntok0 + base - 1
        r.phase = c0 % self.bs
        self.cnt[r.phase] += 1
        self.b += 1
        self.sum_c0 += c0
        r.fin = r.target - base - 1
        heappush(self.heap, r.fin << SHIFT | r.rid)

    def stop_decoding(self, r: VReq, scheduled: int) -> None:
        """`r` leaves the decoding set with `scheduled` steps planned (generated tokens as of
        `self.it`; computed tokens as of `scheduled` steps): its counts are written out."""
        r.dec = False
        self.cnt[r.phase] -= 1
        self.b -= 1
        self.sum_c0 -= r.ntok0 + r.base - 1
        r.gen = r.base + self.it
        r.computed = r.ntok0 + r.base + scheduled - 1
        if r.ghi >= 0:
            r.ghi = max(r.glo, r.computed // self.bs)

    # ------------------------------------------------------------------ blocks of a request
    def lookup(self, r: VReq, cut: dict[Run, int] | None = None) -> tuple[list[Piece], int, int]:
        """The prefix-cache hit of waiting request `r` (vLLM's `get_computed_blocks`: whole
        blocks, at most its tokens but one): the pieces of runs that serve it (its prompt's
        blocks, then its sample's), blocks in all, and how many of them are free (off the free
        queue once taken); `cut`: after an allocation still to come (`Pool.front_cut`)."""
        if not self.caching:
            return [], 0, 0
        cap = (r.ntok0 + r.gen - 1) // self.bs
        pool, pb = self.pool, r.pb
        pieces = pool.hit(r.prompt, 0, min(cap, pb), cut) if pb else []
        h = pieces[-1][2] if pieces else 0
        if h == pb and cap > h:
            more = pool.hit(r.sample, h, cap, cut)
            if more:
                pieces += more
                h = more[-1][2]
        off = 0
        for run, a, z in pieces:
            if not run.ref:
                off += z - a
        return pieces, h, off

    def fill(self, r: VReq, lo: int, hi: int) -> None:
        """Blocks lo .. hi-1 of `r` became full of scheduled tokens: cached (vLLM caches a
        block when it allocates it full)."""
        if not self.caching or hi <= lo:
            return
        pb = r.pb
        if lo < pb:
            r.held.append(self.pool.new_run(r.prompt, lo, min(hi, pb), r))
        if hi > pb:
            r.ghi = hi

    def free_blocks(self, r: VReq) -> None:
        """`r` releases its blocks, its last one first (vLLM's `free`): the partial block to
        the front of the free queue, its full blocks to the back as their last holder leaves."""
        pool, bs, c = self.pool, self.bs, r.computed
        if not self.caching:
            n = -(-c // bs)
            pool.free += n
            pool.unhashed += n
            return
        if c % bs:
            pool.free += 1
            pool.unhashed += 1
        if r.ghi > r.glo:  # its sample's run, cached after every copy present
            pool.free_run(r.sample, r.glo, r.ghi)
        r.ghi = -1
        held = r.held
        for i in range(len(held) - 1, -1, -1):
            pool.release(held[i], r)
        r.held = []

    def leave(self, r: VReq, scheduled: int) -> None:
        """Running request `r` leaves the engine (finished, aborted or preempted)."""
        if r.dec:
            self.stop_decoding(r, scheduled)
        del self.running[r.rid]
        if r is self.pf:
            self.pf = None
        self.free_blocks(r)

    def preempt(self, r: VReq) -> None:
        """vLLM's `_preempt_request`: blocks freed, computed tokens reset, to the queue's head."""
        self.leave(r, self.it)
        r.computed = 0
        r.req.retractions += 1
        self.preemptions += 1
        self.waiting.appendleft(r)

    def blocks_held(self, r: VReq) -> int:
        """Blocks a non-decoding running request holds."""
        return -(-r.computed // self.bs)

    # ------------------------------------------------------------------ planning
    def span(self, limit: int) -> int:
        """How many identical pure-decode steps follow from here (0: the next step must be
        planned exactly): none mid-prefill, no admission this step (so none before a request
        leaves), and up to the first finish, the last step whose blocks fit, and `limit`."""
        b = self.b
        if self.pf is not None or not b:
            return 0
        pool = self.pool
        need = self.cnt[-self.it % self.bs]
        if need > pool.free:
            return 0
        w = self.waiting
        if w and len(self.running) < self.max_seqs and self.budget > b \
                and self.admissible(w[0], self.budget - b, need):
            return 0
        m = self.first_finish() - self.it + 1
        if m > limit:
            m = limit
        if pool.free < b * (m // self.bs + 1) and self.alloc(m) > pool.free:
            m = self.span_limit(pool.free)
        return m

    def admissible(self, r: VReq, budget: int, taken: int) -> bool:
        """Would waiting request `r` be admitted with `budget` tokens left once the running
        requests take `taken` blocks (vLLM's `allocate_slots` checks, nothing taken: the hit is
        looked up as that allocation leaves the cache)?"""
        pool = self.pool
        cut = pool.front_cut(taken) if taken > pool.unhashed and self.caching else None
        _, h, off = self.lookup(r, cut)
        return self._fits(r, h, off, budget, pool.free - taken)

    def _fits(self, r: VReq, h: int, off: int, budget: int, free: int) -> bool:
        """`admissible`'s checks for a hit of `h` blocks, `off` of them free."""
        bs = self.bs
        ntok = r.ntok0 + r.gen
        if not self.chunking and ntok - h * bs > budget:  # it waits for the whole budget
            return False
        reserve = (self.wm if self.running else 0) + off
        if self.reserve_full and max(-(-ntok // bs) - h, 0) + reserve > free:
            return False
        need = h * bs + min(ntok - h * bs, budget)
        return max(-(-need // bs) - h, 0) + reserve <= free

    def plan_exact(self) -> Exact:
        """Plan the next step as `VllmSteps.schedule` does: the running pass (decoding requests
        counted together unless a block runs out), then the waiting pass unless it preempted."""
        ex = Exact()
        pool, bs, it, pf = self.pool, self.bs, self.it, self.pf
        b = self.b
        need = self.cnt[-it % bs] if b else 0
        pf_n = pf_need = 0
        if pf is not None:
            pf_n = min(pf.ntok0 + pf.gen - pf.computed, self.budget - b)
            pf_need = -(-(pf.computed + pf_n) // bs) - -(-pf.computed // bs)
        if need + pf_need <= pool.free:
            pool.take(need + pf_need)
            ex.dec = ex.b = b
            ex.k = self.sum_c0 + b * it
            left = self.budget - b
            if pf is not None:
                self._chunk(ex, pf, pf_n)
                left -= pf_n
        else:
            left = self._walk(ex)
        ex.left = left
        if not ex.preempted:
            self.admit(ex)
        return ex

    def _chunk(self, ex: Exact, r: VReq, n: int) -> None:
        """Running request `r` mid-prefill computes `n` more tokens (its blocks are taken)."""
        c = r.computed
        ex.rows.append((r, n, c))
        self._row(ex, n, c)
        r.computed = c + n
        self.fill(r, c // self.bs, r.computed // self.bs)

    @staticmethod
    def _row(ex: Exact, n: int, c: int) -> None:
        """Price a row of `n` new tokens over `c`: a decode row, or a prefill row."""
        if n == 1:
            ex.b += 1
            ex.k += c
        else:
            ex.prows += 1
            ex.tokens += n
            ex.sq += (c + n) * (c + n) - c * c

    def _walk(self, ex: Exact) -> int:
        """The running pass request by request (a block runs out this step): each takes its
        blocks, or the last running request is preempted until it can; returns the budget
        left."""
        pool, bs, it = self.pool, self.bs, self.it
        order = list(self.running.values())
        budget, i = self.budget, 0
        while i < len(order) and budget > 0:
            r = order[i]
            if r.dec:
                n, need = 1, int((r.phase + it) % bs == 0)
            else:
                n = min(r.ntok0 + r.gen - r.computed, budget)
                need = -(-(r.computed + n) // bs) - -(-r.computed // bs)
            while need > pool.free:
                v = order.pop()
                self.preempt(v)
                ex.preempted.append(v)
                if v is r:
                    return budget
            pool.take(need)
            if r.dec:
                ex.dec += 1
                ex.b += 1
                ex.k += r.ntok0 + r.base + it - 1
            else:
                self._chunk(ex, r, n)
            budget -= n
            i += 1
        return budget

    def admit(self, ex: Exact) -> None:
        """The waiting pass from where `ex` left it: in queue order while the budget and
        max_num_seqs last, each whose blocks fit (`_fits`), the first refused stopping it."""
        bs, pool, w, running = self.bs, self.pool, self.waiting, self.running
        left = ex.left
        while left > 0 and w and len(running) < self.max_seqs:
            r = w[0]
            pieces, h, off = self.lookup(r)
            if not self._fits(r, h, off, left, pool.free):
                break
            w.popleft()
            hit = h * bs
            n = min(r.ntok0 + r.gen - hit, left)
            if pieces:
                hold = pool.hold
                r.held = [hold(run, a, z, r) for run, a, z in pieces]
            k = -(-(hit + n) // bs) - h
            if k > 0:
                pool.take(k)
            if self.caching:
                r.glo = r.ghi = max(h, r.pb)
            self.orders += 1
            r.order = self.orders
            running[r.rid] = r
            r.computed = hit
            ex.admitted.append((r, hit))
            self._chunk(ex, r, n)
            if r.computed < r.ntok0 + r.gen:
                self.pf = r
            left -= n
        ex.left = left

    # ------------------------------------------------------------------ ends of steps
    def end_span(self, m: int) -> list[VReq]:
        """m pure-decode steps are over (their blocks taken: `take_span`): the requests that
        stop at the last one leave (in running order), returned."""
        self.it += m
        return self._finishers([])

    def take_span(self, m: int) -> None:
        """The blocks the next m pure-decode steps take."""
        self.pool.take(self.alloc(m))

    def end_exact(self, ex: Exact) -> list[VReq]:
        """The exactly planned step is over: the rows that completed their prefill sample their
        first token (and decode from now, or stop), the decoding requests at their end stop."""
        self.it += 1
        done: list[VReq] = []
        for r, _, _ in ex.rows:
            if r.dec or r.computed < r.ntok0 + r.gen or r.rid not in self.running:
                continue
            if r is self.pf:
                self.pf = None
            r.gen += 1
            if r.gen == r.target:
                done.append(r)
            else:
                self.start_decoding(r, self.it)
        return self._finishers(done)

    def _finishers(self, done: list[VReq]) -> list[VReq]:
        """The decoding requests whose last step was the one just ended, with `done`, leave in
        running order (the order vLLM frees them)."""
        heap, running, last = self.heap, self.running, self.it - 1
        while heap and heap[0] >> SHIFT <= last:
            key = heappop(heap)
            r = running.get(key & 0xFFFF_FFFF)
            if r is not None and r.dec and r.fin == key >> SHIFT:
                done.append(r)
        if len(done) > 1:
            done.sort(key=_order)
        for r in done:
            self.leave(r, self.it)
        return done


def _order(r: VReq) -> int:
    return r.order
