"""The sans-I/O rollout core: the RL loop's state machine, shared by the simulator and the live
runner.

In the spirit of h11's `Connection`: the core holds the whole state of a rollout (the groups, the
in-flight map, the scheduler's event queue, the pause and sync holds, the sends held behind
engine I/O, the closed batches, the sample life cycle and the step ledger) and knows no clock,
no engine, no simpy and no asyncio. A driver feeds it what happened, with the time (`start_rollout`,
`request_ended`, `abort_landed`, `weights_synced`, ...), and calls `drain(now)`: the scheduler
reacts, and `drain` returns the commands to carry out (`Abort`, `SyncWeights`, `BatchReady`, and
an episode's `ToolCall` timers, `aprilsim.rollout.ports`) in order. Requests start through the
driver's `Sender`, the one direct call (the common path). Engine figures come in through a `Meter`.
`aprilsim.sim.runtime` drives it in simulated time, `real.runner.runtime` on live engines; whatever
the scheduler can observe, and the order engine I/O happens in, is decided here, once.

Decided here (docs/concepts.md, "What a scheduler may rely on"):

* Engine I/O waits for the scheduler's reaction: `drain` returns an abort or a sync once every
  queued event is handled, one at a time (the driver carries it out and drains again, so what an
  abort that landed at once brought back is heard before the next I/O starts). A batch handed
  over during the reaction comes first.
* Sends wait behind I/O on its way: while an abort has not landed or a weight sync is in progress
  (`_holding`), the core keeps submitted requests (RUNNING, in flight, stamped) and sends them
  once neither is left, in the order they were submitted. An abort or an interrupting sync ends
  the sends held when it was asked for without sending them (no token generated).
* AbortAll: the aborted samples stay RUNNING (in flight) until the abort lands; the actions after
  AbortAll in the same list see them in flight. The landing (SampleFinished/GroupFinished for
  requests that finished first, then one SamplesReturned, in the order the requests were sent)
  is never before the end of that list, and aborts land in the order they were asked for: one
  reported before an earlier one is heard after it (and after the reaction to it). Other events
  (the trainer, a sync) are heard while an abort is on its way.
* A Submit during a weight sync is taken at once: the samples are RUNNING, stamped with the new
  version, and count in flight; their requests start once the new weights are loaded.
* A sample is complete when it has generated its hidden target length (`_target_len`); where the
  target is unknown until the response ends (free generation), the driver's `reveal` hook
  decides and sets it. Truncated means complete at max_response_len (`Sample.truncated`).
* A request that ended (not aborted) short of its target came back at a token cap: PARTIAL and
  SampleCapped, in both drivers.
* An episode's turn that ends short of its end calls its tool: in flight under a request id of
  its own (a `ToolCall` the driver times, first among `drain`'s commands); no engine holds it, so
  an abort cancels it (it runs again when the episode is resumed). Its return sends the next turn
  like any send, behind the hold rule.
* Status writes follow the life-cycle table (`aprilsim.rollout.lifecycle`): a change a scheduler
  names is checked against it; the hot paths write where the in-flight map proves the source.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final, Protocol

from aprilsim.metrics.records import StepRecord
from aprilsim.policies.base import (
    AbortAll,
    Action,
    CallTools,
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
    ToolReturned,
    TrainStepDone,
    TurnEnded,
    UpdateWeights,
    WeightsUpdated,
)
from aprilsim.rollout.ledger import StepLedger
from aprilsim.rollout.lifecycle import check
from aprilsim.rollout.ports import (
    Abort,
    BatchReady,
    Command,
    Ended,
    Meter,
    Placement,
    RequestEnd,
    Sender,
    SyncWeights,
    ToolCall,
)
from aprilsim.types import Group, GroupCountdown, Sample, SampleStatus, Segment

__all__ = ["ACTION_HANDLERS", "MAX_FAULT_RESUBMITS", "GroupMaker", "Reveal", "RolloutCore",
           "effective_cap"]

# Final: C statics in the compiled build (read on every event), not module-dict lookups
_PENDING: Final = SampleStatus.PENDING
_RUNNING: Final = SampleStatus.RUNNING
_PARTIAL: Final = SampleStatus.PARTIAL
_DONE: Final = SampleStatus.DONE
_TRAINED: Final = SampleStatus.TRAINED
_DISCARDED: Final = SampleStatus.DISCARDED
MAX_FAULT_RESUBMITS: Final = 8  # per sample: a request that keeps failing is a bug, not a fault
_NO_COMMANDS: Final[tuple[Command, ...]] = ()

# free generation: (sample, how its request ended) -> complete? (and then the hook sets the truth)
Reveal = Callable[[Sample, str], bool]
# a send the core holds: (samples, first request id, cap, version, placement)
_Held = tuple[Sequence[Sample], int, int | None, int, Placement | None]
# what follows an episode's tool call: (the token budget left for the turns after it, their
# placement, whether its next turn follows by itself (else: ToolReturned, a gated scheduler))
_Then = tuple[int | None, Placement | None, bool]
_Tool = tuple[Sample, int | None, Placement | None, bool]  # a tool call in flight: (sample, *then)


class GroupMaker(Protocol):
    """What makes groups (a workload, a dataset): fresh ones, and re-runs of given prompts. One
    whose samples may be episodes says so with a true `agentic` attribute."""

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

    __slots__ = ("_groups", "_ledger", "_maker")

    def __init__(self, groups: dict[int, Group], maker: GroupMaker, ledger: StepLedger) -> None:
        self._groups = groups
        self._maker = maker
        self._ledger = ledger

    def new_groups(self, n: int, step: int, group_size: int | None = None) -> list[Group]:
        groups = self._maker.new_groups(n, step, group_size)
        if groups and not self._ledger.agentic and groups[0].samples[0].episode is not None:
            self._ledger.agentic = True  # its steps record their episodes' figures
        return _register(groups, self._groups)

    def regenerate(self, groups: Sequence[Group], step: int, group_size: int) -> list[Group]:
        return _register(self._maker.regenerate(groups, step, group_size), self._groups)


class _SyncState:
    """A weight sync's bookkeeping: the samples it returned (heard once the new weights are
    loaded), the held sends an interrupting sync ended unsent, whether its abort is still on its
    way to the engines, and the tool calls that returned meanwhile (`tool_done`)."""

    def __init__(self) -> None:
        self.returned: list[Sample] = []
        self.covered: list[int] = []
        self.landing = False
        self.tools_after: list[int] = []


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
        sender: Sender,
        expected_length: Callable[[int], float],
        reveal: Reveal | None = None,
        keep_groups: bool = True,
    ) -> None:
        if batch_size < 1 or steps < 1:
            raise ValueError("batch_size and steps must be >= 1")
        self.scheduler = scheduler
        self.colocated = scheduler.mode == "colocated"
        self.steps = steps
        self.sender = sender
        self.now = 0.0  # the time of the last input (the ledger's and the actions' clock)
        self.version = 0
        self.groups: dict[int, Group] = {}  # registered (all, or the live ones: `keep_groups`)
        # False: a group whose samples are all trained or discarded is counted by the ledger and
        # let go (memory bounded in steps); True keeps every group for a look after the run
        self.keep_groups = keep_groups
        self.ledger = StepLedger(meter, expected_length, scheduler.step_stats)
        # a run of episodes (a maker may say so; else its first episode does, `_Source`)
        self.ledger.agentic = bool(getattr(groups, "agentic", False))
        self.ctx = Context(source=_Source(self.groups, groups, self.ledger), batch_size=batch_size,
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
        self._empty_aborts = 0  # AbortAlls with nothing in flight: they land after the list
        self.on_ended: Callable[[Ended, Sample], None] | None = None  # the driver's trace hook
        self.paused = False  # PauseGeneration: submissions are held until ResumeGeneration
        self._paused: list[tuple[Sample, int | None, Placement | None]] = []
        self.updating = False  # a weight sync is in progress
        self._sync = _SyncState()
        # engine I/O: commands not yet handed out, aborts on their way (oldest first), landings
        # reported before an earlier abort's, the held sends each abort ended unsent
        self._io: deque[Command] = deque()
        self._batches: list[Command] = []  # batches handed over during the reaction
        self._aborts: deque[int] = deque()
        self._early: dict[int, Sequence[Ended]] = {}
        self._covered: dict[int, list[int]] = {}
        self._next_abort = 0
        self._held: list[_Held] = []  # sends waiting behind an abort or a sync (`_holding`)
        self._unsent: set[int] = set()  # request ids in flight the driver was never given
        self._closed: list[tuple[Group, ...]] = []
        self._want_batch = False  # colocated: the loop waits for a closed batch, nothing in flight
        self.n_closed = 0
        self.finished = False
        self.records = self.ledger.records
        # schedulers that ignore SampleFinished may say so (a speed-up on large clusters)
        self._sample_events = bool(getattr(scheduler, "sample_events", True))
        self._reveal = reveal
        self._fault_resubmits: dict[int, int] = {}
        self._stopped: list[Sample] = []  # samples whose requests the end of the run stopped
        # episodes: tool calls in flight (their own request ids, in the in-flight map), the
        # timers to hand the driver (`ToolCall`, first in `drain`'s commands); a scheduler with
        # `turn_events` takes each turn's end itself; `_returning`: crediting what an abort or an
        # interrupting sync brought back (an episode at its turn's end comes back, tool pending)
        self._tools: dict[int, _Tool] = {}
        self.timers: list[Command] = []
        self._turn_events = bool(getattr(scheduler, "turn_events", False))
        self._returning = False
        self._tool_waiting = False  # every sample in flight waits on a tool call
        self.tools_cancelled = 0  # tool calls an abort cancelled (they run again if resumed)

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
        """Disaggregated: the record of `step` (opened when its batch closed), filled for
        training."""
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
    def request_ended(self, rid: int, tokens: int, how: str, now: float) -> Sample:
        """Request `rid` left its engine at `now` with `tokens` new tokens ("stop", "length" or
        "abort").

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
        place = self._place.pop(rid, None) if self._place else None
        cap = self._cap.pop(rid, None) if self._cap else None
        if how == "abort":
            s.status = _PARTIAL  # RUNNING (in flight) -> PARTIAL: lifecycle.DIRECT
            self.ledger.n_partial += 1
            if self._tools:
                self._tool_clock(now)
            return s
        target = s._target_len
        if target is None:
            done = self._reveal is not None and self._reveal(s, how)
        else:
            done = s.generated >= target
        if not done:  # it ended short of its end: an episode's turn, or a token budget
            self._ended_short(s, None if cap is None else cap - tokens, place, now)
            return s
        s.status = _DONE  # _finish and _count_down, inlined: the common path of every run
        s.complete = True
        s.finish_s = now
        if self._sample_events:
            self.events.append(SampleFinished(s))
        countdown = s.countdown
        if countdown is None:
            self._count_down(s)  # raises: its group was never registered
        else:
            countdown.left -= 1
            if countdown.left == 0:
                self.events.append(GroupFinished(self.groups[s.group_id]))
        if self._tools:
            self._tool_clock(now)
        return s

    def requests_started(self, started: Iterable[tuple[int, float]]) -> None:
        """Each (request id, time): the request was first scheduled on its engine then (its queue
        wait ended); where it is its sample's first to be, the sample's `start_s`
        (docs/metrics.md). The engines report it, the drivers pass it on."""
        inflight = self.inflight
        for rid, t in started:
            s = inflight.get(rid)
            if s is not None and s.start_s < 0.0:
                s.start_s = t

    def _ended_short(self, s: Sample, cap: int | None, place: Placement | None,
                     now: float) -> None:
        """A request ended short of its sample's end: at an episode's turn end, or at a token
        budget (PARTIAL: SampleCapped). `cap`: what is left of its budget."""
        ep = s.episode
        if ep is not None and s.generated >= ep._ends[ep.turn]:
            self._turn_ended(s, (cap, place, True), now)
            return
        s.status = _PARTIAL
        self.ledger.n_partial += 1
        self.events.append(SampleCapped(s))
        if self._tools:
            self._tool_clock(now)

    # ------------------------------------------------------------------ episodes' turns
    def _turn_ended(self, s: Sample, then: _Then, now: float) -> None:
        """Episode `s` ended a turn short of its end: its tool call runs now and its next turn
        follows (`tool_done`); or it waits, PARTIAL with the call pending (`ep.calling`): a
        scheduler with `turn_events` hears `TurnEnded`, an abort or a sync landing returns it."""
        ep = s.episode
        assert ep is not None
        ep.calling = True
        if self._returning or self._turn_events:
            s.status = _PARTIAL  # RUNNING (in flight) -> PARTIAL: lifecycle.DIRECT
            self.ledger.n_partial += 1
            if not self._returning:
                self.events.append(TurnEnded(s))
            if self._tools:
                self._tool_clock(now)
            return
        self._start_tool(s, then, now)

    def _start_tool(self, s: Sample, then: _Then, now: float) -> None:
        """Episode `s` (RUNNING) calls its tool: in flight under a request id of its own, a
        `ToolCall` timer for the driver (the first of `drain`'s commands); `then`: what follows
        the call."""
        ep = s.episode
        assert ep is not None
        rid = self.next_rid
        self.next_rid += 1
        self.inflight[rid] = s
        self._tools[rid] = (s, *then)
        k = ep.turn
        self.timers.append(ToolCall(rid, s, ep._tool_s[k], ep._tool_tokens[k]))
        self._tool_clock(now)

    def tool_live(self, rid: int) -> bool:
        """Whether tool call `rid` still runs (an abort cancels the calls in flight)."""
        return rid in self._tools

    def tool_done(self, rid: int, now: float) -> Sample | None:
        """Tool call `rid` (a `ToolCall`) returned at `now`: its tokens join the context and the
        episode's next turn is sent under the version of this moment (held behind an abort or a
        sync on its way), or it comes back PARTIAL: `ToolReturned` (a `CallTools`), or
        `SampleCapped` (the submission's token budget is spent). None: the call was cancelled, or
        it returned while an interrupting sync's abort is on its way (heard when that lands, after
        what the abort brought back, as a live driver hears it)."""
        self.now = now
        if self._sync.landing and rid in self._tools:  # heard once the sync's abort lands
            self._sync.tools_after.append(rid)
            return None
        got = self._tools.pop(rid, None) if not self.finished else None
        if got is None:
            return None
        s, cap, place, chain = got
        del self.inflight[rid]
        ep = s.episode
        assert ep is not None
        k = ep.turn
        ep.appended += ep._tool_tokens[k]
        ep.tool_time_s += ep._tool_s[k]
        ep.turn = k + 1
        ep.calling = False
        self.ledger.tool_returned(ep._tool_s[k])
        if not chain or (cap is not None and cap <= 0):
            s.status = _PARTIAL  # RUNNING (in flight) -> PARTIAL: lifecycle.DIRECT
            self.ledger.n_partial += 1
            self.events.append(ToolReturned(s) if not chain else SampleCapped(s))
        else:
            rid2 = self.next_rid
            self.next_rid += 1
            version = self.version + 1 if self.updating else self.version
            s.submit_version = version
            self.inflight[rid2] = s
            if cap is not None:
                self._cap[rid2] = cap
            if place is not None:
                self._place[rid2] = place
            self._send((s,), rid2, cap, version, place)
        self._tool_clock(now)
        return s

    def _tool_clock(self, now: float) -> None:
        """Tell the ledger whether every sample in flight now waits on a tool call (the
        engines have nothing to do: `tool_wait_s`)."""
        tools = len(self._tools)
        waiting = tools > 0 and len(self.inflight) == tools
        if waiting != self._tool_waiting:
            self._tool_waiting = waiting
            self.ledger.tool_wait(waiting, now)

    def _finish(self, s: Sample, now: float) -> None:
        """A sample reached its end: DONE, its events, the group countdown (`request_ended` inlines
        it)."""
        s.status = _DONE
        s.complete = True
        s.finish_s = now
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

    def abort_landed(self, key: int, ended: Iterable[Ended], now: float) -> None:
        """Abort `key` (an `Abort` command) landed at `now` with `ended`: credit them; the
        unfinished come back in one SamplesReturned. An abort asked for after one still on its
        way is heard after that one lands (`drain`)."""
        self.now = now
        if not self._aborts or key not in self._aborts:
            raise SchedulerError(f"abort {key} landed, but no such abort is on its way")
        if self._aborts[0] != key:  # aborts land in the order asked for
            self._early[key] = list(ended)
            return
        self._land(ended)

    def _land(self, ended: Iterable[Ended]) -> None:
        """The oldest abort on its way lands: SamplesReturned; held sends go once nothing holds."""
        key = self._aborts.popleft()
        covered = self._covered.pop(key, None)
        self.events.append(SamplesReturned(tuple(self._credit_all(ended, covered))))
        self._release()

    def sync_aborted(self, ended: Iterable[Ended], now: float) -> None:
        """A weight sync stopped these requests at `now` (interrupting: once its abort landed;
        a pause: those that ended by then); the unfinished come back after the sync."""
        self.now = now
        covered, self._sync.covered = self._sync.covered, []
        self._sync.returned += self._credit_all(ended, covered or None)
        self._sync.landing = False
        later, self._sync.tools_after = self._sync.tools_after, []
        for rid in later:
            self.tool_done(rid, now)

    def _credit_all(self, ended: Iterable[Ended], covered: list[int] | None) -> list[Sample]:
        """Credit what an abort or a sync brought back, and end the held sends it `covered`
        (never sent: no token), in the order the requests were sent (request id), whatever
        order the engines gave; the driver's trace hook hears the driver's own."""
        returned: list[Sample] = []
        hook = self.on_ended
        items: list[Ended] = list(ended)
        own: set[int] = set()
        if covered:
            own = set(covered)
            self._unsent -= own
            items += [RequestEnd(rid, 0, "abort", self.now) for rid in covered]
        self._returning = True  # an episode that ended its turn comes back with its tool call
        try:
            for c in sorted(items, key=_rid):
                s = self.request_ended(c.rid, c.tokens, c.reason, c.time)  # finished first: then
                if hook is not None and c.rid not in own:
                    hook(c, s)
                ep = s.episode
                if c.reason == "abort" or (ep is not None and ep.calling
                                           and s.status is _PARTIAL):
                    returned.append(s)
        finally:
            self._returning = False
        return returned

    def weights_synced(self, now: float) -> None:
        """The engines hold the new weights: WeightsUpdated, then the samples the sync returned;
        the sends held during the sync go."""
        self.now = now
        self.version += 1
        self.updating = False
        self.events.append(WeightsUpdated(self.version))
        returned, self._sync.returned = self._sync.returned, []
        if returned:
            self.events.append(SamplesReturned(tuple(returned)))
        self._release()

    def request_failed(self, rid: int, tokens: int, error: str, now: float) -> Sample:
        """Request `rid` failed at `now` without being asked to (live faults): keep its partial
        output and send the rest again at once, transparently to the scheduler (or finish or
        cap it)."""
        self.now = now
        s = self.inflight.pop(rid)
        cap = self._cap.pop(rid, None)
        place = self._place.pop(rid, None)
        s.add_tokens(tokens, s.submit_version)
        target = s._target_len
        done = (self._reveal is not None and self._reveal(s, "failed")) if target is None \
            else s.generated >= target
        if done:  # the partial output was the whole response after all
            self._finish(s, now)
            return s
        ep = s.episode
        if ep is not None and s.generated >= ep._ends[ep.turn]:  # it had ended its turn
            self._turn_ended(s, (None if cap is None else cap - tokens, place, True), now)
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
            self._send((s,), rid2, left, version, place)
        except BaseException:  # no engine left to take it: it stays in the buffer
            self.inflight.pop(rid2, None)
            self._cap.pop(rid2, None)
            self._place.pop(rid2, None)
            s.status = _PARTIAL
            self.ledger.n_partial += 1
            raise
        return s

    # ------------------------------------------------------------------ the scheduler
    def drain(self, now: float) -> tuple[Command, ...]:
        """Hand every queued event to the scheduler, one at a time, and carry out its actions;
        return the commands to carry out now, in order (module docstring): the tool calls begun,
        the batches handed over, then at most one abort or sync. The driver carries them out
        (reporting what they bring back) and drains again, until nothing is returned."""
        self.now = now
        if self._draining:
            return _NO_COMMANDS
        self._draining = True
        events, ctx, handle, apply = self.events, self.ctx, self.scheduler.handle, self._apply
        try:
            while True:
                while events:
                    ev = events.popleft()
                    ctx.version = self.version
                    ctx.in_flight = len(self.inflight)
                    for action in handle(ev, ctx):
                        apply(action)
                    while self._empty_aborts:  # nothing was in flight: landed after the list
                        self._empty_aborts -= 1
                        events.append(SamplesReturned(()))
                if not self._early or self._aborts[0] not in self._early:
                    break
                # the next abort in order had landed already: heard after the reaction to the last
                self._land(self._early.pop(self._aborts[0]))
        finally:
            self._draining = False
        if self.timers or self._batches or self._io or (self._want_batch and self._closed):
            return self._commands()
        return _NO_COMMANDS

    def _commands(self) -> tuple[Command, ...]:
        """What `drain` returns: the tool calls begun (timers: they run whatever else is on
        its way), the batches handed over, the colocated batch once nothing is in flight, then
        the next engine I/O (one: what it brings back is heard before the next)."""
        if self._want_batch and self._closed and not self.inflight:
            self._want_batch = False
            self._batches.append(BatchReady(self._closed.pop(0)))
        if not self._batches and not self._io and not self.timers:
            return _NO_COMMANDS
        out, self._batches = self._batches, []
        if self.timers:  # the tool calls first (the list is never rebound: drivers hold it)
            out[:0] = self.timers
            self.timers.clear()
        if self._io:
            out.append(self._io.popleft())
        return tuple(out)

    def _apply(self, action: Action) -> None:
        """Carry out one scheduler action: its handler by type (`ACTION_HANDLERS`)."""
        handler = ACTION_HANDLERS.get(type(action))
        if handler is None:  # a subclass of an action is that action
            handler = next((ACTION_HANDLERS[c] for c in type(action).__mro__
                            if c in ACTION_HANDLERS), None)
            if handler is None:
                raise SchedulerError(f"unknown action {action!r}")
        handler(self, action)

    def _on_submit(self, action: Submit) -> None:
        if action.max_new_tokens is not None and action.max_new_tokens < 1:
            raise SchedulerError("Submit.max_new_tokens must be >= 1")
        place = None
        if action.priority or action.route is not None or action.keep_kv:
            place = Placement(action.priority, action.route, action.keep_kv)
        if not self.paused:
            samples: Sequence[Sample] = action.samples
            if self.ledger.agentic:  # an episode's pending tool call runs first
                samples = self._call_pending(samples, action.max_new_tokens, place)
            self.submit(samples, action.max_new_tokens, place)
            return
        for s in action.samples:  # held back until ResumeGeneration: checked now
            if s.status is not _PENDING and s.status is not _PARTIAL:
                check(s, _RUNNING)
        self._paused.extend((s, action.max_new_tokens, place) for s in action.samples)

    def _on_abort(self, action: AbortAll) -> None:
        """Abort what is in flight: the driver's requests (an `Abort` command, after the
        reaction) and the sends still held here (ended unsent when it lands)."""
        if not self.inflight:
            self._empty_aborts += 1
            return
        key = self._next_abort
        self._next_abort += 1
        covered = self._cover_held()
        rids = self._sent_rids()
        if self._tools:  # tool calls running are cancelled: they come back with the abort
            self.tools_cancelled += len(self._tools)
            covered += self._tools
            self._tools.clear()
            self._tool_clock(self.now)
        if covered:
            self._covered[key] = covered
        self._aborts.append(key)
        self._io.append(Abort(key, rids))

    def _cover_held(self) -> list[int]:
        """An abort takes the held sends with it: their request ids (they are never sent)."""
        covered = [r for samples, rid0, _, _, _ in self._held
                   for r in range(rid0, rid0 + len(samples))]
        self._held = []
        return covered

    def _sent_rids(self) -> tuple[int, ...]:
        """The requests in flight the driver was given, in the order sent (tool calls are no
        engine's requests)."""
        unsent, tools = self._unsent, self._tools
        if not unsent and not tools:
            return tuple(self.inflight)
        return tuple(r for r in self.inflight if r not in unsent and r not in tools)

    def _on_update(self, action: UpdateWeights) -> None:
        if self.colocated:
            raise SchedulerError(
                "UpdateWeights in colocated mode: the runtime syncs after training")
        if self.updating:
            raise SchedulerError("UpdateWeights while a weight update is in progress")
        self.updating = True
        rids: tuple[int, ...] = ()
        if action.interrupt:
            self._sync.landing = True
            self._sync.covered = self._cover_held()
            rids = self._sent_rids()
        self._io.append(SyncWeights(action.interrupt, rids))

    def _on_pause(self, action: PauseGeneration) -> None:
        self.paused = True
        self.ledger.pause(self.now)

    def _on_resume(self, action: ResumeGeneration) -> None:
        self.paused = False
        self.ledger.resume(self.now)
        held, self._paused = self._paused, []
        by_cap: dict[tuple[int | None, Placement | None], list[Sample]] = {}
        for s, cap, place in held:
            by_cap.setdefault((cap, place), []).append(s)
        for (cap, place), samples in by_cap.items():
            self.submit(self._call_pending(samples, cap, place), cap, place)

    def _on_call_tools(self, action: CallTools) -> None:
        """Run the pending tool calls of these episodes; each comes back in `ToolReturned`."""
        for s in action.samples:
            ep = s.episode
            if ep is None or not ep.calling or s.status is not _PARTIAL:
                raise SchedulerError(f"CallTools: sample {s.uid} has no tool call pending")
        for s in action.samples:
            self.ledger.n_partial -= 1
            s.status = _RUNNING  # PARTIAL -> RUNNING: lifecycle.DIRECT
            self._start_tool(s, (None, None, False), self.now)

    def _on_close(self, action: CloseBatch) -> None:
        self._close_batch(action.groups)

    def _on_discard(self, action: Discard) -> None:
        self._discard(action.samples)

    def submit(self, samples: Sequence[Sample], cap: int | None = None,
               place: Placement | None = None) -> None:
        """PENDING or PARTIAL samples become RUNNING under the current version (the next one
        during a weight sync) and go to the driver in one `send` (with `place` where set), or
        wait here while an abort or a sync holds sends (`_holding`)."""
        if self.finished or not samples:
            return
        ledger, inflight, caps = self.ledger, self.inflight, self._cap
        version = self.version + 1 if self.updating else self.version
        rid0 = rid = self.next_rid
        now = self.now
        for s in samples:
            st = s.status
            if st is _PARTIAL:  # the table's sources of RUNNING (lifecycle.DIRECT); any other
                ledger.n_partial -= 1  # status is asked of the table, which raises
            elif st is not _PENDING:
                check(s, _RUNNING)
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
        if place is not None:
            self._place.update((r, place) for r in range(rid0, rid))
        self._send(samples, rid0, cap, version, place)

    def _call_pending(self, samples: Sequence[Sample], cap: int | None,
                      place: Placement | None) -> Sequence[Sample]:
        """Of submitted `samples`, the episodes whose tool call is pending (an abort cancelled
        it, or came at the turn's end) become RUNNING and run it (again), their next turn after
        it (under `cap`); returns the others, to submit as usual."""
        pending = [s for s in samples if s.status is _PARTIAL and s.episode is not None
                   and s.episode.calling]
        if not pending:
            return samples
        version = self.version + 1 if self.updating else self.version
        for s in pending:
            self.ledger.n_partial -= 1
            if s.generated:
                self.ledger.resumed(s.generated)
            s.status = _RUNNING  # PARTIAL -> RUNNING: lifecycle.DIRECT
            s.submits += 1
            s.submit_version = version
            self._start_tool(s, (cap, place, True), self.now)
        ids = {id(s) for s in pending}
        return [s for s in samples if id(s) not in ids]

    def _holding(self) -> bool:
        """The hold rule: sends wait while an abort is on its way or a weight sync is on."""
        return bool(self._aborts) or self.updating

    def _send(self, samples: Sequence[Sample], rid0: int, cap: int | None, version: int,
              place: Placement | None) -> None:
        """Hand a submission to the driver, or hold it while I/O is on its way (`_holding`)."""
        if self._tool_waiting:  # the engines have work again
            self._tool_clock(self.now)
        if self._holding():
            self._held.append((samples, rid0, cap, version, place))
            self._unsent.update(range(rid0, rid0 + len(samples)))
            return
        if place is None:
            self.sender.send(samples, rid0, cap, version)
        else:
            self.sender.send(samples, rid0, cap, version, place)

    def _release(self) -> None:
        """Nothing holds sends any more: the held ones go, in the order they were submitted."""
        if not self._held or self._holding():
            return
        held, self._held = self._held, []
        for samples, rid0, cap, version, place in held:
            self._unsent.difference_update(range(rid0, rid0 + len(samples)))
            self._send(samples, rid0, cap, version, place)

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

    def _train(self, groups: Sequence[Group]) -> None:
        """Every sample of `groups` is TRAINED (each was DONE, as the table asks), and groups
        all trained now are let go (unless `keep_groups`)."""
        for g in groups:
            for s in g.samples:
                if s.status is not _DONE:
                    check(s, _TRAINED)
        for g in groups:
            for s in g.samples:
                s.status = _TRAINED
        if self.keep_groups:
            return
        registered = self.groups
        for g in groups:
            if registered.get(g.gid) is g:  # all of it trained just now: nothing to check
                self.ledger.retire_trained(g)
                del registered[g.gid]
            else:
                self._retire_if_over(g.gid)

    def _close_batch(self, groups: Sequence[Group]) -> None:
        self._train(groups)
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
        self._batches.append(BatchReady(batch))
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
        self._tools.pop(rid, None)  # a tool call the end stopped: it runs again if resumed
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
        what was still in flight when the run ended (those samples are counted partial or done).
        Call it once the driver has stopped what it sent (`final_ended`): what is left in flight
        was never sent (held behind I/O, or no engine was left) and stops with no token."""
        self.finished = True
        for rid in list(self.inflight):
            self.final_ended(rid, 0, "abort")
        self._held, self._unsent = [], set()
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


# the scheduler's actions and what the core does with each (`RolloutCore._apply`)
ACTION_HANDLERS: Final[dict[type, Callable[[RolloutCore, Any], None]]] = {
    Submit: RolloutCore._on_submit,
    CloseBatch: RolloutCore._on_close,
    AbortAll: RolloutCore._on_abort,
    Discard: RolloutCore._on_discard,
    UpdateWeights: RolloutCore._on_update,
    PauseGeneration: RolloutCore._on_pause,
    ResumeGeneration: RolloutCore._on_resume,
    CallTools: RolloutCore._on_call_tools,
}
