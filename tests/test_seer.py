"""Length-aware scheduling (issue 21): the Submit vocabulary it needs (priority, route, pieces),
the `seer` and `seer_history` schedulers, and the repeating dataset their history keys on."""

from __future__ import annotations

import pytest
from sched_helpers import small_scenario
from test_rollout_core import Groups, Meter, Scripted

from aprilsim.conformance import check_scheduler
from aprilsim.engine.cost import CostModel, EngineSpec
from aprilsim.engine.fast import FastEngine
from aprilsim.engine.request import Request
from aprilsim.policies.base import (
    MOST_ROOM,
    CloseBatch,
    GroupFinished,
    PauseGeneration,
    ResumeGeneration,
    RolloutStarted,
    SchedulerError,
    Submit,
)
from aprilsim.policies.registry import make_scheduler
from aprilsim.rollout import RolloutCore
from aprilsim.rollout.ports import Placement
from aprilsim.sim.build import build_simulation
from aprilsim.workload.generator import Workload
from aprilsim.workload.lengths import Parametric


class PlacedSink:
    """Records each send with its placement."""

    def __init__(self) -> None:
        self.sent: list[tuple[list[int], int | None, Placement | None]] = []

    def send(self, samples, first_rid, cap, version, place=None):
        self.sent.append(([s.uid for s in samples], cap, place))


def _core(react):
    sink = PlacedSink()
    core = RolloutCore(scheduler=Scripted(react), groups=Groups([30, 40]), batch_size=1, steps=1,
                       max_len=100, group_size=2, meter=Meter(), sender=sink,
                       expected_length=lambda step: 35.0)
    return core, sink


def test_submit_priority_and_route_reach_the_driver_only_when_set():
    def react(ev, ctx):
        if isinstance(ev, RolloutStarted):
            a, b = ctx.new_groups(1)[0].samples
            return [Submit((a,)), Submit((b,), 7, priority=3, route=MOST_ROOM)]
    core, sink = _core(react)
    core.start_rollout(0, 0.0)
    core.drain(0.0)
    assert sink.sent == [([0], None, None), ([1], 7, Placement(3, MOST_ROOM))]


def test_placement_survives_a_pause():
    def react(ev, ctx):
        if isinstance(ev, RolloutStarted):
            a, b = ctx.new_groups(1)[0].samples
            return [PauseGeneration(), Submit((a,), priority=2, route=1), Submit((b,)),
                    ResumeGeneration()]
    core, sink = _core(react)
    core.start_rollout(0, 0.0)
    core.drain(0.0)
    assert sorted(sink.sent, key=lambda x: x[0]) == [([0], None, Placement(2, 1)),
                                                     ([1], None, None)]


SPEC = EngineSpec(CostModel(a=0.005, b=1e-4, c=2e-7, p0=0.01, p1=1e-5, p2=0.0),
                  kv_capacity=4_000, max_running=8)


def _sim(router_scheduler, engines=3):
    sc = small_scenario(engines=engines, batch=2, group=3, steps=2, kv=20_000)
    return build_simulation(sc, router_scheduler)


class _Route:
    """Submits the step's samples with a fixed route, then trains on the batch."""

    name = "route"
    mode = "colocated"

    def __init__(self, route) -> None:
        self.route, self.done = route, []

    def handle(self, ev, ctx):
        if isinstance(ev, RolloutStarted):
            self.done = []
            groups = ctx.new_groups(ctx.batch_size)
            return [Submit(tuple(s for g in groups for s in g.samples), route=self.route)]
        if isinstance(ev, GroupFinished):
            self.done.append(ev.group)
            if len(self.done) == ctx.batch_size:
                return [CloseBatch(tuple(self.done))]
        return ()

    def step_stats(self):
        return {}


def test_route_to_a_named_engine():
    sim = _sim(_Route(2))
    sim.run()
    assert sim.engines[2].tokens > 0 and sim.engines[0].tokens == sim.engines[1].tokens == 0


def test_route_to_an_unknown_engine_is_an_error():
    with pytest.raises(SchedulerError, match="no such engine"):
        _sim(_Route(5)).run()
    with pytest.raises(SchedulerError, match="most_room"):
        _sim(_Route("emptiest")).run()


def test_most_room_follows_free_kv_and_what_the_send_claims():
    """Routing by room: each request goes where free KV less the queue's input, less what this
    send put there already (input + the piece's max_new), is largest (ties: the lowest index)."""
    sim = _sim("sync", engines=2)
    core = sim.core
    g0, g1 = core.register(sim.workload.generate(2, 0))
    core.submit(g0.samples, None, Placement(0, 0))  # engine 0 holds group 0's prompts
    rooms = [e.room_at(0.0) for e in sim.engines]
    assert rooms[0] < rooms[1] == sim.engines[1].spec.kv_capacity
    core.submit(g1.samples, 500, Placement(0, MOST_ROOM))
    expect = []
    for smp in g1.samples:
        i = max(range(2), key=rooms.__getitem__)
        rooms[i] -= smp.prompt_len + 500
        expect.append(i)
    assert expect[0] == 1
    got = [sum(1 for r in [*e.waiting, *e.prefilling()] if r.rid >= 3) for e in sim.engines]
    assert got == [expect.count(0), expect.count(1)]


def test_room_counts_held_kv_and_queued_input():
    e = FastEngine(SPEC)
    assert e.room_at(0.0) == 4_000
    e.submit([Request(0, 500, 100, 100), Request(1, 300, 100, 100)], 0.0)
    held = e.progress_at(0.0)[2]
    assert e.room_at(0.0) == 4_000 - held - sum(r.input_len for r in e.waiting)
    assert e.room_at(0.0) < 4_000


# --------------------------------------------------------------------------- the schedulers
@pytest.mark.parametrize("name,settings", [
    ("seer", {}), ("seer_history", {}), ("seer", {"hold": True, "chunk": 300}),
])
def test_seer_passes_the_conformance_checks(name, settings):
    passed = check_scheduler(name, settings)
    assert "another_seed" in passed


class _Spy:
    """Wraps a scheduler and records every Submit it returns (with what its samples carried)."""

    def __init__(self, inner) -> None:
        self.inner, self.name, self.mode, self.submits = inner, inner.name, inner.mode, []
        self.carried: list[int] = []

    def handle(self, ev, ctx):
        out = list(self.inner.handle(ev, ctx))
        for a in out:
            if isinstance(a, Submit):
                self.submits.append((ctx.step, a))
                self.carried.append(max(s.generated for s in a.samples))
        return out

    def step_stats(self):
        return self.inner.step_stats()


def _run_spy(name, settings, **kw):
    spy = _Spy(make_scheduler(name, settings))
    sc = small_scenario(steps=3, **kw)
    res = build_simulation(sc, spy).run()
    return spy, res


def test_seer_probes_first_then_pieces_longest_first_on_policy():
    spy, res = _run_spy("seer", {"chunk": 400})
    first = [a for step, a in spy.submits if step == 0][:2]
    top = 3072 + 1
    assert first[0].priority == top and len(first[0].samples) == 6  # one probe per group
    assert {s.index for s in first[0].samples} == {0}
    assert first[1].priority == 0 and len(first[1].samples) == 6 * 3  # the rest, unknown yet
    assert all(a.max_new_tokens == 400 and a.route == MOST_ROOM for _, a in spy.submits)
    resent = [(a, c) for (_, a), c in zip(spy.submits, spy.carried) if c > 0]
    # a later piece's priority is its group's estimate: at least what its sample carried
    assert resent and all(a.priority >= c >= 400 for a, c in resent)
    assert len({a.priority for a, _ in resent}) > 1  # groups ranked by their estimates
    s = res.summary()
    assert s["offpolicy_token_fraction"] == 0.0 and s["max_staleness"] == 0
    assert sum(r.scheduler_stats.get("pieces_resent", 0) for r in res.steps) > 0


def test_seer_hold_waits_for_the_probe():
    spy, _ = _run_spy("seer", {"chunk": 400, "hold": True})
    step0 = [a for step, a in spy.submits if step == 0]
    assert len(step0[0].samples) == 6 and step0[0].priority == 3073
    assert all(len(a.samples) <= 3 for a in step0[1:])  # siblings go per group, once shown


def test_seer_history_uses_the_previous_epoch():
    """With a dataset of exactly one step of prompts, every group from step 1 on has history:
    no probe, all its samples at the prompt's earlier mean length."""
    sc = small_scenario(steps=3)
    sc = sc.model_copy(update={"workload": sc.workload.model_copy(update={"dataset_prompts": 6})})
    spy = _Spy(make_scheduler("seer_history", {"chunk": 0}))
    res = build_simulation(sc, spy).run()
    later = [a for step, a in spy.submits if step >= 1]
    assert later and all(len(a.samples) == 4 for a in later)  # whole groups, no probe
    assert all(0 < a.priority <= 3072 for a in later)
    assert [r.scheduler_stats.get("history_groups", 0) for r in res.steps] == [0, 6, 6]


def test_dataset_prompts_repeat_prompts_with_new_responses():
    w = Workload(Parametric("lognormal", {"mu": 6.0, "sigma": 0.8}), max_len=4096, group_size=4,
                 prompt_share=0.5, dataset_prompts=3, seed=1)
    a, b = w.generate(3, 0), w.generate(3, 1)
    assert [g.prompt_id for g in a] == [g.prompt_id for g in b] == [0, 1, 2]
    assert [g.prompt_len for g in a] == [g.prompt_len for g in b]
    assert [g._pass_rate for g in a] == [g._pass_rate for g in b]
    assert ([s._target_len for g in a for s in g.samples]
            != [s._target_len for g in b for s in g.samples])
    plain = Workload(Parametric("lognormal", {"mu": 6.0, "sigma": 0.8}), max_len=4096, group_size=4,
                     prompt_share=0.5, seed=1)
    c = plain.generate(3, 0)  # no dataset: every prompt new, the draws as before
    assert ([s._target_len for g in a for s in g.samples]
            == [s._target_len for g in c for s in g.samples])
    assert [g.prompt_id for g in plain.generate(3, 1)] == [3, 4, 5]


def test_migrated_kv_saves_the_re_prefill_and_nothing_else():
    """seer with simulated KV migration: the same responses, resumed pieces prefill only their
    last token over the KV that came with them, so fewer prefill tokens and a shorter run."""
    sc = small_scenario(steps=3)
    plain = build_simulation(sc, "seer", settings={"chunk": 300, "migrate_kv": False})
    moved = build_simulation(sc, "seer", settings={"chunk": 300})  # migration: the default
    a, b = plain.run(), moved.run()
    assert a.summary()["generated_tokens"] == b.summary()["generated_tokens"]
    assert sum(e.stats.migrated_tokens for e in plain.engines) == 0
    assert sum(e.stats.migrated_tokens for e in moved.engines) > 0
    pa = sum(e.stats.prefill_tokens for e in plain.engines)
    pb = sum(e.stats.prefill_tokens for e in moved.engines)
    assert pb < pa
    assert b.total_time_s < a.total_time_s


@pytest.mark.parametrize("name", ["seer", "seer_history"])
def test_placed_sends_record_the_queue_wait(name):
    """A placed send (priority, route) lets the engine stamp a sample's first scheduling, as the
    router's send does: every trained sample has its queue wait, and each step reports it."""
    sim = build_simulation(small_scenario(steps=3), name)
    res = sim.run()
    trained = [s for g in sim.groups.values() for s in g.samples if s.finish_s >= 0]
    assert trained and all(0 <= s.first_submit_s <= s.start_s <= s.finish_s for s in trained)
    for rec in res.steps:
        assert (rec.queue_wait_p50_s is not None
                and 0 <= rec.queue_wait_p50_s <= rec.queue_wait_p99_s)
