"""The sans-I/O rollout core on its own: a recording sender, a fake meter, no engine, no clock.

What both drivers inherit from it: the sample life cycle (every status change legal, illegal ones
raise), the decided semantics of AbortAll, Submit during a weight sync, the hold and landing
rules of engine I/O (sends wait behind an abort or a sync; aborts land in the order asked for),
completeness and truncation, and the ledger's conservation.
"""

from __future__ import annotations

import dataclasses
import typing
from collections import Counter
from dataclasses import dataclass, field

import pytest
from hypothesis import event, example, given, settings, target
from hypothesis import strategies as st

from aprilsim.policies.base import (
    AbortAll,
    Action,
    CloseBatch,
    Discard,
    GroupFinished,
    PauseGeneration,
    ResumeGeneration,
    RolloutStarted,
    SampleCapped,
    SampleFinished,
    SamplesReturned,
    SchedulerError,
    Submit,
    TrainStepDone,
    UpdateWeights,
    WeightsUpdated,
)
from aprilsim.rollout import Abort, BatchReady, Reading, RolloutCore, SyncWeights
from aprilsim.rollout.core import ACTION_HANDLERS
from aprilsim.rollout.lifecycle import DIRECT, LEGAL
from aprilsim.types import Group, Sample, SampleStatus

S = SampleStatus


@dataclass(frozen=True)
class End:
    rid: int
    tokens: int
    reason: str
    time: float = 0.0


class Meter:
    def __init__(self) -> None:
        self.tokens = 0

    def read(self, now: float) -> Reading:
        return Reading(self.tokens, [now], 0, 0)

    def new_window(self, now: float) -> None:
        pass

    def engine_tokens(self) -> int:
        return self.tokens


@dataclass
class Sink:
    """A driver with no engine: records every send, carries out the core's commands (an abort,
    or an interrupting sync's abort, lands at once with nothing generated when `land_now`, else
    it waits for the test to land it) and drains until the core returns none."""

    land_now: bool = True
    sent: list[tuple[list[int], int | None, int]] = field(default_factory=list)
    aborts: list[Abort] = field(default_factory=list)
    syncs: list[bool] = field(default_factory=list)
    batches: list[tuple[Group, ...]] = field(default_factory=list)
    core: RolloutCore | None = None

    def send(self, samples, first_rid, cap, version):
        self.sent.append(([first_rid + j for j in range(len(samples))], cap, version))

    def drain(self, now: float) -> None:
        cmds = self.core.drain(now)
        while cmds:
            for cmd in cmds:
                self.carry_out(cmd, now)
            cmds = self.core.drain(now)

    def carry_out(self, cmd, now: float) -> None:
        if isinstance(cmd, BatchReady):
            self.batches.append(cmd.batch)
        elif isinstance(cmd, Abort):
            self.aborts.append(cmd)
            if self.land_now:
                self.core.abort_landed(cmd.key, [End(r, 0, "abort", now) for r in cmd.rids], now)
        else:
            assert isinstance(cmd, SyncWeights)
            self.syncs.append(cmd.interrupt)
            ended = [End(r, 0, "abort", now) for r in cmd.rids] if cmd.interrupt else []
            self.core.sync_aborted(ended, now)


class Groups:
    """Groups of `size` samples with the given hidden target lengths (None: free generation)."""

    def __init__(self, targets: list[int | None], max_len: int = 100) -> None:
        self.targets, self.max_len, self.gid, self.uid = targets, max_len, 0, 0

    def new_groups(self, n, step, group_size=None):
        out = []
        for _ in range(n):
            samples = [Sample(self.uid + i, self.gid, i, 10, t, self.max_len, 1.0)
                       for i, t in enumerate(self.targets)]
            self.uid += len(samples)
            out.append(Group(self.gid, 10, samples, step, 0.5))
            self.gid += 1
        return out

    def regenerate(self, groups, step, group_size):
        return self.new_groups(len(groups), step)


class Scripted:
    """A scheduler whose reaction to each event is `react(event, ctx)`; records what it saw."""

    name = "scripted"

    def __init__(self, react, mode="colocated") -> None:
        self.react, self.mode, self.seen = react, mode, []

    def handle(self, ev, ctx):
        self.seen.append((ev, ctx.in_flight))
        return self.react(ev, ctx) or ()

    def step_stats(self):
        return {}


def make(react, *, mode="colocated", targets=(30, 40), land_now=True, reveal=None, steps=2):
    sink = Sink(land_now=land_now)
    sched = Scripted(react, mode)
    core = RolloutCore(scheduler=sched, groups=Groups(list(targets)), batch_size=1, steps=steps,
                       max_len=100, group_size=len(targets), meter=Meter(), sender=sink,
                       expected_length=lambda step: 35.0, reveal=reveal)
    sink.core = core
    return core, sink, sched


def first_group(core: RolloutCore) -> list[Sample]:
    return next(iter(core.groups.values())).samples


def submit_on_start(ev, ctx):
    if ev.__class__.__name__ == "RolloutStarted":
        return [Submit(tuple(s for g in ctx.new_groups(1) for s in g.samples))]
    return ()


# ------------------------------------------------------------------------------ life cycle
def test_a_request_that_ends_at_its_target_finishes_its_sample_and_group():
    core, sink, sched = make(submit_on_start)
    core.start_rollout(0, 0.0)
    sink.drain(0.0)
    (rids, cap, version), = sink.sent
    a, b = first_group(core)
    assert (a.status, b.status, cap, version) == (S.RUNNING, S.RUNNING, None, 0)
    core.request_ended(rids[0], 30, "stop", 1.0)
    core.request_ended(rids[1], 40, "length", 1.0)
    kinds = [type(e) for e in core.events]
    assert kinds == [SampleFinished, SampleFinished, GroupFinished]
    assert a.status is S.DONE and a.complete and a.segments[0].version == 0


def test_a_group_counts_down_once_per_sample_and_finishes_once():
    """The core's countdown per registered group (`types.GroupCountdown`): shared by its
    samples, one less per finish, GroupFinished when it reaches zero, and only then."""
    core, sink, _ = make(submit_on_start, targets=(30, 40, 50))
    core.start_rollout(0, 0.0)
    sink.drain(0.0)
    (rids, _, _), = sink.sent
    samples = first_group(core)
    countdown = samples[0].countdown
    assert countdown is not None and all(s.countdown is countdown for s in samples)
    left = []
    for rid, tokens in zip(rids, (30, 40, 50)):
        core.request_ended(rid, tokens, "stop", 1.0)
        left.append((countdown.left, sum(isinstance(e, GroupFinished) for e in core.events)))
    assert left == [(2, 0), (1, 0), (0, 1)]
    assert [e.group for e in core.events if isinstance(e, GroupFinished)] == [
        next(iter(core.groups.values()))]
    # not an argument of the sample: a replaced copy is a new, unregistered sample
    copy = dataclasses.replace(samples[0], generated=1)
    assert copy.countdown is None and copy.generated == 1 and samples[0].countdown is countdown


def test_a_sample_of_a_group_never_registered_cannot_finish():
    """A scheduler that submits samples it built itself, not drawn through `ctx.new_groups`:
    the core has no countdown for their group and says so (before: a bare KeyError)."""
    def react(ev, ctx):
        if ev.__class__.__name__ == "RolloutStarted":
            return [Submit((Sample(900, 77, 0, 10, 30, 100, 1.0),))]
        return ()

    core, sink, _ = make(react)
    core.start_rollout(0, 0.0)
    sink.drain(0.0)
    (rids, _, _), = sink.sent
    with pytest.raises(SchedulerError, match="group 77 was never registered"):
        core.request_ended(rids[0], 30, "stop", 1.0)


def test_ended_short_of_its_target_is_capped_not_finished():
    core, sink, _ = make(lambda ev, ctx: submit_on_start(ev, ctx) and [Submit(
        tuple(s for g in ctx.new_groups(1) for s in g.samples), max_new_tokens=5)])
    core.start_rollout(0, 0.0)
    sink.drain(0.0)
    rids, cap, _ = sink.sent[0]
    assert cap == 5
    s = core.request_ended(rids[0], 5, "length", 1.0)
    assert s.status is S.PARTIAL and not s.complete and isinstance(core.events[-1], SampleCapped)
    assert core.ledger.n_partial == 1


@pytest.mark.parametrize("bad", ["resubmit_running", "discard_running", "close_unfinished"])
def test_illegal_moves_raise(bad):
    def react(ev, ctx):
        if ev.__class__.__name__ == "RolloutStarted":
            samples = tuple(s for g in ctx.new_groups(1) for s in g.samples)
            group = next(iter(core.groups.values()))
            follow = {"resubmit_running": Submit(samples[:1]),
                      "discard_running": Discard(samples[:1]),
                      "close_unfinished": CloseBatch((group,))}[bad]
            return [Submit(samples), follow]
        return ()

    core, sink, _ = make(react)
    core.start_rollout(0, 0.0)
    with pytest.raises(SchedulerError,
                       match="cannot (submit|discard|train) sample 0 in status running"):
        sink.drain(0.0)


def test_training_a_group_twice_raises():
    done: list[Group] = []

    def react(ev, ctx):
        if isinstance(ev, GroupFinished):
            done.append(ev.group)
            return [CloseBatch((ev.group,)), CloseBatch((ev.group,))]
        return submit_on_start(ev, ctx)

    core, sink, _ = make(react)
    core.start_rollout(0, 0.0)
    sink.drain(0.0)
    for rid in sink.sent[0][0]:
        core.request_ended(rid, 40, "stop", 1.0)
    with pytest.raises(SchedulerError, match=r"cannot train sample \d+ in status trained"):
        sink.drain(1.0)


# -------------------------------------------------------------------------- the decided divergences
@pytest.mark.parametrize("land_now", [True, False])
def test_abort_all_samples_stay_in_flight_until_the_list_ends(land_now):
    """Decision 1: after AbortAll, the rest of the same list sees the samples RUNNING; they come
    back in one SamplesReturned after the list, whether the abort landed at once or later."""
    seen: list[list[SampleStatus]] = []

    def react(ev, ctx):
        if ev.__class__.__name__ == "RolloutStarted":
            return submit_on_start(ev, ctx)
        if isinstance(ev, SampleFinished):
            return [AbortAll(), PauseGeneration(), ResumeGeneration()]
        if isinstance(ev, SamplesReturned):
            seen.append([s.status for s in ev.samples])
        return ()

    core, sink, sched = make(react, land_now=land_now)
    core.start_rollout(0, 0.0)
    sink.drain(0.0)
    rids = sink.sent[0][0]
    core.request_ended(rids[0], 30, "stop", 1.0)
    sink.drain(1.0)
    assert len(sink.aborts) == 1
    if not land_now:
        assert core.inflight and first_group(core)[1].status is S.RUNNING
        core.abort_landed(sink.aborts[0].key, [End(rids[1], 7, "abort", 2.0)], 2.0)
        sink.drain(2.0)
    assert seen == [[S.PARTIAL]]
    assert first_group(core)[1].generated == (0 if land_now else 7)


def test_a_discard_right_after_abort_all_is_an_error_in_every_driver():
    """The observable half of decision 1 (tests/test_rollout_drivers.py runs it on both drivers)."""
    def react(ev, ctx):
        if ev.__class__.__name__ == "RolloutStarted":
            return submit_on_start(ev, ctx)
        if isinstance(ev, SampleFinished):
            other = [s for s in first_group(core) if s.status is S.RUNNING]
            return [AbortAll(), Discard(tuple(other))]
        return ()

    core, sink, _ = make(react)
    core.start_rollout(0, 0.0)
    sink.drain(0.0)
    core.request_ended(sink.sent[0][0][0], 30, "stop", 1.0)
    with pytest.raises(SchedulerError, match="cannot discard sample 1 in status running"):
        sink.drain(1.0)


def test_submit_during_a_weight_sync_runs_at_once_under_the_new_version():
    """Decision 2: a Submit while weights sync makes the samples RUNNING at once, stamped with
    the new version, counted in flight; the driver starts them once the weights are loaded."""
    def react(ev, ctx):
        if ev.__class__.__name__ == "RolloutStarted" and ctx.step == 0:
            return submit_on_start(ev, ctx)
        if isinstance(ev, TrainStepDone):
            return [UpdateWeights(interrupt=False),
                    Submit(tuple(s for g in ctx.new_groups(1) for s in g.samples))]
        return ()

    core, sink, sched = make(react, mode="disaggregated")
    core.start_rollout(0, 0.0)
    sink.drain(0.0)
    core.train_done(0, 1.0)
    sink.drain(1.0)
    assert sink.syncs == [False] and core.updating
    new = [r for r in core.inflight if r >= 2]
    assert new and all(core.inflight[r].status is S.RUNNING for r in new)
    assert all(core.inflight[r].submit_version == 1 for r in new)
    assert len(sink.sent) == 1  # held: they start under the new weights
    core.weights_synced(2.0)
    assert sink.sent[-1] == (new, None, 1)
    sink.drain(2.0)
    ev, in_flight = sched.seen[-1]
    assert isinstance(ev, WeightsUpdated) and in_flight == 4  # 2 from step 0, 2 from the sync


def test_completeness_without_a_known_target_asks_the_reveal_hook():
    """Decision 4: free generation (no hidden target) is decided by the driver's reveal hook,
    which then sets the truth; a known target decides alone (the hook is never asked)."""
    asked: list[tuple[int, str]] = []

    def reveal(s: Sample, how: str) -> bool:
        asked.append((s.uid, how))
        if how == "stop" or s.generated >= s.max_len:
            s._target_len = s.generated
            return True
        return False

    core, sink, _ = make(submit_on_start, targets=(None, None, 50), reveal=reveal)
    core.start_rollout(0, 0.0)
    sink.drain(0.0)
    r0, r1, r2 = sink.sent[0][0]
    a = core.request_ended(r0, 12, "stop", 1.0)
    b = core.request_ended(r1, 20, "length", 1.0)  # a token cap, the model did not stop
    c = core.request_ended(r2, 50, "length", 1.0)
    assert asked == [(a.uid, "stop"), (b.uid, "length")]
    assert (a.status, a._target_len, b.status, c.status) == (S.DONE, 12, S.PARTIAL, S.DONE)


def test_truncated_means_complete_at_max_len():
    """Decision 3: one definition (`Sample.truncated`), counted by the core's ledger."""
    def react(ev, ctx):
        if isinstance(ev, GroupFinished):
            return [CloseBatch((ev.group,))]
        return submit_on_start(ev, ctx)

    core, sink, _ = make(react, targets=(100, 40), steps=1)
    core.start_rollout(0, 0.0)
    sink.drain(0.0)
    for rid, n in zip(sink.sent[0][0], (100, 40), strict=True):
        core.request_ended(rid, n, "length", 1.0)
    sink.drain(1.0)
    rec = core.end_rollout(sink.batches[0], 2.0)
    assert rec.truncated_samples == 1 == sum(s.truncated for s in first_group(core))


# ------------------------------------------------------------------- engine I/O: holds and order
def abort_then_submit(ev, ctx):
    """Group A at the start; when its first sample finishes: AbortAll, then a fresh group B in
    the same list (its sends must wait for the abort); a TrainStepDone asks a second AbortAll."""
    if isinstance(ev, RolloutStarted):
        return submit_on_start(ev, ctx)
    if isinstance(ev, SampleFinished) and ev.sample.index == 0 and ev.sample.group_id == 0:
        return [AbortAll(), Submit(tuple(ctx.new_groups(1)[0].samples))]
    if isinstance(ev, TrainStepDone):
        return [AbortAll()]
    return ()


def test_sends_wait_while_an_abort_is_on_its_way():
    """The hold rule (`RolloutCore._holding`), with no driver: a Submit after AbortAll is taken
    at once (RUNNING, in flight) but sent only when the abort has landed, in submission order."""
    core, sink, _ = make(abort_then_submit, land_now=False)
    core.start_rollout(0, 0.0)
    sink.drain(0.0)
    (a_rids, _, _), = sink.sent
    core.request_ended(a_rids[0], 30, "stop", 1.0)
    sink.drain(1.0)
    (abort,) = sink.aborts
    assert abort.rids == (a_rids[1],)  # what the driver was given: B is not among it
    b_rids = [r for r in core.inflight if r not in a_rids]
    assert len(b_rids) == 2 and all(core.inflight[r].status is S.RUNNING for r in b_rids)
    assert len(sink.sent) == 1, "a send went out while the abort was on its way"
    core.abort_landed(abort.key, [End(a_rids[1], 7, "abort", 2.0)], 2.0)
    assert sink.sent[1:] == [(b_rids, None, 0)]  # sent once it landed (before the reaction)
    sink.drain(2.0)
    assert first_group(core)[1].generated == 7 and first_group(core)[1].status is S.PARTIAL


def test_an_abort_ends_the_sends_it_finds_held_and_aborts_land_in_order():
    """A second AbortAll while the first is on its way takes the held sends with it (never
    sent: no token); its landing, reported first, is heard after the first's and after the
    scheduler's reaction to it (so that reaction still sees those samples in flight)."""
    core, sink, sched = make(abort_then_submit, land_now=False)
    core.start_rollout(0, 0.0)
    sink.drain(0.0)
    (a_rids, _, _), = sink.sent
    core.request_ended(a_rids[0], 30, "stop", 1.0)
    sink.drain(1.0)
    core.train_done(0, 1.5)  # any event: the scripted scheduler asks AbortAll again
    sink.drain(1.5)
    first, second = sink.aborts
    b_rids = [r for r in core.inflight if r not in a_rids]
    core.abort_landed(second.key, [], 2.0)  # the engines were done with it first
    sink.drain(2.0)
    assert not [e for e, _ in sched.seen if isinstance(e, SamplesReturned)]
    core.abort_landed(first.key, [End(a_rids[1], 7, "abort", 3.0)], 3.0)
    sink.drain(3.0)
    returned = [(e, n) for e, n in sched.seen if isinstance(e, SamplesReturned)]
    assert [[s.uid for s in e.samples] for e, _ in returned] == [
        [core_uid(a_rids[1])], [core_uid(b_rids[0]), core_uid(b_rids[1])]]
    assert [n for _, n in returned] == [2, 0]  # B still in flight when A's return was heard
    assert len(sink.sent) == 1 and not core.inflight  # B was never sent
    assert all(s.status is S.PARTIAL and s.generated == 0 for s in returned[1][0].samples)


def core_uid(rid: int) -> int:
    """The uid of the sample request `rid` generates (Groups numbers them in submission order)."""
    return rid


def test_engine_io_waits_for_the_reaction_and_what_it_brings_back_is_heard_first():
    """`drain` returns at most one abort or sync at a time: an abort that landed at once is
    heard (and reacted to) before the sync asked for after it starts."""
    log: list[str] = []

    def react(ev, ctx):
        log.append(type(ev).__name__)
        if isinstance(ev, RolloutStarted) and ctx.step == 0:
            return submit_on_start(ev, ctx)
        if isinstance(ev, TrainStepDone):
            return [AbortAll(), UpdateWeights(interrupt=True)]
        return ()

    core, sink, _ = make(react, mode="disaggregated")
    core.start_rollout(0, 0.0)
    sink.drain(0.0)
    core.train_done(0, 1.0)
    cmds = core.drain(1.0)
    assert [type(c) for c in cmds] == [Abort]
    sink.carry_out(cmds[0], 1.0)
    log.append("--")
    cmds = core.drain(1.0)
    assert [type(c) for c in cmds] == [SyncWeights]
    assert log[-2:] == ["--", "SamplesReturned"]


def test_apply_has_one_handler_per_action_type():
    """`RolloutCore._apply`'s table: exactly the scheduler's action types, no more, no less."""
    assert set(ACTION_HANDLERS) == set(typing.get_args(Action))


def test_the_writes_the_core_makes_unchecked_are_legal():
    """The hot paths write without `check` where the in-flight map proves the source
    (`lifecycle.DIRECT`): each of those changes is in the life-cycle table."""
    assert DIRECT and all(b in LEGAL[a] for a, b in DIRECT)


# ----------------------------------------------------------------------------- property: life cycle
OPS = st.lists(st.tuples(st.sampled_from(["submit"] * 4 + ["end"] * 4 + [
    "cap_end", "cap_end", "abort", "discard", "discard_partial", "resubmit_partial", "close",
    "close", "pause"] + ["resume"] * 3), st.integers(0, 7), st.integers(0, 60)),
               min_size=1, max_size=60)


REACH: Counter[str] = Counter()


@settings(max_examples=250, deadline=None, derandomize=True)
@given(ops=OPS)
# the rarest edge, reached whatever hypothesis draws: a sample done, then discarded
@example(ops=[("submit", 0, 0), ("end", 0, 0), ("discard", 0, 0)])
def _life_cycle(ops):
    queue: list = []
    core, sink, _ = make(lambda ev, ctx: [queue.pop(0)] if queue and ev is not None else (),
                         targets=(20,), land_now=True, steps=10)
    groups = core.ctx.new_groups(8)
    samples = [s for g in groups for s in g.samples]
    counts: Counter[str] = Counter()
    for op, i, n in ops:
        s = samples[i % len(samples)]
        if op in ("discard_partial", "resubmit_partial"):  # a buffered sample, where there is one
            s = next((x for x in samples if x.status is S.PARTIAL), s)
        before = {x.uid: x.status for x in samples}
        try:
            if op in ("end", "cap_end"):  # the oldest request in flight ends (capped: short)
                if not core.inflight:
                    continue
                rid = min(core.inflight)
                x = core.inflight[rid]
                left = x._target_len - x.generated
                tokens = min(n, left - 1) if op == "cap_end" else left
                core.request_ended(rid, tokens, "length", 1.0)
            else:
                action = {"submit": Submit((s,), max_new_tokens=n or None), "abort": AbortAll(),
                          "discard": Discard((s,)), "discard_partial": Discard((s,)),
                          "resubmit_partial": Submit((s,)), "close": CloseBatch((next((g for g in groups if g.finished and all(
                              x.status is S.DONE for x in g.samples)), groups[i % 8]),)),
                          "pause": PauseGeneration(), "resume": ResumeGeneration()}[op]
                queue.append(action)
                core.events.append(SampleFinished(s))  # any event: the scheduler then acts
                sink.drain(float(len(counts)))
            counts[op] += 1
        except SchedulerError:
            counts["refused"] += 1
            REACH["refused"] += 1
            queue.clear()
        for x in samples:
            if x.status is not before[x.uid]:
                assert x.status in LEGAL[before[x.uid]], (before[x.uid], x.status)
                edge = f"{before[x.uid].value}->{x.status.value}"
                event(edge)
                REACH[edge] += 1
        assert set(core.inflight.values()) == {x for x in samples if x.status is S.RUNNING}
        assert core.ledger.n_partial == sum(x.status is S.PARTIAL for x in samples)
        assert all(x.generated <= x._target_len for x in samples)
    target(float(len({x.status for x in samples})), label="distinct statuses reached")
    event(f"refused {min(counts['refused'], 3)}+")


def test_every_status_change_is_legal_and_the_ledger_balances():
    """Random scheduler actions and engine ends: each status change the core makes is in LEGAL,
    an illegal request raises SchedulerError, and in flight / buffered counts stay exact; every
    legal change and a refusal are reached."""
    REACH.clear()
    _life_cycle()
    legal = {f"{a.value}->{b.value}" for a, tos in LEGAL.items() for b in tos}
    assert legal <= set(REACH), f"not reached: {legal - set(REACH)}"
    assert REACH["refused"] >= 10


def test_end_state_counts_what_the_end_of_the_run_stopped():
    """The end-of-run ledger: requests still in flight are stopped (partial, or done where they
    had reached their end) and reported as in flight at the end, with their tokens."""
    core, sink, _ = make(submit_on_start)
    core.start_rollout(0, 0.0)
    sink.drain(0.0)
    r0, r1 = sink.sent[0][0]
    core.finish()
    a = core.final_ended(r0, 30, "length")  # reached its target just as the run ended
    b = core.final_ended(r1, 5, "abort")
    core.ledger.meter.tokens = 35
    end = core.end_state()
    assert (a.status, b.status) == (S.DONE, S.PARTIAL)
    assert (end["in_flight_at_end"], end["in_flight_tokens_at_end"]) == (2, 35)
    assert (end["samples_done"], end["samples_partial"], end["engine_tokens"]) == (1, 1, 35)
    assert not core.inflight
    core.submit(first_group(core)[1:])  # nothing is sent once the run is over
    assert len(sink.sent) == 1


def test_a_tool_call_that_returns_while_a_syncs_abort_is_on_its_way_is_heard_when_it_lands():
    """The core, not the driver, holds a tool return behind an interrupting sync's abort: the
    episode's next turn starts only once the abort has landed (after what it brought back), as
    the live driver, busy carrying the abort out, would hear it."""
    from aprilsim.rollout.ports import ToolCall
    from aprilsim.types import Episode

    def react(ev, ctx):
        if isinstance(ev, RolloutStarted) and ctx.step == 0:
            return submit_on_start(ev, ctx)
        if isinstance(ev, TrainStepDone):
            return [UpdateWeights(interrupt=True)]
        return ()

    core, sink, _ = make(react, mode="disaggregated", targets=(30,), land_now=False)
    core.start_rollout(0, 0.0)
    cmds = core.drain(0.0)
    assert cmds == ()
    s = first_group(core)[0]
    s.episode = Episode([10, 30], [1.0], [5], 100)  # a turn of 10 tokens, a 1 s tool, 5 tokens
    (rid,), _, _ = sink.sent[0]
    core.request_ended(rid, 10, "stop", 0.5)  # the turn ends: its tool call starts
    (call,) = core.drain(0.5)
    assert isinstance(call, ToolCall) and core.tool_live(call.rid)
    core.train_done(0, 1.0)
    (sync,) = core.drain(1.0)
    assert isinstance(sync, SyncWeights) and sync.interrupt
    assert core.tool_done(call.rid, 1.5) is None  # the abort is still on its way
    assert s.episode.turn == 0 and s.episode.appended == 0 and core.tool_live(call.rid)
    core.sync_aborted([], 2.0)  # it lands: now the tool's tokens join and the next turn goes
    assert s.episode.turn == 1 and s.episode.appended == 5 and not core.tool_live(call.rid)
    assert core.tool_done(call.rid, 2.0) is None  # heard once
