"""The reference engine under vLLM's rules: one step per event, on `VllmSteps` itself.

`VllmSteps` is vLLM 0.32's scheduler reproduced (checked step by step against vLLM's own on the
golden traces); this stepper feeds it the simulator's requests as token ids
(`families.vllm_content`), runs each step it plans for the time the cost model gives
(`vllm_timing.step_time`), samples each request's next token (its stop token at its target
length) and reports what finished. It recounts nothing incrementally and jumps nothing: the
oracle the fast engine's stepper (`vllm_fast`) must reproduce. The engine's calls are handed
here (`Rules.stepper`); the rules of time are `vllm_timing`'s.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from aprilsim.engine.families.vllm_content import STOP, Content, content
from aprilsim.engine.families.vllm_steps import StepPlan, VllmSteps
from aprilsim.engine.families.vllm_timing import check_blocks, finished, postpone, step_time
from aprilsim.engine.parts import DECODE, IDLE, PREFILL, note_started
from aprilsim.engine.request import Completion, Request

INF = math.inf


class RefStepper:
    """A `ReferenceEngine`'s calls under vLLM's rules (`Rules.stepper`)."""

    def __init__(self, engine: Any, rules: Any) -> None:
        self.e = engine
        self.rules = rules
        self.model = VllmSteps(rules.steps_config())
        self.reqs: dict[int, tuple[Request, Content]] = {}
        self.plan: StepPlan | None = None
        self.prefill_s = 0.0  # of the step in flight
        self.used = 0  # blocks in use before the step in flight (what progress_at reports)
        self.resume_at = 0.0  # no step starts before (a pause)
        self.n_admitted = 0  # of the plan's admissions, those counted (`_admitted`)
        self.counts = (0, 0, 0)  # the plan's decode rows, prefill tokens, prefill rows
        self.content = content  # tests may give requests other tokens

    # ------------------------------------------------------------------ the engine's calls
    def submit(self, reqs: list[Request], now: float) -> None:
        e, m = self.e, self.model
        check_blocks(reqs, self.rules)
        for r in reqs:
            c = self.content(r)
            self.reqs[r.rid] = (r, c)
            m.add(r.rid, c.input_tokens(), r.max_new, STOP)
        if self.plan is None:
            e.t = max(e.t, now)
            self._plan()
        elif e.t >= now:  # the step planned now has not started: they join it
            m.admit_more(self.plan)
            self._admitted()
            self._price()
        self._mirror()

    def advance(self) -> list[Completion]:
        done = self._end_step()
        self._plan()
        return done

    def abort_all(self, now: float) -> list[Completion]:
        e = self.e
        out: list[Completion] = []
        while e.t_event <= now:
            out += self.advance()
        if self.plan is not None and now > e.t:
            e.busy_time += now - e.t  # the step in flight: busy, its tokens lost
        e.t = max(e.t, now)
        self.plan = None
        self.model._last = []
        for rid in sorted(self.model.requests):  # freed in request order
            out.append(Completion(rid, self.reqs[rid][0].gen, "abort", now))
            self._drop(rid)
        e.phase, e.t_event = IDLE, INF
        self._mirror()
        return out

    def abort_after_steps(self, now: float, k: int) -> tuple[float, list[Completion]]:
        e, st = self.e, self.e.stats
        out: list[Completion] = []
        while e.t_event <= now:
            out += self.advance()
        if self.plan is None or e.t > now:
            return now, out + self.abort_all(now)
        n_due = len(out)
        st.abort_steps_run += 1
        out += self._end_step()  # the step in flight completes
        queued = [rid for rid in self.model.requests if self.model.requests[rid].status != 1]
        held = {rid: self.reqs[rid][0] for rid in queued}
        for rid in queued:  # they leave now; heard of when the abort lands
            self._drop(rid)
        for _ in range(k):
            if not self.model.running:
                break
            self._plan()
            out += self._end_step()
            st.abort_steps_run += 1
        st.abort_finishes += len(out) - n_due
        rest = self.abort_all(e.t)
        return e.t, out + rest + [Completion(rid, r.gen, "abort", e.t) for rid, r in held.items()]

    def pause(self, now: float, until: float) -> list[Completion]:
        e = self.e
        out: list[Completion] = []
        while e.t_event <= now:
            out += self.advance()
        self.resume_at = max(self.resume_at, until)
        if self.plan is None:
            e.t = max(e.t, until)
        elif e.t > now:  # the step planned has not started: it starts when the pause ends
            postpone(e, until)
        return out

    def progress_at(self, now: float) -> tuple[int, float, int]:
        e = self.e
        busy = e.busy_time
        if self.plan is not None and now > e.t:
            busy += min(now, e.t_event) - e.t
        return e.tokens, busy, self.used * self.rules.block_size

    def iterations_at(self, now: float) -> int:
        return self.e.stats.iterations

    def flush_prefix_cache(self) -> None:
        """vLLM's `reset_prefix_cache` at a weight update: only while no block is in use."""
        had = bool(self.model.pool.cache)
        if self.model.reset_prefix_cache() and had:
            self.e.stats.cache_flushes += 1

    # ------------------------------------------------------------------ steps
    def _plan(self) -> None:
        """Plan the next step at the engine's time (not before a pause ends), or go idle."""
        e, m = self.e, self.model
        if not m.has_work():
            self.plan = None
            e.phase, e.t_event = IDLE, INF
            self._mirror()
            return
        e.t = max(e.t, self.resume_at)
        self.used = m.cfg.num_blocks - 1 - m.num_free_blocks
        plan = self.plan = m.schedule()
        e.stats.retractions += len(plan.preempted)
        for rid in plan.preempted:
            self.reqs[rid][0].retractions += 1
        self.n_admitted = 0
        self._admitted()
        self._price()
        self._mirror()

    def _admitted(self) -> None:
        """The plan's admissions not yet counted: their prefix-cache hits, their start."""
        plan, st, t = self.plan, self.e.stats, self.e.t
        assert plan is not None
        for rid, hit in plan.admitted[self.n_admitted:]:
            st.cache_hits += hit > 0
            st.cache_hit_tokens += hit
            note_started([self.reqs[rid][0]], t, self.e.started)
        self.n_admitted = len(plan.admitted)

    def _price(self) -> None:
        """The step's duration and what the plan's admissions count."""
        e, plan = self.e, self.plan
        assert plan is not None
        b = k = tokens = sq = rows = 0
        for (_, n), c in zip(plan.scheduled, plan.context):
            if n == 1:
                b += 1
                k += c
            else:
                rows += 1
                tokens += n
                sq += (c + n) * (c + n) - c * c
        dur, self.prefill_s = step_time(e.cost, (b, k), (tokens, sq, rows))
        self.counts = (b, tokens, rows)
        e.phase = PREFILL if rows else DECODE
        e.t_event = e.t + dur
        used = self.model.cfg.num_blocks - 1 - self.model.num_free_blocks
        e.kv_peak = max(e.kv_peak, used * self.rules.block_size)

    def _end_step(self) -> list[Completion]:
        """The step in flight ends: its rows' tokens are sampled; some requests finish."""
        e, m, plan = self.e, self.model, self.plan
        if plan is None:
            return []
        st = e.stats
        e.busy_time += e.t_event - e.t
        e.t = e.t_event
        b, tokens, rows = self.counts
        st.iterations += b > 0
        st.prefill_tokens += tokens
        st.prefill_passes += rows > 0
        st.prefill_s += self.prefill_s
        sampled = {}
        for rid, i in plan.samples:
            r, c = self.reqs[rid]
            sampled[rid] = STOP if i == r.target_new - 1 < r.max_new - 1 else c.output_token(i)
            r.gen += 1
        e.tokens += len(plan.samples)
        done = [finished(self.reqs.pop(rid)[0], e.t) for rid in sorted(m.update(sampled))]
        self.plan = None
        e.phase, e.t_event = IDLE, INF
        return done

    def _drop(self, rid: int) -> None:
        """Request `rid` leaves (aborted): out of the scheduler, its blocks freed."""
        self.model.abort(rid)
        del self.reqs[rid]

    def _mirror(self) -> None:
        """The engine's `running` and `waiting` as the scheduler holds them (the router reads
        their sizes and the queue's input)."""
        e, reqs, m = self.e, self.reqs, self.model
        if self.plan is None:
            self.used = m.cfg.num_blocks - 1 - m.num_free_blocks
        e.running = [reqs[r.rid][0] for r in m.running]
        e.waiting = deque(reqs[r.rid][0] for r in m.waiting)
