"""The fast engine under vLLM's rules: a stretch of identical pure-decode steps is one event,
priced in closed form (`decode_span`); every other step is one event, planned exactly.

The scheduler is `vllm_core.Core` (vLLM's rules, `VllmSteps`' steps, on a run-based block
pool); this stepper adds time: an event is a span of m decode steps or one exact step, and the
engine's calls meet them as `vllm_timing` says (a request submitted at `now` joins the first step
that starts at or after it: a span planned at `now` is planned again, an exact step planned at
`now` takes it in its waiting pass, a span under way is cut at the first boundary at or after
`now`; `pause` and an abort cut a span after its step in flight). The per-step reference
(`vllm_reference`, on `VllmSteps` itself) gives the same completions, times and counters
(tests/test_vllm_family.py).
"""

from __future__ import annotations

import math
from typing import Any

from aprilsim.engine.families.vllm_content import keys
from aprilsim.engine.families.vllm_core import Core, Exact, VReq
from aprilsim.engine.families.vllm_timing import check_blocks, finished, postpone, step_time
from aprilsim.engine.parts import DECODE, IDLE, PREFILL, note_started
from aprilsim.engine.request import Completion, Request

INF = math.inf
NO_LIMIT = 1 << 60
_SPAN, _EXACT = 1, 2


def content_keys(r: Request, block: int) -> tuple[int, int, int]:
    """A simulator request's prompt key, its prompt's full blocks of `block` tokens, and its
    sample's key (`vllm_content`): block i of a prompt holds the same tokens wherever it is."""
    p, n, s = keys(r)
    return p, n // block, s


class FastStepper:
    """A `FastEngine`'s calls under vLLM's rules (`Rules.stepper`)."""

    def __init__(self, engine: Any, rules: Any) -> None:
        self.e = engine
        self.rules = rules
        self.bs: int = rules.block_size
        self.core = core = Core(rules)
        self.cost = engine.cost
        engine.running, engine.waiting = core.running, core.waiting
        self.kind = IDLE  # the event in flight: none, a span of m decode steps, an exact step
        self.m = 0
        self.k0 = 0  # a span's decoding requests' context at its start
        self.ex: Exact | None = None
        self.n_admitted = 0  # of the exact step's admissions, those counted (`_admitted`)
        self.prefill_s = 0.0  # of the exact step in flight
        self.used0 = 0  # blocks in use when the event in flight started (before it took any)
        self.resume_at = 0.0  # no step starts before (a pause)
        self.keys_of = content_keys  # tests may key requests' tokens otherwise
        self.record: Any = None  # a trace replay's step recorder (`vllm_replay_engine`)

    # ------------------------------------------------------------------ the engine's calls
    def submit(self, reqs: list[Request], now: float) -> None:
        e, core = self.e, self.core
        check_blocks(reqs, self.rules)
        empty = not core.waiting
        for r in reqs:
            core.waiting.append(VReq(r, *self.keys_of(r, self.bs)))
        if self.kind == IDLE:
            e.t = max(e.t, now)
            self._plan()
        elif e.t >= now:  # the event planned at `now` has not started: they join its step
            if self.kind == _SPAN:
                self._plan()
            else:
                self._amend()
        elif self.kind == _SPAN and empty and len(core.running) < core.max_seqs \
                and core.budget > core.b:
            self._cut(now, False)  # the head may join at the first boundary >= now

    def advance(self) -> list[Completion]:
        done = self._end_event()
        self._plan()
        return done

    def abort_all(self, now: float) -> list[Completion]:
        e, core = self.e, self.core
        out: list[Completion] = []
        while e.t_event <= now:
            out += self.advance()
        scheduled = core.it
        if self.kind == _SPAN:  # its steps ended by now, and the one in flight scheduled
            j = self._ended(now)
            core.take_span(j + 1)
            self._kv_peak()
            self._count_span(j)
            core.it += j
            scheduled = core.it + 1
        elif self.kind == _EXACT:
            scheduled = core.it + 1
        if self.kind != IDLE and now > e.t:
            e.busy_time += now - e.t
        e.t = max(e.t, now)
        live = sorted([*core.running.values(), *core.waiting], key=_rid)
        for r in live:  # freed in request order
            if r.rid in core.running:
                core.leave(r, scheduled)
            r.req.gen = r.gen
            out.append(Completion(r.rid, r.gen, "abort", now))
        core.waiting.clear()
        core.heap.clear()
        self._idle()
        return out

    def abort_after_steps(self, now: float, k: int) -> tuple[float, list[Completion]]:
        e, core, st = self.e, self.core, self.e.stats
        out: list[Completion] = []
        while e.t_event <= now:
            out += self.advance()
        if self.kind == IDLE or e.t > now:
            return now, out + self.abort_all(now)
        n_due = len(out)
        st.abort_steps_run += 1
        if self.kind == _SPAN:
            self._cut(now, True)
        out += self._end_event()  # the step in flight completes
        queued = list(core.waiting)
        core.waiting.clear()  # they leave now; heard of when the abort lands
        for _ in range(k):
            if not core.running:
                break
            self._plan(1)
            out += self._end_event()
            st.abort_steps_run += 1
        st.abort_finishes += len(out) - n_due
        rest = self.abort_all(e.t)
        for r in queued:
            r.req.gen = r.gen
        return e.t, out + rest + [Completion(r.rid, r.gen, "abort", e.t) for r in queued]

    def pause(self, now: float, until: float) -> list[Completion]:
        e = self.e
        out: list[Completion] = []
        while e.t_event <= now:
            out += self.advance()
        self.resume_at = max(self.resume_at, until)
        if self.kind == IDLE:
            e.t = max(e.t, until)
        elif e.t > now:  # the event planned has not started: it starts when the pause ends
            postpone(e, until)
        elif self.kind == _SPAN:
            self._cut(now, True)  # its step in flight completes, then none before `until`
        return out

    def progress_at(self, now: float) -> tuple[int, float, int]:
        e = self.e
        tokens, busy, used = e.tokens, e.busy_time, self.used0
        if self.kind != IDLE and now > e.t:
            busy += min(now, e.t_event) - e.t
            if self.kind == _SPAN:
                j = self._ended(now)
                tokens += j * self.core.b
                used += self.core.alloc(j)
        return tokens, busy, used * self.bs

    def iterations_at(self, now: float) -> int:
        it = self.e.stats.iterations
        if self.kind == _SPAN and now > self.e.t:
            it += self._ended(now)
        return it

    def flush_prefix_cache(self) -> None:
        """vLLM's `reset_prefix_cache` at a weight update: only while no block is in use."""
        pool = self.core.pool
        had = pool.cached()
        if pool.reset() and had:
            self.e.stats.cache_flushes += 1

    # ------------------------------------------------------------------ events
    def _plan(self, limit: int = NO_LIMIT) -> None:
        """Plan the next event at the engine's time (not before a pause ends): a span of
        identical decode steps (at most `limit`), else one exact step; or go idle."""
        e, core = self.e, self.core
        if not core.running and not core.waiting:
            self._idle()
            return
        if e.t < self.resume_at:
            e.t = self.resume_at
        self.used0 = core.pool.used
        m = core.span(limit)
        if m:
            b = core.b
            self.kind, self.m = _SPAN, m
            self.k0 = k0 = core.sum_c0 + b * core.it
            e.phase = DECODE
            e.t_event = e.t + self.cost.decode_span(m, b, k0)
            return
        ex = self.ex = core.plan_exact()
        self.kind = _EXACT
        st = e.stats
        st.retractions += len(ex.preempted)
        self.n_admitted = 0
        self._admitted()
        self._price()

    def _amend(self) -> None:
        """Requests queued at the start of the exact step planned now join its waiting pass."""
        ex = self.ex
        assert ex is not None
        if ex.preempted:
            return
        self.core.admit(ex)
        self._admitted()
        self._price()

    def _admitted(self) -> None:
        ex, st, t = self.ex, self.e.stats, self.e.t
        assert ex is not None
        for r, hit in ex.admitted[self.n_admitted:]:
            st.cache_hits += hit > 0
            st.cache_hit_tokens += hit
            note_started([r.req], t, self.e.started)
        self.n_admitted = len(ex.admitted)

    def _price(self) -> None:
        e, ex = self.e, self.ex
        assert ex is not None
        dur, self.prefill_s = step_time(self.cost, (ex.b, ex.k), (ex.tokens, ex.sq, ex.prows))
        e.phase = PREFILL if ex.prows else DECODE
        e.t_event = e.t + dur
        self._kv_peak()

    def _end_event(self) -> list[Completion]:
        """The event in flight ends: a span's steps or the exact step; what finished leaves."""
        e, core = self.e, self.core
        kind = self.kind
        if kind == IDLE:
            return []
        e.busy_time += e.t_event - e.t
        e.t = e.t_event
        if kind == _SPAN:
            m = self.m
            rec = self.record
            if rec is not None:
                rec.span(self, m)
            core.take_span(m)
            self._kv_peak()
            self._count_span(m)
            done = core.end_span(m)
        else:
            ex = self.ex
            assert ex is not None
            st = e.stats
            st.iterations += ex.b > 0
            st.prefill_tokens += ex.tokens
            st.prefill_passes += ex.prows > 0
            st.prefill_s += self.prefill_s
            e.tokens += ex.dec + sum(1 for r, _, _ in ex.rows
                                     if r.computed == r.ntok0 + r.gen)
            done = core.end_exact(ex)
            if self.record is not None:
                self.record.exact(self, ex, done)
            self.ex = None
        self.kind = IDLE
        e.phase, e.t_event = IDLE, INF
        t = e.t
        out = []
        for r in done:
            r.req.gen = r.gen
            out.append(finished(r.req, t))
        if len(out) > 1:
            out.sort(key=_rid)
        return out

    def _count_span(self, m: int) -> None:
        """m decode steps of the span in flight are counted (its requests' tokens)."""
        e = self.e
        e.tokens += m * self.core.b
        e.stats.iterations += m

    def _kv_peak(self) -> None:
        e = self.e
        used = self.core.pool.used * self.bs
        if used > e.kv_peak:
            e.kv_peak = used

    def _ended(self, now: float) -> int:
        """Steps of the span in flight that end by `now` (fewer than all: its end is later)."""
        return self.cost.iterations_within(now - self.e.t, self.core.b, self.k0, self.m)

    def _cut(self, now: float, in_flight: bool) -> None:
        """End the span in flight early: after the step in flight at `now` (`in_flight`: one
        starting at `now` included), else at the first boundary at or after `now`."""
        e = self.e
        j = self._ended(now)
        span = self.cost.decode_span
        b, k0 = self.core.b, self.k0
        if in_flight or e.t + span(j, b, k0) < now:
            j += 1
        if j < self.m:
            self.m = j
            e.t_event = e.t + span(j, b, k0)

    def _idle(self) -> None:
        e = self.e
        self.kind, self.ex = IDLE, None
        self.used0 = self.core.pool.used
        e.phase, e.t_event = IDLE, INF


def _rid(x: Any) -> int:
    return x.rid
