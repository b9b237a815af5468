"""The conformance suite on the live runner: every registered scheduler and option variant and the
example user scheduler, unchanged, on bundled engines in-process (ledger, max length, each one's
promise)."""

from __future__ import annotations

import functools

import pytest
from runner_helpers import assert_batches, assert_ledger, run_local, tiny_scenario
from sched_helpers import USER_SCHEDULER, every_variant, variant_ids

USER = USER_SCHEDULER
# every registered scheduler and option variant (the registry's) and the user one, then options
# sized to the tiny lengths (a 12-token budget caps; the registry's 600 does not at 48 tokens)
CASES: list[tuple[str, dict]] = every_variant() + [
    ("april", {"token_budget": 12}),
    ("fully_async", {"eta": 1, "interrupt": True}),
    ("seer", {"chunk": 12, "hold": True}),  # pieces of 12 tokens, priorities over HTTP
    ("seer", {"chunk": 12, "route": "router", "migrate_kv": True}),  # live: re-prefills
]
IDS = variant_ids(CASES)


@functools.cache
def _case(i: int):
    name, settings = CASES[i]
    return run_local(tiny_scenario(), name, settings or None)


@pytest.fixture(params=range(len(CASES)), ids=IDS)
def case(request):
    return request.param


def _max_staleness(r) -> int:
    return max((k for s in r.steps for k, v in s.staleness.items() if v), default=0)


def test_ledger_and_batches(case):
    c = _case(case)
    assert_ledger(c)
    assert_batches(c)


def test_promises(case):
    name, settings = CASES[case]
    c = _case(case)
    r = c.run.result
    summary = r.summary()
    if name in ("sync", "dynamic_sampling", "tail_batching", "seer", "seer_history", USER):
        assert _max_staleness(r) == 0
    if name == "async_one_step":
        assert set(r.steps[0].staleness) == {0}
        assert all(set(s.staleness) == {1} for s in r.steps[1:])
    if name == "fully_async":
        assert _max_staleness(r) <= settings.get("eta", 4)
    if name == "april" and not settings:
        # the only discards: groups completing with the N-th, which slime drops (surplus="drop")
        dropped = sum(s.scheduler_stats.get("dropped_groups", 0) for s in r.steps)
        assert r.end_state["samples_discarded"] == dropped * c.scenario.group_size
    if "token_budget" in settings:
        for g in c.run.runtime.groups.values():
            for s in g.samples:
                assert all(seg.tokens <= settings["token_budget"] for seg in s.segments)
    if name in ("dynamic_sampling", "april_ds"):
        flat = sum(g.reward_std() <= 0 for b in c.spy.batches for g in b)
        kept = sum(s.scheduler_stats.get("kept_insufficient", 0) for s in r.steps)
        assert flat <= kept if settings.get("keep_when_insufficient") else flat == 0
    # the same JSON keys as the simulator's summary
    from aprilsim.sim.run import simulate

    assert list(summary) == list(simulate(c.scenario, "sync", steps=1).summary())
