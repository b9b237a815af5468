"""The fast simulated engine: continuous batching that jumps from event to event.

Between two events the batch B is fixed and the KV cache grows by B tokens per iteration, so n
decode iterations take n*(f(B) + g(B)*K0) + g(B)*B*n*(n-1)/2 (`aprilsim.engine.cost`): closed form
and invertible, for the three-coefficient and the tabulated cost model alike. Events are
a prefill batch ending, the first running request finishing (a heap keyed by the iteration at which
it ends), the KV cache filling up (retraction), and outside calls (submit, abort, pause). Each costs
O(log n); there is no loop over tokens or iterations.

Rules: the engine's family decides (`aprilsim.engine.families`; the reference engine asks the
same `Rules` object). At each boundary a prefill batch runs first if the family admits the head of
the queue; else the running batch decodes, after retracting requests in the family's order if the
next iteration would overflow the KV cache; the family then says whether admission waits until a
request finishes, and how long a decode span stays a fixed batch (`Rules.stretch`: under SGLang's
decaying ratio, up to the first boundary at which the head may be admitted). As in SGLang, the
prefill forward pass emits a request's next token (a request with one token left finishes at the
end of its prefill); a running request holds input_len + gen - 1 KV tokens
(`families.sglang`). Families whose prefill and decode share a step (`Rules.mixed_steps`) are
not run here yet.

Chunked prefill (`EngineSpec.chunked_prefill_size`, SGLang without mixed chunks; the family's
`Rules.per_pass`): each forward pass is an event, planned by the family (`Rules.select_pass`,
SGLang's `PrefillAdder` with a chunk budget): the request a pass left unfinished (`partial`, SGLang's
chunked request) continues first, then queued requests while the pass's budgets last; a request
whose prefill a pass ends emits its token and runs. No decode runs while a request is unfinished.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Any, Final

from aprilsim.engine.clipped_reserve import ClippedReserve
from aprilsim.engine.cost import EngineSpec, LinearInK
from aprilsim.engine.families.protocol import PassInputs, Rules
from aprilsim.engine.key_heap import VecKeyHeap, new_key_heap
from aprilsim.engine.parts import (
    DECODE,
    IDLE,
    PREFILL,
    Chunked,
    EngineFace,
    EngineStats,
    PrefillBatch,
    PrefixCache,
    PrefixRefs,
    admit_pieces,
    note_started,
)
from aprilsim.engine.request import RID_BITS, RID_MASK, Completion, Request, check_requests
from aprilsim.engine.retraction import RetractionIndex
from aprilsim.engine.speculative import SpeculativeHooks, engine_cost, speculative_hooks
from aprilsim.engine.waiting import enqueue
from aprilsim.native import mypyc_attr

# Final: C statics in the compiled build, where a module global is a dict lookup at each use
INF: Final = math.inf


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassed: tests, engine_factory
class FastEngine(EngineFace):
    """One simulated engine server. Every public method leaves `t_event` (next event) valid.

    State: the queue, the running requests (and a heap of their finish iterations), the decode
    counter `it`, KV held and the unclipped reserve; the family's `rules` (`spec.family`'s, or
    those given: they keep the family's own state, e.g. SGLang's new-token ratio); the features
    each keep their own component: `pf` (the prefill batch or pass), `partial` (the request a
    chunked prefill pass left unfinished), `clipped`
    (the clipped reserve), `retraction` (victims in the family's order and what a retraction
    reads), `speculative` (speculative decoding's hooks), `prefixes` (shared prefixes), `cache`
    (the retained prefix cache), `stats` (counters). `tests/test_engine_components.py` holds the
    attribute count.
    """

    def __init__(self, spec: EngineSpec, name: int = 0, rules: Rules | None = None) -> None:
        self.spec = spec
        rules = self.rules = rules if rules is not None else spec.family.rules(spec)
        cost = engine_cost(spec)  # speculative decoding: a per-engine SpeculativeCost
        self.cost: LinearInK = cost
        self.speculative: SpeculativeHooks | None = speculative_hooks(spec, cost)  # None: off
        self.kv_capacity = spec.kv_capacity
        self.max_running = spec.max_running
        self.name = name
        self.waiting: deque[Request] = deque()
        self.running: dict[int, Request] = {}  # never rebound (the components share it)
        # its pop, bound once: compiled, calling a bound method skips the method lookup of a
        # `running.pop(rid)` at each finish (a deepcopy of an engine would keep the original's
        # pop: none is made)
        self._pop_running: Callable[[int], Request] = self.running.pop
        # the heaps hold `request.heap_key`s: one int per entry, ordered as the pair it packs
        # (`key_heap`: unboxed and sifted natively in the compiled build, heapq in pure Python)
        self._finish: VecKeyHeap = new_key_heap()  # (iteration at which it ends, rid)
        self.retraction = RetractionIndex(rules)
        self.it = 0  # decode iterations done (global counter)
        self.t = 0.0  # time of the current boundary
        self.kv = 0  # KV tokens held by running + prefilling requests
        self.reserve = 0  # sum of (max_new - gen) over them, unclipped
        self.hold = False  # admission blocked after a retraction until a request finishes
        self.phase = IDLE
        self.n = 0  # planned decode iterations
        self.t_event = INF
        self.busy_time = 0.0
        self.tokens = 0
        self.kv_peak = 0
        self.stats = EngineStats()
        self.pf = PrefillBatch()
        self.partial: Chunked | None = None
        self.clipped = ClippedReserve(rules.clip, self.running) if rules.clip else None
        self.share = spec.shares_prefixes
        self.prefixes = PrefixRefs()
        self.cache = PrefixCache(rules.cache_block) if spec.retains_prefixes else None
        if rules.mixed_steps:  # prefill and decode share a step: the family runs the calls
            self.cache = None
        self.mixed: Any = rules.stepper(self, True) if rules.mixed_steps else None

    # ---------------------------------------------------------------- public API
    def prefilling(self) -> list[Request]:
        """The requests of the prefill batch in progress (or a chunked prefill's unfinished)."""
        if not self.pf.reqs and self.partial is not None:
            return [self.partial.req]
        return self.pf.reqs

    def progress_at(self, now: float) -> tuple[int, float, int]:
        """(tokens, busy seconds, KV tokens) as of `now`, inside a decode span included."""
        if self.mixed is not None:
            return self.mixed.progress_at(now)
        tokens, busy, kv = self.tokens, self.busy_time, self.kv
        if self.phase != IDLE and now > self.t:
            busy += min(now, self.t_event) - self.t
            if self.phase == DECODE:
                m = self._iterations_within(now - self.t)
                tokens += m * len(self.running)
                kv += m * len(self.running)
        return tokens, busy, kv

    def iterations_at(self, now: float) -> int:
        """Decode iterations done as of `now`, those of a span in progress that have ended included."""
        if self.mixed is not None:
            return self.mixed.iterations_at(now)
        if self.phase == DECODE and now > self.t:
            return self.stats.iterations + self._iterations_within(now - self.t)
        return self.stats.iterations

    @property
    def started(self) -> list[Request]:
        """Each sample's first request once scheduled, for the driver to record and clear
        (`parts.note_started`; kept by the prefill batch component)."""
        return self.pf.started

    def spec_at(self, now: float) -> float:
        """Speculative decoding's decode seconds less their plain cost as of `now`: a span in
        progress counts the iterations that have ended by then, as `progress_at` counts their
        tokens (`stats.spec_s` adds a span's at its end)."""
        spec = self.stats.spec_s
        hooks = self.speculative
        if hooks is not None and self.phase == DECODE and now > self.t:
            m = self._iterations_within(now - self.t)
            if m > 0:
                spec += hooks.saving(m, len(self.running), self.kv)
        return spec

    def submit(self, reqs: list[Request], now: float) -> None:
        """Queue requests arriving at `now`; they are considered at the first boundary >= now."""
        if self.mixed is not None:
            self.mixed.submit(reqs, now)
            return
        check_requests(reqs, self.kv_capacity)
        if self.speculative is not None:
            self.speculative.submitted(reqs)
        enqueue(self.waiting, reqs)
        if self.phase == IDLE:
            self.t = max(self.t, now)
            self._plan()
        elif self.t >= now:  # the plan has not started (now, or after a pause): re-plan
            self._unplan()
            self._plan()
        elif self.phase == DECODE and not self.hold:
            self._cut_decode_for_admission(now)

    def advance(self) -> list[Completion]:
        """Carry out the event due at `t_event`; return the requests that finished there."""
        if self.mixed is not None:
            return self.mixed.advance()
        phase = self.phase
        if phase == DECODE:  # a decode span ends (inline: the hot path)
            m, b = self.n, len(self.running)
            self.busy_time += self.t_event - self.t
            self.t = self.t_event
            self.it += m
            self.stats.iterations += m
            if self.clipped is not None:
                self.clipped.it += m  # ClippedReserve.advance(m)
            if self.speculative is not None:
                self.stats.spec_s += self.speculative.saving(m, b, self.kv)
            mb = m * b
            self.kv += mb
            self.reserve -= mb
            self.tokens += mb
            if self.kv > self.kv_peak:
                self.kv_peak = self.kv
            if self.cache is not None:
                self.cache.fit(self.kv_capacity - self.kv, self.stats)
            done = self._pop_finished()
        elif phase == PREFILL:
            done = self._end_prefill()
        else:
            done = []
        if self.speculative is not None and done:
            self.speculative.finished(done)
        self.phase = IDLE
        self._plan()
        return done

    def abort_all(self, now: float) -> list[Completion]:
        """Stop everything: events due by `now` complete as usual, the rest returns partial."""
        if self.mixed is not None:
            return self.mixed.abort_all(now)
        out: list[Completion] = []
        while self.t_event <= now:
            out += self.advance()
        if self.phase == DECODE:
            self._apply_decode(self._iterations_within(now - self.t))
        if self.phase != IDLE and now > self.t:
            self.busy_time += now - self.t
        self.t = max(self.t, now)
        for r in self.running.values():
            r.gen = r.base + self.it
        if self.cache is not None:  # what ran stays cached; the batch in flight computed nothing
            self.cache.leave(self.running.values(),
                             {r.prefix for r in self.running.values() if r.shared})
        for r in [*self.running.values(), *self.prefilling(), *self.waiting]:
            out.append(Completion(r.rid, r.gen, "abort", now))
        if self.speculative is not None:
            self.speculative.finished(out)  # the aborted leave; those finished were counted
        self._empty()
        return out

    def abort_after_steps(self, now: float, k: int) -> tuple[float, list[Completion]]:
        """Abort as a live engine does: the step in flight at `now` (one starting at `now`
        included) completes, queued requests leave, the running ones decode `k` more steps, and
        the rest returns partial then. Returns the time the abort lands and the completions.
        With chunked prefill the step in flight is a pass; a request it leaves unfinished leaves
        with the queued ones (SGLang launches no further chunk,
        `scheduler.process_pending_chunked_abort`)."""
        if self.mixed is not None:
            return self.mixed.abort_after_steps(now, k)
        out: list[Completion] = []
        while self.t_event <= now:
            out += self.advance()
        if self.phase == IDLE or self.t > now:  # nothing in flight (idle, or held until later)
            return now, out + self.abort_all(now)
        n_due = len(out)
        stats = self.stats
        stats.abort_steps_run += 1
        if self.phase == PREFILL:
            out += self.advance()  # the batch, or the pass, in flight
        else:
            m = self._iterations_within(now - self.t) + 1
            out += self._decode_one_of(m)
        self._unplan()
        queued, self.waiting = self.waiting, deque()
        if self.partial is not None:
            queued.appendleft(self._drop_partial())
        for _ in range(k):
            if not self.running:
                break
            self._plan()
            out += self._decode_one_of(1)
            self._unplan()
            stats.abort_steps_run += 1
        self.waiting.extend(queued)
        stats.abort_finishes += len(out) - n_due
        return self.t, out + self.abort_all(self.t)

    def pause(self, now: float, until: float) -> list[Completion]:
        """Stop generating from `now` to `until` (weight update); the iteration in progress is redone."""
        if self.mixed is not None:
            return self.mixed.pause(now, until)
        out: list[Completion] = []
        while self.t_event <= now:
            out += self.advance()
        if self.phase == DECODE:
            self._apply_decode(self._iterations_within(now - self.t))
        if self.phase != IDLE and now > self.t:
            self.busy_time += now - self.t  # the interrupted iteration or prefill: busy, lost
        if self.phase == PREFILL:
            self._unplan()  # the batch (a chunked prefill's pass) is redone
        self.phase = IDLE
        self.t = max(self.t, until)
        self._plan()
        return out

    # ---------------------------------------------------------------- events
    def _end_prefill(self) -> list[Completion]:
        """The prefill batch ends: each request gets its next token and runs (or finishes, when
        that was its last)."""
        pf, done = self.pf, []
        cache = self.cache
        if cache is not None:
            cache.commit(pf.got, self.stats)  # type: ignore[arg-type]
            cache.fit(self.kv_capacity - self.kv, self.stats)
            left = []
        self.stats.count_batch(pf, self.partial is not None)
        self.busy_time += pf.time
        self.t = t = self.t + pf.time
        ended = self._end_pieces() if pf.recs else pf.reqs  # those whose prefill it ends
        running, finish, it = self.running, self._finish, self.it
        clipped, index = self.clipped, self.retraction
        victims, sign = index.victims, index.sign
        base_sum = max_new_sum = 0
        self.tokens += len(ended)  # the prefill emits each request's next token
        self.reserve -= len(ended)
        for r in ended:
            gen = r.gen = r.gen + 1
            if gen == r.target_new:  # done at its prefill: its last token has no KV entry
                self.kv -= r.input_len + gen - 1
                if r.shared:
                    self._release(r)
                if cache is not None:
                    left.append(r)
                self.reserve -= r.max_new - gen
                self.hold = False
                done.append(Completion(r.rid, gen, "length" if gen == r.max_new else "stop", t))
                continue
            r.base = base = gen - it  # running: gen == base + it from now on
            running[r.rid] = r
            base_sum += base
            max_new_sum += r.max_new
            if clipped is not None:
                clipped.add(r, r.max_new - gen)
            finish.push(((r.target_new - base) << RID_BITS) | r.rid)
            if victims is not None:  # index.key(r), inline
                victims.push(((sign * base) << RID_BITS) | (RID_MASK - r.rid))
        index.base_sum += base_sum
        index.max_new_sum += max_new_sum
        if victims is not None and len(victims) > 2 * len(running) + 64:
            index.build(running)  # more stale entries than live ones
        pf.clear()
        if cache is not None and left:
            self._cache_leave(left)
        return done

    def _end_pieces(self) -> list[Request]:
        """A chunked prefill pass ends: each request computed its piece; the requests whose
        prefill it ended, the last one kept as `partial` when it left it unfinished (then
        admission is no longer held: SGLang lifts `batch_is_full` at the next step)."""
        pf = self.pf
        for c, n in zip(pf.recs, pf.chunks):
            c.done += n
        if not pf.left:
            self.partial = None
            return pf.reqs
        self.partial = pf.recs[-1]
        self.hold = False
        return pf.reqs[:-1]

    def _pop_finished(self) -> list[Completion]:
        """Remove the requests whose finish iteration has come (the heap holds exactly the
        running requests: no stale entries to skip)."""
        heap, it = self._finish, self.it
        limit = (it + 1) << RID_BITS  # entries below it end by iteration `it`
        if not heap.below(limit):
            return []
        index = self.retraction
        if index.stale:
            return self._pop_finished_checked()
        done = []
        pop_running, t, clipped = self._pop_running, self.t, self.clipped
        freed = base_sum = max_new_sum = reserve = 0
        cache = self.cache
        left = []
        while heap.below(limit):
            rid = heap.pop_min() & RID_MASK
            r = pop_running(rid)
            if clipped is not None:
                clipped.drop(r)
            gen = r.gen = r.target_new
            max_new = r.max_new
            freed += r.input_len + gen - 1
            base_sum += r.base
            max_new_sum += max_new
            if r.shared:
                self._release(r)
            if cache is not None:
                left.append(r)
            reserve += max_new - gen
            done.append(Completion(rid, gen, "length" if gen == max_new else "stop", t))
        self.kv -= freed
        index.base_sum -= base_sum
        index.max_new_sum -= max_new_sum
        self.reserve -= reserve
        self.hold = False
        if cache is not None:
            self._cache_leave(left)
        return done

    def _pop_finished_checked(self) -> list[Completion]:
        """`_pop_finished` while `_finish` holds entries of retracted requests: those are
        skipped (an entry is live when its request runs and ends at the entry's iteration)."""
        heap, it, running, cache = self._finish, self.it, self.running, self.cache
        t, get, clipped = self.t, self.running.get, self.clipped
        done, left = [], []
        freed = base_sum = max_new_sum = reserve = skipped = 0
        limit = (it + 1) << RID_BITS
        while heap.below(limit):
            key = heap.pop_min()
            end, rid = key >> RID_BITS, key & RID_MASK
            r = get(rid)
            if r is None or r.target_new - r.base != end:
                skipped += 1
                continue
            del running[rid]
            if clipped is not None:
                clipped.drop(r)
            gen = r.gen = r.target_new
            max_new = r.max_new
            freed += r.input_len + gen - 1
            base_sum += r.base
            max_new_sum += max_new
            reserve += max_new - gen
            if r.shared:
                self._release(r)
            if cache is not None:
                left.append(r)
            done.append(Completion(rid, gen, "length" if gen == max_new else "stop", t))
        self.kv -= freed
        index = self.retraction
        index.base_sum -= base_sum
        index.max_new_sum -= max_new_sum
        self.reserve -= reserve
        index.stale -= skipped
        index.drop_stale_head(heap, running)
        self.hold = False
        if cache is not None:
            self._cache_leave(left)
        return done

    def _empty(self) -> None:
        """After an abort: nothing queued, prefilling or running; every component reset."""
        self.running.clear()
        self.waiting.clear()
        self._finish.clear()
        self.retraction.clear()
        self.pf.clear()
        self.kv = self.reserve = 0
        self.prefixes.clear()
        if self.clipped is not None:
            self.clipped.clear(self.it)
        self.hold = False
        self.partial = None
        self.rules.reset(self.it)
        self.phase, self.n, self.t_event = IDLE, 0, INF

    def _drop_partial(self) -> Request:
        """The request a chunked pass left unfinished leaves (an abort): its KV is freed, its
        shared prefix with it when it was the last holder."""
        c = self.partial
        assert c is not None
        self.partial = None
        self.stats.abort_chunked += 1
        r = c.req
        self.kv -= c.kv  # what it took uncomputed and computed (a prefix it brought included)
        if r.shared and self.prefixes.unref(r.prefix):
            if not c.brought:
                self.kv -= r.shared
            self.stats.prefix_drops += 1
        return r

    def _decode_one_of(self, m: int) -> list[Completion]:
        """Run the first m iterations of the decode span planned (m <= its length) and stop at a
        boundary: the whole span through `advance` (its finishes included), else a part of it."""
        if m >= self.n:
            return self.advance()
        self._apply_decode(m)
        self.phase, self.n, self.t_event = IDLE, 0, INF
        return []

    def _apply_decode(self, m: int) -> None:
        """m iterations of the current decode plan pass (an outside call cut the span)."""
        if m <= 0:
            return
        b = len(self.running)
        dur = self.cost.decode_span(m, b, self.kv)
        if self.speculative is not None:
            self.stats.spec_s += dur - self.speculative.plain.decode_span(m, b, self.kv)
        self.t += dur
        self.busy_time += dur
        self.it += m
        self.stats.iterations += m
        if self.clipped is not None:
            self.clipped.advance(m)
        self.kv += m * b
        self.reserve -= m * b
        self.tokens += m * b
        if self.kv > self.kv_peak:
            self.kv_peak = self.kv
        if self.cache is not None:
            self.cache.fit(self.kv_capacity - self.kv, self.stats)

    def _cache_leave(self, left: list[Request]) -> None:
        """Requests left at one event: their runs (and the prompts freed with them) are kept."""
        cache = self.cache
        assert cache is not None
        cache.leave(left, cache.freed)
        cache.freed.clear()

    def _release(self, r: Request) -> None:
        """A request holding a shared prefix leaves: the prefix goes with the last holder."""
        if self.prefixes.unref(r.prefix):
            self.kv -= r.shared
            self.stats.prefix_drops += 1
            if self.cache is not None:
                self.cache.freed.append(r.prefix)

    def _retract_until_fits(self) -> None:
        """Evict running requests in the family's order until the next iteration fits, requeue
        them (`Rules.requeue`), then let the family re-estimate (SGLang's ratio) or hold
        admission until a request finishes (`Rules.retracted`). O(log n) per eviction: from the
        first retraction on, the engine keeps its victims in a heap (`RetractionIndex`), since a
        KV-bound engine with a long queue retracts about once per three requests."""
        running, cap, index = self.running, self.kv_capacity, self.retraction
        if index.victims is None:
            index.build(running)
        victims = []
        while running and self.kv + len(running) > cap:
            r = index.pop_victim(running)
            del running[r.rid]
            index.base_sum -= r.base
            index.max_new_sum -= r.max_new
            if self.clipped is not None:
                self.clipped.drop(r)
            r.gen = r.base + self.it
            self.kv -= r.input_len + r.gen - 1
            if r.shared:
                self._release(r)
            self.reserve -= r.max_new - r.gen
            r.migrated = 0  # its migrated KV is dropped with the rest: re-admission recomputes it
            r.retractions += 1
            self.stats.retractions += 1
            victims.append(r)
        if self.cache is not None:
            self._cache_leave(victims)
        rules, it = self.rules, self.it
        rules.requeue(self.waiting, victims)
        # held until a request finishes, or tried again (the batch shrank); not undone by an
        # unplan
        self.hold = self.pf.hold_in = rules.retracted(
            it, index.base_sum + it * len(running), index.max_new_sum, len(running))
        index.stale += len(victims)  # their `_finish` entries stay until popped
        index.drop_stale_head(self._finish, running)

    def _reserve_after(self, m: int) -> int:
        """The running requests' remaining max_new as admission counts it (clipped), after m
        more decode iterations."""
        if self.clipped is None:
            return self.reserve - m * len(self.running)
        return self.clipped.sum_after(m)

    # ---------------------------------------------------------------- planning
    def _plan(self) -> None:
        """At a boundary: start a prefill batch (`_plan_prefill`) if the queue head is admitted,
        else decode the running batch up to the next event (the first finish, the KV cache full,
        or, with a queue, where the family says the batch may change: `Rules.stretch`), else go
        idle. The decode plan is inline: the hot path."""
        self.pf.hold_in = self.hold  # restored by `_unplan` (the refusals of this plan)
        if self._prefill_planned():
            return
        running = self.running
        if not running:
            self.rules.reset(self.it)  # idle: SGLang resets its ratio
            self.phase, self.n, self.t_event = IDLE, 0, INF
            return
        cap = self.kv_capacity
        b = len(running)
        retracted = False
        if self.kv + b > cap:
            self._retract_until_fits()
            b = len(running)
            retracted = not self.hold
        if self.speculative is not None:  # the batch's acceptance, fixed until the next plan
            self.speculative.set_batch(running.values())
        n_fin = (self._finish.top() >> RID_BITS) - self.it
        n_kv = (cap - self.kv) // b
        n = n_fin if n_fin < n_kv else n_kv
        n = n if n > 1 else 1
        if retracted:
            n = 1  # nothing holds admission: re-plan after one step (retractions are rare)
        elif self.waiting and n > 1:
            cut = self.rules.stretch(1, n, b, self.kv, self.reserve, self.clipped, self.it,
                                     self.waiting[0], self.prefixes)
            if cut is not None:
                n = cut
                self.stats.ratio_cuts += 1
        self.n = n
        self.phase = DECODE
        self.t_event = self.t + self.cost.decode_span(n, b, self.kv)

    def _prefill_planned(self) -> bool:
        """`_plan`'s prefill: a batch (`_plan_prefill`) or a chunked prefill pass
        (`_plan_pass`) when admission is open (always after a pass that left a request
        unfinished); False when there is none to start."""
        if self.rules.per_pass:
            return (self.partial is not None or bool(self.waiting) and not self.hold) \
                and self._plan_pass()
        if not self.waiting or self.hold:
            return False
        if len(self.running) < self.max_running and self._plan_prefill():
            return True
        # the head refused with requests running: where the family says so (SGLang's
        # `batch_is_full`), no admission is tried until one of them leaves (finishes, is
        # retracted or aborted)
        self.hold = self.rules.refusal_holds and bool(self.running)
        return False

    def _plan_prefill(self) -> bool:
        """Start a prefill batch if the queue head is admitted now; False if it is not."""
        running, pf, rules = self.running, self.pf, self.rules
        clipped = self.clipped
        reserve = self.reserve if clipped is None else clipped.sum_after(0)
        refs = self.prefixes
        # the head refused, the usual answer while KV binds: asked first, so that no batch list
        # and no result tuple is built for it (select_batch asks the same first)
        if not rules.admits_head(self.waiting, len(running), self.kv, reserve, self.it, 0, refs):
            return False
        reqs, tokens, sq, added, moved, capped = rules.select_batch(
            self.waiting, len(running), self.kv, reserve, self.it, refs
        )
        pf.reqs = reqs
        if self.waiting and not capped and running and rules.refusal_holds:  # the head refused:
            self.hold = True  # set on an empty running batch, SGLang drops it when the prefill
            # batch replaces that batch (`get_next_batch_to_run`'s merge)
        note_started(pf.reqs, self.t, pf.started)
        comp = tokens  # the tokens it computes
        if self.share:
            if self.cache is not None:  # the retained cache may serve some (taken at its end)
                got = pf.got = self.cache.lookup(pf.reqs, refs)
                if got.saved or got.dropped:  # (dropped: partial blocks computed again)
                    pf.saved = got.saved
                    comp = tokens - got.saved
                    sq = sum((c + n) * (c + n) - c * c for n, c in zip(got.lens, got.cached))
            pf.hits = sum(refs.hold(r.prefix) for r in pf.reqs if r.shared)
        pf.tokens, pf.moved, pf.added = tokens, moved, added
        kv = self.kv = self.kv + tokens + moved
        self.reserve += added
        if kv > self.kv_peak:
            self.kv_peak = kv
        self.phase = PREFILL
        pf.time = dur = self.cost.prefill_time(comp, sq, 1, len(pf.reqs))
        self.t_event = self.t + dur
        return True

    def _plan_pass(self) -> bool:
        """Start a chunked prefill pass (`Rules.select_pass`): the unfinished request's next
        piece, then the queued requests it admits; False (admission held where the family says
        so) when there is nothing to prefill."""
        running, pf, rules, partial = self.running, self.pf, self.rules, self.partial
        if partial is None and len(running) >= self.max_running:
            self.hold = rules.refusal_holds  # full: SGLang's `batch_is_full`
            return False
        clipped = self.clipped
        reserve = self.reserve if clipped is None else clipped.sum_after(0)
        refs, cache = self.prefixes, self.cache
        step = rules.select_pass(PassInputs(self.waiting, partial, len(running), self.kv, reserve,
                                            self.it, refs, cache))
        self.hold = step.hold
        if not step.batch:
            return False
        cont = partial is not None
        new = step.batch[cont:]
        got = pf.got = cache.lookup(new, refs) if cache is not None else None
        recs = admit_pieces(new, refs, got)
        note_started(new, self.t, pf.started)
        saved = moved = 0
        for c in recs:  # KV it takes uncomputed: migrated, or served by the retained cache
            moved += c.req.migrated
            saved += c.held
        saved -= moved
        if partial is not None:
            recs.insert(0, partial)
        pf.reqs, pf.recs, pf.chunks, pf.left = step.batch, recs, step.chunks, step.left
        comp = 0
        sq = 0
        for c, n in zip(recs, step.chunks):
            comp += n
            sq += c.cost_terms(n)
        if self.share:
            pf.hits = sum(refs.hold(r.prefix) for r in new if r.shared)
        pf.tokens, pf.moved, pf.saved = comp + saved, moved, saved
        ended = step.batch[:-1] if step.left else step.batch
        pf.added = added = sum(r.max_new - r.gen for r in ended)
        kv = self.kv = self.kv + comp + saved + moved
        self.reserve += added
        if kv > self.kv_peak:
            self.kv_peak = kv
        self.phase = PREFILL
        pf.time = dur = self.cost.prefill_time(comp, sq, 1, len(new))
        self.t_event = self.t + dur
        return True

    def _unplan(self) -> None:
        """Undo a plan that has not progressed (it starts at the current boundary)."""
        if self.phase == PREFILL:
            pf = self.pf
            self.kv -= pf.tokens + pf.moved  # the prefixes this batch brought included
            new = pf.reqs[1:] if pf.recs and pf.recs[0] is self.partial else pf.reqs
            for r in new:
                if r.shared:
                    self.prefixes.unref(r.prefix)
            self.reserve -= pf.added
            self.waiting.extendleft(reversed(new))
            pf.clear()
        self.hold = self.pf.hold_in
        self.phase, self.n, self.t_event = IDLE, 0, INF

    def _iterations_within(self, dt: float) -> int:
        """Decode iterations of the current plan that end no later than dt after the boundary."""
        return self.cost.iterations_within(dt, len(self.running), self.kv, self.n)

    def _cut_decode_for_admission(self, now: float) -> None:
        """A newcomer is admitted at the first boundary >= now if the queue head fits there (or,
        where the family says the batch may change later, e.g. under SGLang's decaying ratio, at
        a later boundary: the span is cut before it)."""
        m = self._iterations_within(now - self.t)
        b = len(self.running)
        if self.t + self.cost.decode_span(m, b, self.kv) < now:
            m += 1  # the boundary at or after `now`
        if m >= self.n:
            return
        rules = self.rules
        if not rules.admits_head(self.waiting, b, self.kv + m * b, self._reserve_after(m),
                                 self.it + m, 0, self.prefixes):
            if rules.refusal_holds:
                # refused there: admission holds from that boundary until a request leaves
                # (SGLang's `batch_is_full`), so the span is cut there and `_plan` sets the hold
                self.stats.ratio_cuts += 1
            else:
                if m + 1 >= self.n:
                    return
                cut = rules.stretch(m + 1, self.n - 1, b, self.kv, self.reserve, self.clipped,
                                    self.it, self.waiting[0], self.prefixes)
                if cut is None:
                    return
                m = cut
                self.stats.ratio_cuts += 1
        self.n = m
        self.t_event = self.t + self.cost.decode_span(m, b, self.kv)
        if m == 0:
            self._unplan()
            self._plan()
