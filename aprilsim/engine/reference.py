"""The per-iteration reference engine: the obviously-correct oracle for `FastEngine`.

Each iteration's plan is its family's (`Rules.plan_step`: which requests are prefilled, which
are preempted, or a decode); the engine prices and runs it, one decode iteration per event,
summing iteration times one by one, and recounts the KV cache from the requests at every use. A
prefill emits each request's next token (SGLang); a running request holds input_len + gen - 1 KV
tokens, a request being prefilled input_len + gen. It is slow on purpose; tests and benchmarks
check that the fast engine, asking the same rules, reproduces its completion times and token
counts. With chunked prefill (`Rules.per_pass`) each forward pass is its own step, planned by
the family (`Rules.select_pass`): the request a pass left unfinished (`partial`) continues first,
holding the KV of the tokens computed so far.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from aprilsim.engine.cost import EngineSpec
from aprilsim.engine.families.protocol import Rules, Step
from aprilsim.engine.parts import (
    DECODE,
    IDLE,
    PREFILL,
    CacheLookup,
    Chunked,
    EngineFace,
    EngineStats,
    PrefixCache,
    admit_pieces,
    note_started,
    prefill_pieces,
)
from aprilsim.engine.request import Completion, Request, check_requests
from aprilsim.engine.speculative import SpeculativeHooks, engine_cost, speculative_hooks
from aprilsim.engine.waiting import enqueue

INF = math.inf


class ReferenceEngine(EngineFace):
    """Same public API as FastEngine; one event per decode iteration. `rules`: the family's for
    this engine (default: `spec.family.rules(spec)`)."""

    def __init__(self, spec: EngineSpec, name: int = 0, rules: Rules | None = None) -> None:
        self.spec = spec
        self.rules = rules if rules is not None else spec.family.rules(spec)
        self.cost = engine_cost(spec)  # speculative decoding: one token per request per step
        self.speculative: SpeculativeHooks | None = speculative_hooks(spec, self.cost)
        self.name = name
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in admission order
        self.batch: list[Request] = []
        self.batch_tokens = 0  # tokens the prefill batch computes (shared prefixes it brings too)
        self.batch_pieces: tuple[list[int], list[int]] = ([], [])  # per request (`prefill_pieces`)
        self.batch_hits = 0  # requests of the batch prefilled onto a prefix already held
        self.t = 0.0
        self.hold = False  # admission held until a running request leaves
        self.hold_in = False  # `hold` when the current plan was made (`_unplan` restores it)
        self.phase = IDLE
        self.t_event = INF
        self.busy_time = 0.0
        self.tokens = 0
        self.kv_peak = 0
        self.stats = EngineStats()  # the counters, compared with FastEngine's by tests
        self.started: list[Request] = []  # first schedulings (`parts.note_started`)
        # chunked prefill (`Rules.per_pass`): the pass's requests as `Chunked`, the tokens each
        # computes in it, what its last one still computes after it, and the request the last
        # pass left unfinished
        self.batch_recs: list[Chunked] = []
        self.batch_chunks: list[int] = []
        self.batch_left = 0
        self.partial: Chunked | None = None
        self.cache = PrefixCache(self.rules.cache_block) if spec.retains_prefixes else None
        self.batch_got: CacheLookup | None = None  # what the batch takes from the cache
        if self.rules.mixed_steps:  # prefill and decode share a step: the family runs its calls
            self.cache = None
        self.mixed: Any = self.rules.stepper(self, False) if self.rules.mixed_steps else None

    @property
    def kv(self) -> int:
        """KV tokens held, recounted: the running requests' own, each shared prefix once, and a
        prefill batch's input; a chunked pass's requests hold what they took uncomputed and the
        tokens computed so far, this pass's included (a prefix one of them brings among them)."""
        recs = self._prefilling_recs()
        brought = {c.req.prefix for c in recs if c.brought}
        held = [*self.running, *(c.req for c in recs)] if recs else [*self.running, *self.batch]
        prefixes = {r.prefix: r.shared for r in held if r.shared and r.prefix not in brought}
        own = sum(r.input_len + r.gen - 1 for r in self.running) + sum(prefixes.values())
        if not recs:
            return own + sum(r.input_len + r.gen for r in self.batch)
        chunks = self.batch_chunks if self.batch else [0]
        return own + sum(c.kv + n for c, n in zip(recs, chunks))

    def _prefilling_recs(self) -> list[Chunked]:
        """The chunked pass in progress, or the request the last one left unfinished."""
        if self.batch_recs:
            return self.batch_recs
        return [self.partial] if self.partial is not None else []

    @property
    def reserve(self) -> int:
        """Remaining max_new of the running requests as admission counts it (clipped)."""
        return sum(self.rules.reserve_of(r.max_new - r.gen) for r in [*self.running, *self.batch])

    @property
    def it(self) -> int:
        """Decode iterations done (the clock of the family's per-step state)."""
        return self.stats.iterations

    def prefilling(self) -> list[Request]:
        """The requests of the prefill batch in progress (or a chunked prefill's unfinished)."""
        if not self.batch and self.partial is not None:
            return [self.partial.req]
        return self.batch

    def progress_at(self, now: float) -> tuple[int, float, int]:
        """(tokens, busy seconds, KV tokens) as of `now` (iterations are counted when they end)."""
        if self.mixed is not None:
            return self.mixed.progress_at(now)
        busy = self.busy_time
        if self.phase != IDLE and now > self.t:
            busy += min(now, self.t_event) - self.t
        return self.tokens, busy, self.kv

    def iterations_at(self, now: float) -> int:
        """Decode iterations done as of `now` (each is counted when it ends)."""
        return self.stats.iterations

    def spec_at(self, now: float) -> float:
        """Speculative decoding's decode seconds less their plain cost as of `now` (each
        iteration is counted when it ends)."""
        return self.stats.spec_s

    def submit(self, reqs: list[Request], now: float) -> None:
        if self.mixed is not None:
            self.mixed.submit(reqs, now)
            return
        check_requests(reqs, self.spec.kv_capacity)
        if self.speculative is not None:
            self.speculative.submitted(reqs)
        enqueue(self.waiting, reqs)
        if self.phase == IDLE:
            self.t = max(self.t, now)
            self._plan()
        elif self.t >= now:
            self._unplan()
            self._plan()
        # otherwise: considered at the end of the current iteration or prefill, which is >= now

    def advance(self) -> list[Completion]:
        """Carry out the step due at `t_event` (a prefill batch, or one decode iteration), then
        plan the next; return the requests that finished."""
        if self.mixed is not None:
            return self.mixed.advance()
        if self.phase == PREFILL:
            done = self._end_pass() if self.batch_recs else self._end_prefill()
        elif self.phase == DECODE:
            done = self._end_decode()
        else:
            done = []
        if self.speculative is not None and done:
            self.speculative.finished(done)
        self.phase = IDLE
        self._plan()
        return done

    def _end_prefill(self) -> list[Completion]:
        """The prefill batch ends: each request gets its next token and runs, or finishes."""
        done: list[Completion] = []
        dur = self.t_event - self.t
        self.busy_time += dur
        st = self.stats
        st.prefill_tokens += self.batch_tokens
        st.prefill_s += dur
        st.migrated_tokens += sum(r.migrated for r in self.batch)
        st.prefix_hits += self.batch_hits
        st.prefill_passes += 1
        self.t = self.t_event
        if self.cache is not None:
            self.cache.commit(self.batch_got, st)  # type: ignore[arg-type]
            self.cache.fit(self.spec.kv_capacity - self.kv, st)
        left = []
        for r in self.batch:
            self._first_token(r, done, left)
        self.batch = []
        self._count_freed_prefixes(left)
        return done

    def _first_token(self, r: Request, done: list[Completion], left: list[Request]) -> None:
        """A prefilled request's first token: it finishes there (its end lifts the admission
        hold) or joins the running batch."""
        r.gen += 1
        self.tokens += 1
        if r.gen == r.target_new:
            reason = "length" if r.gen == r.max_new else "stop"
            done.append(Completion(r.rid, r.gen, reason, self.t))
            self.hold = False
            left.append(r)
        else:
            self.running.append(r)

    def _end_pass(self) -> list[Completion]:
        """A chunked prefill pass ends: its requests computed their pieces; those whose prefill
        it ended get their next token and run (or finish), the one it left unfinished waits
        for the next pass (admission is no longer held: SGLang's `batch_is_full` is lifted)."""
        done: list[Completion] = []
        dur = self.t_event - self.t
        self.busy_time += dur
        st = self.stats
        recs, chunks = self.batch_recs, self.batch_chunks
        cont = self.partial is not None
        st.prefill_tokens += sum(chunks)
        st.prefill_s += dur
        st.migrated_tokens += sum(c.req.migrated for c in recs[cont:])
        st.prefix_hits += self.batch_hits
        st.prefill_passes += 1
        st.chunked_requests += int(self.batch_left > 0 and len(recs) > cont)
        st.chunk_tail_passes += int(cont and len(recs) > 1)  # the continuing one ended
        self.t = self.t_event
        if self.cache is not None and self.batch_got is not None:
            self.cache.commit(self.batch_got, st)
            self.cache.fit(self.spec.kv_capacity - self.kv, st)
        for c, n in zip(recs, chunks):
            c.done += n
        self.partial = recs[-1] if self.batch_left else None
        left = []
        for c in recs[:len(recs) - (self.partial is not None)]:
            self._first_token(c.req, done, left)
        if self.partial is not None:
            self.hold = False
        self.batch, self.batch_recs, self.batch_chunks = [], [], []
        self._count_freed_prefixes(left)
        return done

    def _end_decode(self) -> list[Completion]:
        """One decode iteration ends: every running request gets a token; some finish."""
        done: list[Completion] = []
        self.busy_time += self.t_event - self.t
        if self.speculative is not None:  # what this step costs without speculative decoding
            self.stats.spec_s += self.t_event - self.t - self.speculative.plain.decode_time(
                len(self.running), self.kv)
        self.t = self.t_event
        self.stats.iterations += 1
        self.tokens += len(self.running)
        for r in self.running:
            r.gen += 1
        self.kv_peak = max(self.kv_peak, self.kv)
        if self.cache is not None:
            self.cache.fit(self.spec.kv_capacity - self.kv, self.stats)
        still, left = [], []
        for r in self.running:
            if r.gen == r.target_new:
                reason = "length" if r.gen == r.max_new else "stop"
                done.append(Completion(r.rid, r.gen, reason, self.t))
                self.hold = False
                left.append(r)
            else:
                still.append(r)
        self.running = still
        if len(done) > 1:  # the fast engine's order (its finish heap): by request id, so
            done.sort(key=lambda c: c.rid)  # schedulers hear simultaneous ends alike
        self._count_freed_prefixes(left)
        return done

    def abort_all(self, now: float) -> list[Completion]:
        if self.mixed is not None:
            return self.mixed.abort_all(now)
        out: list[Completion] = []
        while self.t_event <= now:
            out += self.advance()
        if self.phase != IDLE and now > self.t:
            self.busy_time += now - self.t
        self.t = max(self.t, now)
        if self.cache is not None:
            self.cache.leave(self.running, {r.prefix for r in self.running if r.shared})
        for r in [*self.running, *self.prefilling(), *self.waiting]:
            out.append(Completion(r.rid, r.gen, "abort", now))
        if self.speculative is not None:
            self.speculative.finished(out)
        self.running, self.batch = [], []
        self.batch_recs, self.batch_chunks, self.partial = [], [], None
        self.waiting.clear()
        self.hold = False
        self.rules.reset(self.it)
        self.phase, self.t_event = IDLE, INF
        return out

    def abort_after_steps(self, now: float, k: int) -> tuple[float, list[Completion]]:
        """Abort as a live engine does (see FastEngine.abort_after_steps), one step at a time."""
        if self.mixed is not None:
            return self.mixed.abort_after_steps(now, k)
        out: list[Completion] = []
        while self.t_event <= now:
            out += self.advance()
        if self.phase == IDLE or self.t > now:
            return now, out + self.abort_all(now)
        n_due = len(out)
        self.stats.abort_steps_run += 1
        out += self.advance()  # the step in flight (a chunked prefill's: one pass)
        self._unplan()
        queued, self.waiting = self.waiting, deque()
        if self.partial is not None:  # SGLang launches no further chunk: it leaves with these
            queued.appendleft(self._drop_partial())
        for _ in range(k):
            if not self.running:
                break
            self._plan()
            out += self.advance()
            self._unplan()
            self.stats.abort_steps_run += 1
        self.waiting.extend(queued)
        self.stats.abort_finishes += len(out) - n_due
        return self.t, out + self.abort_all(self.t)

    def pause(self, now: float, until: float) -> list[Completion]:
        if self.mixed is not None:
            return self.mixed.pause(now, until)
        out: list[Completion] = []
        while self.t_event <= now:
            out += self.advance()
        if self.phase != IDLE and now > self.t:
            self.busy_time += now - self.t  # the interrupted iteration or prefill: busy, lost
        if self.phase == PREFILL:
            self._unplan()  # the pass (or batch) in flight is redone
        self.phase = IDLE
        self.t = max(self.t, until)
        self._plan()
        return out

    # ---------------------------------------------------------------- internals
    def _count_freed_prefixes(self, left: list[Request], keep: bool = True) -> None:
        """Requests left the engine (finished or retracted): count the shared prefixes that no
        running or prefilling request holds any more. `keep`: the retained cache keeps their
        runs and the prompts freed (not a chunked prefill's unfinished request's)."""
        gone = {r.prefix for r in left if r.shared}
        if gone:
            held = {r.prefix for r in [*self.running, *self.prefilling()] if r.shared}
            gone -= held
            self.stats.prefix_drops += len(gone)
        if self.cache is not None and left and keep:
            self.cache.leave(left, gone)

    def _drop_partial(self) -> Request:
        """The request a chunked pass left unfinished leaves (an abort): its KV is freed."""
        c = self.partial
        assert c is not None
        self.partial = None
        self.stats.abort_chunked += 1
        self._count_freed_prefixes([c.req], keep=False)
        return c.req

    def _plan(self) -> None:
        """Ask the family for the next iteration (`Rules.plan_step`) and start it."""
        self.hold_in = self.hold
        step = self.rules.plan_step(self)
        self.hold = step.hold
        if step.kind == PREFILL and self.rules.per_pass:
            self._start_pass(step)
        elif step.kind == PREFILL:
            self._start_prefill(step)
        elif step.kind == DECODE:
            self._start_decode(step)
        elif step.kind == IDLE:
            self.phase, self.t_event = IDLE, INF
        else:
            raise NotImplementedError(f"the {self.rules.family} family planned a step of kind "
                                      f"{step.kind}: this engine runs prefill and decode steps")

    def _start_prefill(self, step: Step) -> None:
        """A prefill batch starts (one forward pass)."""
        kv = self.kv  # held before it
        self.batch = step.batch
        note_started(self.batch, self.t, self.started)
        resident = {r.prefix for r in self.running if r.shared}
        # recounted: the oracle trusts no shortcut
        if self.cache is not None:
            got = self.batch_got = self.cache.lookup(self.batch, resident)
            lens, cached = self.batch_pieces = got.lens, got.cached
        else:
            lens, cached = self.batch_pieces = prefill_pieces(self.batch, resident)
        tokens = self.batch_tokens = sum(lens)
        self.batch_hits = 0
        for r in self.batch:  # admitted onto a prefix already held (or brought just before)
            if r.shared:
                self.batch_hits += r.prefix in resident
                resident.add(r.prefix)
        saved = self.batch_got.saved if self.cache is not None else 0  # type: ignore[union-attr]
        moved = sum(r.migrated for r in self.batch)  # migrated KV: held, never with a cache
        self.kv_peak = max(self.kv_peak, kv + tokens + saved + moved)  # cached tokens are live KV
        self.phase = PREFILL
        sq = sum((s + n) * (s + n) - s * s for n, s in zip(lens, cached))
        self.t_event = self.t + self.cost.prefill_time(tokens, sq, requests=len(lens))

    def _start_pass(self, step: Step) -> None:
        """A chunked prefill pass starts: the unfinished request's next piece first, then the
        requests it admits (each as `parts.admit_pieces` says; the family's pieces checked
        against them), priced as one pass (one p0, the attention of each piece over what its
        request computed before)."""
        reqs, chunks = step.batch, step.chunks
        cont = self.partial is not None
        new = reqs[cont:]
        resident = {r.prefix for r in self.running if r.shared}
        if self.partial is not None and self.partial.req.shared:
            resident.add(self.partial.req.prefix)
        if self.cache is not None:
            self.batch_got = self.cache.lookup(new, resident)
        recs = admit_pieces(new, resident, self.batch_got if self.cache is not None else None)
        if self.partial is not None:
            assert reqs[0] is self.partial.req
            recs.insert(0, self.partial)
        for c, n in zip(recs, chunks):  # the oracle trusts no shortcut
            assert 0 < n <= c.walk - c.done or n == c.walk - c.done == 0, (c, n)
        assert step.left == recs[-1].walk - recs[-1].done - chunks[-1]
        assert all(c.walk - c.done == n for c, n in zip(recs[:-1], chunks[:-1]))
        self.batch, self.batch_recs, self.batch_chunks, self.batch_left = reqs, recs, chunks, \
            step.left
        note_started(new, self.t, self.started)
        self.batch_hits = 0
        for r in new:  # admitted onto a prefix already held (or brought just before)
            if r.shared:
                self.batch_hits += r.prefix in resident
                resident.add(r.prefix)
        self.kv_peak = max(self.kv_peak, self.kv)
        self.phase = PREFILL
        sq = sum(c.cost_terms(n) for c, n in zip(recs, chunks))
        self.t_event = self.t + self.cost.prefill_time(sum(chunks), sq, requests=len(new))

    def _start_decode(self, step: Step) -> None:
        """One decode iteration of the running batch starts, after the step's victims left."""
        victims = step.victims
        for victim in victims:
            victim.retractions += 1
            victim.migrated = 0  # its migrated KV goes too: re-admission recomputes it
            self.stats.retractions += 1
        if victims:
            self._count_freed_prefixes(victims)
            self.hold_in = self.hold  # the retraction is not undone by `_unplan`
        if self.speculative is not None:  # the batch's mean acceptance, this step
            self.speculative.set_batch(self.running)
        self.phase = DECODE
        self.t_event = self.t + self.cost.decode_time(len(self.running), self.kv)

    def _unplan(self) -> None:
        if self.phase == PREFILL:
            cont = self.partial is not None and bool(self.batch_recs)
            self.waiting.extendleft(reversed(self.batch[cont:]))
            self.batch, self.batch_recs, self.batch_chunks = [], [], []
        self.hold = self.hold_in
        self.phase, self.t_event = IDLE, INF
