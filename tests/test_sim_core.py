"""The simulated RL loop with sync and APRIL: gains, conservation, token accounting, limits."""

from __future__ import annotations

import json
from collections import Counter

from hypothesis import event, given, settings
from hypothesis import strategies as st

from aprilsim.config import load_scenario, scenario_from_dict
from aprilsim.conformance import small_scenario
from aprilsim.engine.reference import ReferenceEngine
from aprilsim.policies.registry import make_scheduler
from aprilsim.sim.run import simulate
from aprilsim.sim.runtime import Simulation
from aprilsim.types import SampleStatus


def scenario(seed=0, engines=2, batch=6, group=4, max_len=3000, kv=None, steps=4, ratio=2.0,
             recycle=True):
    cluster = {} if kv is None else {"kv_capacity": kv, "new_token_ratio": 0.0}
    return small_scenario(
        name="scenario", seed=seed, steps=steps, batch=batch, group=group, max_len=max_len,
        engines=engines, cluster=cluster, lengths={"family": "lognormal", "mu": 6.3, "sigma": 1.0},
        schedulers={"april": {"ratio": ratio, "recycle": recycle}})


class LedgerSim(Simulation):
    """Snapshots where every token is at the end of each rollout (nothing is in flight then)."""

    def _end_rollout(self, groups):
        rec = super()._end_rollout(groups)
        by = {st: 0 for st in SampleStatus}
        for g in self.groups.values():
            for s in g.samples:
                by[s.status] += s.generated
        self.snapshots = getattr(self, "snapshots", [])
        self.snapshots.append((sum(e.tokens for e in self.engines), dict(by)))
        return rec


def run_ledger(sc, name):
    sim = LedgerSim(
        workload=sc.workload_for(),
        engine=sc.engine_spec(),
        n_engines=sc.cluster.engines,
        scheduler=make_scheduler(name, sc.settings_for(name)),
        batch_size=sc.batch_size,
        steps=sc.steps,
        trainer=sc.trainer_model(),
    )
    return sim, sim.run()


def test_april_beats_sync_on_the_default_scenario():
    sc = load_scenario(None)
    sync = simulate(sc, "sync", steps=4).summary()
    run = simulate(sc, "april", steps=4)
    april = run.summary()
    assert april["rollout_throughput_tok_s"] > 1.2 * sync["rollout_throughput_tok_s"]
    assert april["mean_step_time_s"] < sync["mean_step_time_s"]
    assert sync["offpolicy_token_fraction"] == 0.0 and april["offpolicy_token_fraction"] > 0.0
    # the only waste: groups completing in the N-th's wake-up, which slime drops (surplus="drop")
    dropped = sum(s.scheduler_stats["dropped_groups"] for s in run.steps[run.warmup_steps:])
    assert april["discarded_samples"] == dropped * sc.group_size


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    name=st.sampled_from(["sync", "april"]),
    ratio=st.sampled_from([1.0, 1.5, 2.0, 3.0]),
    recycle=st.booleans(),
    tight_kv=st.booleans(),
)
def test_samples_and_tokens_are_conserved_per_step(seed, name, ratio, recycle, tight_kv):
    """generated = trained + buffered + wasted after every rollout, and every sample is
    somewhere."""
    sc = scenario(seed=seed, ratio=ratio, recycle=recycle, kv=4000 if tight_kv else None)
    sim, run = run_ledger(sc, name)
    trained = wasted = 0
    for rec, (engine_tokens, by) in zip(run.steps, sim.snapshots, strict=True):
        trained += rec.trained_tokens
        wasted += rec.wasted_tokens
        assert by[SampleStatus.RUNNING] == 0
        assert by[SampleStatus.TRAINED] == trained
        assert by[SampleStatus.DISCARDED] == wasted
        buffered = by[SampleStatus.PARTIAL] + by[SampleStatus.DONE] + by[SampleStatus.PENDING]
        assert engine_tokens == trained + buffered + wasted
    end = run.end_state
    statuses = [k for k in end if k.startswith("samples_") and k != "samples_created"]
    assert sum(end[k] for k in statuses) == sum(g.size for g in sim.groups.values())
    assert end["engine_tokens"] == sum(v for k, v in end.items() if k.startswith("tokens_"))
    if name == "april" and recycle:  # discards: only the groups slime drops (with the N-th)
        dropped = sum(r.scheduler_stats["dropped_groups"] for r in run.steps)
        assert end["samples_discarded"] == dropped * sc.group_size
    assert all(r.kv_peak_tokens <= sc.engine_spec().kv_capacity for r in run.steps)
    for g in sim.groups.values():
        for s in g.samples:
            assert s.generated <= s._target_len <= sc.max_response_len
            assert sum(seg.tokens for seg in s.segments) == s.generated
            if s.finished:
                assert s.generated == s._target_len


def test_resumed_samples_carry_their_tokens_and_finish_at_their_length():
    sc = scenario(seed=11, ratio=3.0, steps=5)
    sim, run = run_ledger(sc, "april")
    resumed = [s for g in sim.groups.values() for s in g.samples if len(s.segments) > 1]
    assert resumed, "APRIL at ratio 3 should resume some partial samples"
    for s in resumed:
        versions = [seg.version for seg in s.segments]
        assert versions == sorted(versions)
        assert s.generated <= s.max_len
    assert sum(r.resumed_tokens for r in run.steps) > 0


def test_april_without_recycling_discards_and_counts_waste():
    sc = scenario(seed=3, ratio=2.0, recycle=False)
    s = simulate(sc, "april").summary()
    assert s["wasted_tokens"] > 0 and s["discarded_samples"] > 0
    assert s["offpolicy_token_fraction"] == 0.0


def test_retractions_happen_under_a_tight_kv_cache():
    sc = scenario(seed=1, kv=4000, batch=8)
    assert simulate(sc, "sync").summary()["retractions"] > 0


def test_same_scenario_and_seed_give_identical_json():
    sc = scenario(seed=5)
    a = json.dumps([simulate(sc, n).summary() for n in ("sync", "april")])
    b = json.dumps([simulate(sc, n).summary() for n in ("sync", "april")])
    assert a == b


def test_reference_engine_gives_the_same_run():
    """The whole simulation with the per-iteration engine agrees with the fast one."""
    sc = scenario(seed=9, kv=5000, steps=3)
    fast = simulate(sc, "april").summary()
    ref = simulate(sc, "april", engine_factory=ReferenceEngine).summary()
    for k in ("generated_tokens", "trained_tokens", "retractions", "kv_peak_tokens"):
        assert fast[k] == ref[k], k
    assert abs(fast["total_time_s"] - ref["total_time_s"]) < 1e-6 * ref["total_time_s"]


def test_metrics_are_consistent():
    s = simulate(scenario(seed=2), "sync").summary()
    assert 0 < s["engine_busy_fraction"] <= 1
    assert 0 < s["efficiency_vs_ideal"] <= 1
    assert s["generated_tokens"] == s["trained_tokens"]
    assert s["mean_step_time_s"] > s["mean_rollout_time_s"]
    assert s["staleness_histogram"] == {"0": s["trained_tokens"]}


def test_per_engine_busy_fractions_average_to_the_total():
    s = simulate(scenario(seed=4, engines=3), "april").summary()
    per = s["engine_busy_fraction_by_engine"]
    assert len(per) == 3 and all(0 < b <= 1 for b in per)
    assert abs(sum(per) / 3 - s["engine_busy_fraction"]) < 1e-9


def test_routers():
    """Round robin cycles; least loaded fills the emptiest engine first (ties: lowest index)."""
    from aprilsim.engine.router import LeastLoaded, RoundRobin, make_router

    rr = RoundRobin()
    assert [rr.pick([0, 0, 0]) for _ in range(5)] == [0, 1, 2, 0, 1]
    ll = LeastLoaded()
    loads = [3, 1, 1]
    picks = []
    for _ in range(4):
        i = ll.pick(loads)
        loads[i] += 1
        picks.append(i)
    assert picks == [1, 2, 1, 2] and loads == [3, 3, 3]
    sc = scenario_from_dict(
        {**_BASE, "cluster": {"engines": 3, "router": "least_loaded"}, "schedulers": {}}
    )
    s = simulate(sc, "sync").summary()
    assert s["trained_samples"] == (sc.steps - sc.warmup_steps) * sc.batch_size * sc.group_size
    try:
        make_router("random")
    except ValueError as e:
        assert "least_loaded" in str(e)
    else:
        raise AssertionError("unknown router accepted")


TAKES: Counter[str] = Counter()


@settings(max_examples=200, deadline=None, derandomize=True)
@given(start=st.integers(0, 5_000), sends=st.lists(st.integers(1, 300), min_size=1, max_size=8),
       engines=st.integers(1, 4_096))
def _takes_match_picks(start, sends, engines):
    from aprilsim.engine.router import RoundRobin

    one, many = RoundRobin(_next=start), RoundRobin(_next=start)
    loads = [0] * engines
    for count in sends:
        first = many.take(count, engines)
        assert [one.pick(loads) for _ in range(count)] == [(first + j) % engines
                                                          for j in range(count)]
        assert one._next == many._next
        reach = f"a send {'wraps round' if count > engines else 'fits in'} the cluster"
        event(reach)
        TAKES[reach] += 1


def test_round_robin_takes_a_whole_send_as_its_picks_would():
    """`RoundRobin.take` (the simulator's send: one call, each engine's requests a slice) places
    every request where one `pick` per request would, and leaves the router where they would,
    on up to 4,096 engines (the user's regime), for sends that wrap round the cluster and sends
    that do not (both reached, counted)."""
    TAKES.clear()
    _takes_match_picks()
    assert TAKES["a send wraps round the cluster"] >= 20
    assert TAKES["a send fits in the cluster"] >= 100


_BASE = {
    "seed": 1,
    "steps": 2,
    "batch_size": 6,
    "group_size": 4,
    "max_response_len": 3000,
    "lengths": {"family": "lognormal", "mu": 6.3, "sigma": 1.0},
    "prompts": {"family": "lognormal", "mu": 4.5, "sigma": 0.5, "max_len": 512},
}


def test_group_affinity_keeps_a_group_on_one_engine():
    """A group's first request goes to the least loaded engine, its later ones follow it; every
    group of a simulated run lands on a single engine (resumed partials included)."""
    from aprilsim.engine.router import GroupAffinity
    from aprilsim.metrics.trace import Trace

    ga = GroupAffinity()
    loads = [2, 0, 1]
    assert [ga.pick(loads, 7), ga.pick([0, 5, 0], 7), ga.pick([0, 5, 0], 8)] == [1, 1, 0]
    assert ga.pick([4, 1, 3]) == 1  # no group: by load
    sc = scenario_from_dict(
        {**_BASE, "cluster": {"engines": 3, "router": "group_affinity"}, "schedulers": {}}
    )
    trace = Trace(scheduler="april", n_engines=3)
    simulate(sc, "april", trace=trace)
    homes: dict[int, set[int]] = {}
    for r in trace.requests:
        homes.setdefault(r.group_id, set()).add(r.engine)
    assert homes and all(len(e) == 1 for e in homes.values())
    assert len({next(iter(e)) for e in homes.values()}) == 3  # and groups spread over engines
    assert any(r.carried > 0 for r in trace.requests)  # resumed partials reached


def test_group_hash_places_by_group_whatever_the_order_of_sends():
    """Engine = group mod engines for every order of the same sends (round robin, fed the same
    sends in two orders, places them differently); an APRIL run keeps each group on its engine."""
    from aprilsim.engine.router import GroupHash, RoundRobin
    from aprilsim.metrics.trace import Trace

    groups = [5, 2, 9, 2, 5, 7, 0, 9]
    for order in (groups, list(reversed(groups)), sorted(groups)):
        gh = GroupHash()
        assert {g: gh.pick([0, 0, 0], g) for g in order} == {g: g % 3 for g in groups}
    rr_a, rr_b = RoundRobin(), RoundRobin()
    assert ({g: rr_a.pick([0, 0, 0], g) for g in groups}
            != {g: rr_b.pick([0, 0, 0], g) for g in reversed(groups)})
    gh = GroupHash()
    assert [gh.pick([9, 0]), gh.pick([9, 0]), gh.pick([9, 0])] == [0, 1, 0]  # no group: in turn
    sc = scenario_from_dict({**_BASE, "cluster": {"engines": 3, "router": "group_hash"},
                             "schedulers": {}})
    trace = Trace(scheduler="april", n_engines=3)
    simulate(sc, "april", trace=trace)
    assert trace.requests and all(r.engine == r.group_id % 3 for r in trace.requests)
