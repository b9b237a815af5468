"""The per-iteration reference engine: the obviously-correct oracle for `FastEngine`.

Each iteration's plan is its family's (`Rules.plan_step`: which requests are prefilled, which
are preempted, or a decode); the engine prices and runs it, one decode iteration per event,
summing iteration times one by one, and recounts the KV cache from the requests at every use. A
prefill emits each request's next token (SGLang); a running request holds input_len + gen - 1 KV
tokens, a request being prefilled input_len + gen. It is slow on purpose; tests and benchmarks
check that the fast engine, asking the same rules, reproduces its completion times and token
counts. With chunked prefill it prices a prefill batch pass by pass over its requests' pieces
(`cost.chunked_prefill_time`), where the fast engine uses the closed form.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from aprilsim.engine.cost import EngineSpec, chunked_prefill_time, pass_ends
from aprilsim.engine.families.protocol import Rules, Step
from aprilsim.engine.parts import (
    DECODE,
    IDLE,
    PREFILL,
    CacheLookup,
    EngineFace,
    EngineStats,
    PrefixCache,
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
        # chunked prefill: tokens free in the open last pass of a batch the token budget ended
        self.room = self.room_in = self.batch_room = 0
        self.batch_passes = 1  # forward passes the prefill batch in progress starts
        self.cache = PrefixCache(self.rules.cache_block) if spec.retains_prefixes else None
        self.batch_got: CacheLookup | None = None  # what the batch takes from the cache
        if self.rules.mixed_steps:  # prefill and decode share a step: the family runs its calls
            self.cache = None
        self.mixed: Any = self.rules.stepper(self, False) if self.rules.mixed_steps else None

    @property
    def kv(self) -> int:
        prefixes = {r.prefix: r.shared for r in [*self.running, *self.batch] if r.shared}
        return sum(r.input_len + r.gen - 1 for r in self.running) + sum(
            r.input_len + r.gen for r in self.batch
        ) + sum(prefixes.values())

    @property
    def reserve(self) -> int:
        """Remaining max_new of the running requests as admission counts it (clipped)."""
        return sum(self.rules.reserve_of(r.max_new - r.gen) for r in [*self.running, *self.batch])

    @property
    def it(self) -> int:
        """Decode iterations done (the clock of the family's per-step state)."""
        return self.stats.iterations

    def prefilling(self) -> list[Request]:
        """The requests of the prefill batch in progress."""
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
            done = self._end_prefill()
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
        st.prefill_passes += self.batch_passes
        st.joined_open_pass += int(self.room_in > 0)
        st.multi_pass_batches += int(self.batch_passes + (self.room_in > 0) > 1)
        self.t = self.t_event
        if self.cache is not None:
            self.cache.commit(self.batch_got, st)  # type: ignore[arg-type]
            self.cache.fit(self.spec.kv_capacity - self.kv, st)
        left = []
        for r in self.batch:
            r.gen += 1
            self.tokens += 1
            if r.gen == r.target_new:
                reason = "length" if r.gen == r.max_new else "stop"
                done.append(Completion(r.rid, r.gen, reason, self.t))
                self.hold = False
                left.append(r)
            else:
                self.running.append(r)
        self.batch = []
        self._count_freed_prefixes(left)
        self.room = self.batch_room
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
        for r in [*self.running, *self.batch, *self.waiting]:
            out.append(Completion(r.rid, r.gen, "abort", now))
        if self.speculative is not None:
            self.speculative.finished(out)
        self.running, self.batch = [], []
        self.waiting.clear()
        self.hold = False
        self.room = 0
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
        ends = [] if self.phase != PREFILL or not self.spec.prefill_chunk else pass_ends(
            self.cost, *self.batch_pieces[:1], self.spec.prefill_chunk, self.room_in,
            self.batch_pieces[1])
        cut = next((self.t + e for e in ends[:-1] if self.t + e > now), None)
        if cut is None:
            out += self.advance()  # the step in flight
        else:  # a chunked prefill pass that is not its batch's last: the batch's requests leave
            self.busy_time += cut - self.t
            self.t = cut
            self.stats.abort_pass_cuts += 1
        self._unplan()
        queued, self.waiting = self.waiting, deque()
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
            self._unplan()
        self.phase = IDLE
        self.room = 0
        self.t = max(self.t, until)
        self._plan()
        return out

    # ---------------------------------------------------------------- internals
    def _count_freed_prefixes(self, left: list[Request]) -> None:
        """Requests left the engine (finished or retracted): count the shared prefixes that no
        running or prefilling request holds any more."""
        gone = {r.prefix for r in left if r.shared}
        if gone:
            held = {r.prefix for r in [*self.running, *self.batch] if r.shared}
            gone -= held
            self.stats.prefix_drops += len(gone)
        if self.cache is not None and left:  # their runs and the prompts freed stay cached
            self.cache.leave(left, gone)

    def _plan(self) -> None:
        """Ask the family for the next iteration (`Rules.plan_step`) and start it."""
        self.room_in = self.room
        self.room = 0
        self.hold_in = self.hold
        step = self.rules.plan_step(self)
        self.hold = step.hold
        if step.kind == PREFILL:
            self._start_prefill(step)
        elif step.kind == DECODE:
            self._start_decode(step)
        elif step.kind == IDLE:
            self.phase, self.t_event = IDLE, INF
        else:
            raise NotImplementedError(f"the {self.rules.family} family planned a step of kind "
                                      f"{step.kind}: this engine runs prefill and decode steps")

    def _start_prefill(self, step: Step) -> None:
        """A prefill batch starts: priced pass by pass over its requests' pieces."""
        kv = self.kv  # held before it
        self.batch, capped = step.batch, step.capped
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
        dur, self.batch_passes, left = chunked_prefill_time(
            self.cost, lens, self.spec.prefill_chunk, self.room_in, cached
        )
        self.batch_room = left if capped else 0
        self.t_event = self.t + dur

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
            self.waiting.extendleft(reversed(self.batch))
            self.batch = []
        self.room = self.room_in
        self.hold = self.hold_in
        self.phase, self.t_event = IDLE, INF
