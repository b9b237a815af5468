"""The sans-I/O rollout core: the RL loop's state machine, shared by the simulator and the live runner.

In the spirit of h11's `Connection`: the core holds the whole state of a rollout (the groups, the
in-flight map, the scheduler's event queue, the pause and sync holds, the closed batches, the
sample life cycle and the step ledger) and knows no clock, no engine, no simpy and no asyncio.
A driver feeds it what happened, with the time (`start_rollout`, `request_ended`, `abort_landed`,
`weights_synced`, ...), calls `drain` to let the scheduler react, and carries out the engine
commands the core hands to its `Commands` sink (send, abort, sync, batch ready). Engine figures
come in through a `Meter`. `aprilsim.sim.runtime` drives it in simulated time, `real.runner.runtime`
on live engines; whatever the scheduler can observe is decided here, once.

Decided here (docs/concepts.md, "What a scheduler may rely on"):

* AbortAll: the aborted samples stay RUNNING (in flight) until the abort lands; the actions after
  AbortAll in the same list see them in flight. The landing (SampleFinished/GroupFinished for
  requests that finished first, then one SamplesReturned, in the order the requests were sent)
  is never before the end of that list. Both drivers tell the engines once the scheduler's
  reaction is over (`drain` returned: every queued event handled), the abort and a weight sync's
  pause or abort alike; requests sent meanwhile, or while the abort is on its way, start after
  it; other events (the trainer, a sync) are heard while it is on its way.
* A Submit during a weight sync is taken at once: the samples are RUNNING, stamped with the new
  version, and count in flight; their requests start once the new weights are loaded.
* A sample is complete when it has generated its hidden target length (`_target_len`); where the
  target is unknown until the response ends (free generation), the driver's `reveal` hook
  decides and sets it. Truncated means complete at max_response_len (`Sample.truncated`).
* A request that ended (not aborted) short of its target came back at a token cap: PARTIAL and
  SampleCapped, in both drivers.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Final, Protocol

from aprilsim.metrics.records import StepRecord
from aprilsim.policies.base import (
    AbortAll,
    Action,
    CloseBatch,
    Context,
    Discard,
    Event,
    GroupFinished,
    PauseGeneration,
    ResumeGeneration,
    RolloutStarted,
    SampleCapped,
    SampleFinished,
    SamplesReturned,
    Scheduler,
    SchedulerError,
    Submit,
    TrainStepDone,
    UpdateWeights,
    WeightsUpdated,
)
from aprilsim.rollout.ledger import StepLedger
from aprilsim.rollout.lifecycle import check
from aprilsim.rollout.ports import Commands, Ended, Meter, Placement
from aprilsim.types import Group, GroupCountdown, Sample, SampleStatus, Segment

__all__ = ["MAX_FAULT_RESUBMITS", "GroupMaker", "Reveal", "RolloutCore", "effective_cap"]

# Final: C statics in the compiled build (read on every event), not module-dict lookups
_PENDING: Final = SampleStatus.PENDING
_RUNNING: Final = SampleStatus.RUNNING
_PARTIAL: Final = SampleStatus.PARTIAL
_DONE: Final = SampleStatus.DONE
_TRAINED: Final = SampleStatus.TRAINED
_DISCARDED: Final = SampleStatus.DISCARDED
MAX_FAULT_RESUBMITS: Final = 8  # per sample: a request that keeps failing is a bug, not a fault

# free generation: (sample, how its request ended) -> complete? (and then the hook sets the truth)
Reveal = Callable[[Sample, str], bool]


class GroupMaker(Protocol):
    """What makes groups (a workload, a dataset): fresh ones, and re-runs of given prompts."""

    def new_groups(self, n: int, step: int, group_size: int | None = None) -> list[Group]: ...

    def regenerate(self, groups: Sequence[Group], step: int, group_size: int) -> list[Group]: ...


def _rid(ended: Ended) -> int:
    return ended.rid


def effective_cap(sample: Sample, cap: int | None) -> int | None:
    """The token cap a submission puts on `sample`'s request: None where it does not bind."""
    return None if cap is None or cap >= sample.max_len - sample.generated else cap


def _register(groups: list[Group], registered: dict[int, Group]) -> list[Group]:
    """Enter `groups` in the core's table and give each its countdown: the core counts their
    samples down as they finish."""
    for g in groups:
        registered[g.gid] = g
        countdown = GroupCountdown(len(g.samples))
        for s in g.samples:
            s.countdown = countdown
    return groups


class _Source:
    """What a scheduler's `ctx.new_groups` / `ctx.regenerate` reach, and no more; registers the
    groups in the core's table (it holds it, not the core: a finished run holds no reference
    cycle, and no weak reference is needed, which a compiled core would not take)."""

    __slots__ = ("_groups", "_maker")

    def __init__(self, groups: dict[int, Group], maker: GroupMaker) -> None:
        self._groups = groups
        self._maker = maker

    def new_groups(self, n: int, step: int, group_size: int | None = None) -> list[Group]:
        return _register(self._maker.new_groups(n, step, group_size), self._groups)

    def regenerate(self, groups: Sequence[Group], step: int, group_size: int) -> list[Group]:
        return _register(self._maker.regenerate(groups, step, group_size), self._groups)


class RolloutCore:
    """One run's rollout state: events and the time in, engine commands out (module docstring)."""

    def __init__(
        self,
        *,
        scheduler: Scheduler,
        groups: GroupMaker,
        batch_size: int,
        steps: int,
        max_len: int,
        group_size: int | None,
        meter: Meter,
        commands: Commands,
        expected_length: Callable[[int], float],
        reveal: Reveal | None = None,
        keep_groups: bool = True,
    ) -> None:
        if batch_size < 1 or steps < 1:
            raise ValueError("batch_size and steps must be >= 1")
        self.scheduler = scheduler
        self.colocated = scheduler.mode == "colocated"
        self.steps = steps
        self.commands = commands
        self.now = 0.0
        self.version = 0
        self.groups: dict[int, Group] = {}  # registered (all, or the live ones: `keep_groups`)
        # False: a group whose samples are all trained or discarded is counted by the ledger and
        # let go (memory bounded in steps); True keeps every group for a look after the run
        self.keep_groups = keep_groups
        self.ctx = Context(source=_Source(self.groups, groups), batch_size=batch_size,
                           max_len=max_len, total_steps=steps, group_size=group_size)
        self.inflight: dict[int, Sample] = {}  # request id -> the sample it generates
        # its pop, bound once (never rebound): compiled, a call of a bound method skips the
        # method lookup a `self.inflight.pop(rid)` makes at every request's end (a deepcopy of a
        # core would keep the original's pop: none is made)
        self._pop_inflight: Callable[[int], Sample] = self.inflight.pop
        self._cap: dict[int, int] = {}  # request id -> its binding token cap
        self._place: dict[int, Placement] = {}  # request id -> its priority and route, where set
        self.next_rid = 0
        self.events: deque[Event] = deque()
        self._draining = False
        self._landed: list[Sequence[Ended]] = []  # aborts that landed at once, heard after the list
        self.on_ended: Callable[[Ended, Sample], None] | None = None  # the driver's trace hook
        self.paused = False  # PauseGeneration: submissions are held until ResumeGeneration
        self._held: list[tuple[Sample, int | None, Placement | None]] = []
        self.updating = False  # a weight sync is in progress
        self._sync_returned: list[Sample] = []
        self._closed: list[tuple[Group, ...]] = []
        self._want_batch = False  # colocated: the loop waits for a closed batch, nothing in flight
        self.n_closed = 0
        self.finished = False
        self.ledger = StepLedger(meter, expected_length, scheduler.step_stats)
        self.records = self.ledger.records
        # schedulers that ignore SampleFinished may say so (a speed-up on large clusters)
        self._sample_events = bool(getattr(scheduler, "sample_events", True))
        self._reveal = reveal
        self._fault_resubmits: dict[int, int] = {}
        self._stopped: list[Sample] = []  # samples whose requests the end of the run stopped

    # ------------------------------------------------------------------ groups
    def register(self, groups: list[Group]) -> list[Group]:
        """Groups a scheduler drew: the core counts their samples down as they finish."""
        return _register(groups, self.groups)

    # ------------------------------------------------------------------ the RL loop's inputs
    def start_rollout(self, step: int, now: float) -> None:
        """The rollout of `step` starts at `now` (colocated: the loop then waits for its batch)."""
        self.now = now
        self.ctx.step = step
        self.ledger.begin(step, now)
        self._want_batch = self.colocated
        self.events.append(RolloutStarted(step, self.version))

    def end_rollout(self, groups: tuple[Group, ...], now: float) -> StepRecord:
        """Colocated: the batch is closed and nothing is in flight; its record, ready to train."""
        self.now = now
        rec = self.ledger.close(now)
        self.ledger.trained(rec, groups, trainer_version=self.version)
        return rec

    def train_record(self, step: int, groups: tuple[Group, ...]) -> StepRecord:
        """Disaggregated: the record of `step` (opened when its batch closed), filled for training."""
        rec = self.ledger.records[step]
        self.ledger.trained(rec, groups, trainer_version=step)
        return rec

    def colocated_synced(self) -> None:
        """Colocated: the trained weights are on the engines (the next rollout uses them)."""
        self.version += 1

    def train_done(self, step: int, now: float) -> None:
        """Disaggregated: the trainer finished `step`; the scheduler decides when to sync."""
        self.now = now
        self.events.append(TrainStepDone(step))

    # ------------------------------------------------------------------ the engines' inputs
    def request_ended(self, rid: int, tokens: int, how: str) -> Sample:
        """Request `rid` left its engine with `tokens` new tokens ("stop", "length" or "abort").

        The common path of every run: credit the tokens to the sample's submit version, then
        finish it, return it unfinished (abort), or hold it PARTIAL (a token cap). Returns it.
        """
        s = self._pop_inflight(rid)
        if tokens > 0:  # Sample.add_tokens, inlined
            s.generated += tokens
            segs, v = s.segments, s.submit_version
            last = segs[-1] if segs else None
            if last is not None and last.version == v:
                last.tokens += tokens
            else:
                segs.append(Segment(v, tokens))
        if self._place:
            self._place.pop(rid, None)
        if self._cap:
            self._cap.pop(rid, None)
        if how == "abort":
            s.status = _PARTIAL
            self.ledger.n_partial += 1
            return s
        target = s._target_len
        if target is None:
            done = self._reveal is not None and self._reveal(s, how)
        else:
            done = s.generated >= target
        if not done:  # it ended short of its end: a token budget (or an engine's own cap)
            s.status = _PARTIAL
            self.ledger.n_partial += 1
            self.events.append(SampleCapped(s))
            return s
        s.status = _DONE  # _finish, inlined: the common path of every run
        s.complete = True
        s.finish_s = self.now
        if self._sample_events:
            self.events.append(SampleFinished(s))
        self._count_down(s)
        return s

    def _finish(self, s: Sample) -> None:
        """A sample reached its end: DONE, its events, the group countdown (`request_ended` inlines it)."""
        s.status = _DONE
        s.complete = True
        s.finish_s = self.now
        if self._sample_events:
            self.events.append(SampleFinished(s))
        self._count_down(s)

    def _count_down(self, s: Sample) -> None:
        """One sample of its group less to finish: GroupFinished when it was the last."""
        countdown = s.countdown
        if countdown is None:
            raise SchedulerError(f"sample {s.uid} finished, but its group {s.group_id} was "
                                 "never registered (groups come from ctx.new_groups)")
        countdown.left -= 1
        if countdown.left == 0:
            self.events.append(GroupFinished(self.groups[s.group_id]))

    def abort_landed(self, ended: Iterable[Ended]) -> None:
        """An AbortAll landed: credit its requests; the unfinished come back in SamplesReturned."""
        self.events.append(SamplesReturned(tuple(self._credit_all(ended))))

    def sync_aborted(self, ended: Iterable[Ended]) -> None:
        """An interrupting weight sync stopped these requests (live: once its abort landed)."""
        self._sync_returned += self._credit_all(ended)

    def _credit_all(self, ended: Iterable[Ended]) -> list[Sample]:
        # in the order the requests were sent (request id), whatever order the engines gave
        returned: list[Sample] = []
        hook = self.on_ended
        for c in sorted(ended, key=_rid):
            s = self.request_ended(c.rid, c.tokens, c.reason)
            if s.status is _DONE:  # it finished before the abort landed: at its own time
                s.finish_s = getattr(c, "time", s.finish_s)
            if hook is not None:
                hook(c, s)
            if c.reason == "abort":
                returned.append(s)
        return returned

    def weights_synced(self, now: float) -> None:
        """The engines hold the new weights: WeightsUpdated, then the samples the sync returned."""
        self.now = now
        self.version += 1
        self.updating = False
        self.events.append(WeightsUpdated(self.version))
        returned, self._sync_returned = self._sync_returned, []
        if returned:
            self.events.append(SamplesReturned(tuple(returned)))

    def request_failed(self, rid: int, tokens: int, error: str = "") -> Sample:
        """Request `rid` failed without being asked to (live faults): keep its partial output and
        send the rest again at once, transparently to the scheduler (or finish or cap it)."""
        s = self.inflight.pop(rid)
        cap = self._cap.pop(rid, None)
        place = self._place.pop(rid, None)
        s.add_tokens(tokens, s.submit_version)
        target = s._target_len
        done = (self._reveal is not None and self._reveal(s, "failed")) if target is None \
            else s.generated >= target
        if done:  # the partial output was the whole response after all
            self._finish(s)
            return s
        n = self._fault_resubmits.get(s.uid, 0) + 1
        self._fault_resubmits[s.uid] = n
        if n > MAX_FAULT_RESUBMITS:
            raise SchedulerError(f"sample {s.uid} failed {n} times; last error: {error}")
        left = None if cap is None else cap - tokens
        if left is not None and left <= 0:  # its budget was spent before the failure
            s.status = _PARTIAL
            self.ledger.n_partial += 1
            self.events.append(SampleCapped(s))
            return s
        rid2 = self.next_rid
        self.next_rid += 1
        version = self.version + 1 if self.updating else self.version
        s.submit_version = version
        self.inflight[rid2] = s
        if left is not None:
            self._cap[rid2] = left
        if place is not None:
            self._place[rid2] = place
        try:
            if place is None:
                self.commands.send((s,), rid2, left, version)
            else:
                self.commands.send((s,), rid2, left, version, place)
        except BaseException:  # no engine left to take it: it stays in the buffer
            self.inflight.pop(rid2, None)
            self._cap.pop(rid2, None)
            self._place.pop(rid2, None)
            s.status = _PARTIAL
            self.ledger.n_partial += 1
            raise
        return s

    # ------------------------------------------------------------------ the scheduler
    def drain(self, now: float) -> None:
        """Hand every queued event to the scheduler, one at a time, and carry out its actions."""
        self.now = now
        if self._draining:
            return
        self._draining = True
        events, ctx, handle, apply = self.events, self.ctx, self.scheduler.handle, self._apply
        try:
            while events:
                ev = events.popleft()
                ctx.version = self.version
                ctx.in_flight = len(self.inflight)
                for action in handle(ev, ctx):
                    apply(action)
                if self._landed:  # an abort that landed at once: heard after the whole list
                    landed, self._landed = self._landed, []
                    for ended in landed:
                        self.abort_landed(ended)
        finally:
            self._draining = False

    def check_ready(self) -> None:
        """Colocated: hand over the closed batch once nothing is in flight."""
        if self._want_batch and self._closed and not self.inflight:
            self._want_batch = False
            self.commands.batch_ready(self._closed.pop(0))

    def _apply(self, action: Action) -> None:
        if isinstance(action, Submit):
            if action.max_new_tokens is not None and action.max_new_tokens < 1:
                raise SchedulerError("Submit.max_new_tokens must be >= 1")
            place = None
            if action.priority or action.route is not None or action.keep_kv:
                place = Placement(action.priority, action.route, action.keep_kv)
            if self.paused:
                for s in action.samples:
                    if s.status is not _PENDING and s.status is not _PARTIAL:
                        check(s, _RUNNING)
                self._held.extend((s, action.max_new_tokens, place) for s in action.samples)
            else:
                self.submit(action.samples, action.max_new_tokens, place)
        elif isinstance(action, AbortAll):
            landed = self.commands.abort_all()
            if landed is not None:  # landed at once: credited after the whole action list
                self._landed.append(landed)
        elif isinstance(action, CloseBatch):
            self._close_batch(action.groups)
        elif isinstance(action, Discard):
            self._discard(action.samples)
        elif isinstance(action, UpdateWeights):
            self._update_weights(action.interrupt)
        elif isinstance(action, PauseGeneration):
            self.paused = True
            self.ledger.pause(self.now)
        elif isinstance(action, ResumeGeneration):
            self.paused = False
            self.ledger.resume(self.now)
            held, self._held = self._held, []
            by_cap: dict[tuple[int | None, Placement | None], list[Sample]] = {}
            for s, cap, place in held:
                by_cap.setdefault((cap, place), []).append(s)
            for (cap, place), samples in by_cap.items():
                self.submit(samples, cap, place)
        else:
            raise SchedulerError(f"unknown action {action!r}")

    def submit(self, samples: Sequence[Sample], cap: int | None = None,
               place: Placement | None = None) -> None:
        """PENDING or PARTIAL samples become RUNNING under the current version (the next one
        during a weight sync) and go to the driver in one `send` (with `place` where set)."""
        if self.finished or not samples:
            return
        ledger, inflight, caps = self.ledger, self.inflight, self._cap
        version = self.version + 1 if self.updating else self.version
        rid0 = rid = self.next_rid
        now = self.now
        for s in samples:
            st = s.status
            if st is _PARTIAL:
                ledger.n_partial -= 1
            elif st is not _PENDING:
                raise SchedulerError(f"cannot submit sample {s.uid} in status {st.value}")
            g = s.generated
            if g:
                ledger.resumed(g)
            if cap is not None and cap < s.max_len - g:  # effective_cap, inlined
                caps[rid] = cap
            s.status = _RUNNING
            if not s.submits:
                s.first_submit_s = now
            s.submits += 1
            s.submit_version = version
            inflight[rid] = s
            rid += 1
        self.next_rid = rid
        if place is None:
            self.commands.send(samples, rid0, cap, version)
            return
        self._place.update((r, place) for r in range(rid0, rid))
        self.commands.send(samples, rid0, cap, version, place)

    def _discard(self, samples: Sequence[Sample]) -> None:
        for s in samples:
            check(s, _DISCARDED)
            if s.status is _PARTIAL:
                self.ledger.n_partial -= 1
            s.status = _DISCARDED
            self.ledger.wasted(s.generated)
        if not self.keep_groups:
            for gid in {s.group_id for s in samples}:
                self._retire_if_over(gid)

    def _close_batch(self, groups: Sequence[Group]) -> None:
        for g in groups:
            samples = g.samples
            for s in samples:  # finished and not yet trained: every sample DONE
                if s.status is not _DONE:
                    raise SchedulerError(f"group {g.gid} is not finished or was trained already")
            for s in samples:
                s.status = _TRAINED
        if not self.keep_groups:
            registered = self.groups
            for g in groups:
                if registered.get(g.gid) is g:  # all of it trained just now: nothing to check
                    self.ledger.retire_trained(g)
                    del registered[g.gid]
                else:
                    self._retire_if_over(g.gid)
        batch = tuple(groups)
        if self.n_closed >= self.steps:
            raise SchedulerError(
                f"scheduler {self.scheduler.name!r} closed more batches than the {self.steps} "
                "steps of the run (read ctx.total_steps)"
            )
        self.n_closed += 1
        if self.colocated:
            self._closed.append(batch)
            return
        # disaggregated: the batch queues for the trainer; the next rollout starts at once
        rec = self.ledger.close(self.now)
        self.commands.batch_ready(batch)
        nxt = rec.step + 1
        if nxt < self.steps:
            self.ctx.step = nxt
            self.ledger.begin(nxt, self.now)
            self.events.append(RolloutStarted(nxt, self.version))

    def _retire_if_over(self, gid: int) -> None:
        """Let go of registered group `gid` once every sample of it is trained or discarded
        (nothing can change it again): the ledger counts it for `end_state`. The registered group
        is the one asked (a batch may train a copy that holds some of its samples); the batch
        being trained, or a scheduler, may still hold it."""
        g = self.groups.get(gid)
        if g is None:
            return
        for s in g.samples:
            st = s.status
            if st is not _TRAINED and st is not _DISCARDED:
                return
        self.ledger.retire(g)
        del self.groups[gid]

    def _update_weights(self, interrupt: bool) -> None:
        if self.colocated:
            raise SchedulerError("UpdateWeights in colocated mode: the runtime syncs after training")
        if self.updating:
            raise SchedulerError("UpdateWeights while a weight update is in progress")
        self.updating = True
        ended = self.commands.sync_weights(interrupt)
        if ended:
            self.sync_aborted(ended)

    # ------------------------------------------------------------------ end of run
    def finish(self) -> None:
        """The RL loop is over: nothing more is submitted."""
        self.finished = True

    def final_ended(self, rid: int, tokens: int, how: str) -> Sample:
        """The run is over and request `rid` was stopped: credit it, no events (DONE or PARTIAL)."""
        self.finished = True
        s = self.inflight.pop(rid)
        s.add_tokens(tokens, s.submit_version)
        self._cap.pop(rid, None)
        self._place.pop(rid, None)
        if how == "abort":
            done = False
        elif s._target_len is None:
            done = self._reveal is not None and self._reveal(s, how)
        else:
            done = s.generated >= s._target_len
        s.status = _DONE if done else _PARTIAL
        s.complete = done
        self._stopped.append(s)
        return s

    def end_state(self) -> dict[str, int]:
        """Where every sample is, by status, in samples and tokens (the conservation ledger), plus
        what was still in flight when the run ended (those samples are counted partial or done)."""
        self.finished = True
        out = self.ledger.end_state(self.groups.values())
        stopped = {id(s): s for s in self._stopped}.values()
        out["in_flight_at_end"] = len(stopped)
        out["in_flight_tokens_at_end"] = sum(s.generated for s in stopped)
        return out

    def stalled(self, at: str, why: str) -> SchedulerError:
        """The one message for a run whose loop waits with nothing left that could wake it."""
        return SchedulerError(
            f"{at}: {why}, but the {self.scheduler.mode} loop is still waiting (scheduler "
            f"{self.scheduler.name!r} never closed a batch or never updated weights)")
