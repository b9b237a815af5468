"""Random small scenarios: every scheduler keeps the ledger and its staleness promise."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sched_helpers import run, small_scenario

from aprilsim.policies.registry import REGISTRY
from aprilsim.types import SampleStatus

STALENESS_BOUND = {"sync": 0, "async_one_step": 1, "fully_async": 4, "dynamic_sampling": 0,
                   "tail_batching": 0}

scenarios = st.builds(
    lambda engines, batch, group, max_len, seed, ab: small_scenario(
        engines=engines, batch=batch, group=group, max_len=max_len, steps=3, seed=seed,
        alpha=ab, beta=ab,
    ),
    engines=st.integers(1, 3),
    batch=st.integers(2, 6),
    group=st.integers(2, 5),
    max_len=st.sampled_from([1024, 2048, 4096]),
    seed=st.integers(0, 10_000),
    ab=st.sampled_from([0.3, 1.0]),
)


@pytest.mark.parametrize("name", sorted(REGISTRY))
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sc=scenarios)
def test_random_scenarios(name, sc):
    settings_ = {"on_cap": "train"} if name == "dynamic_sampling" else {}
    r = run(sc, name, settings_)
    end = r.result.end_state
    assert end["samples_created"] == sum(end[f"samples_{s.value}"] for s in SampleStatus)
    assert end["engine_tokens"] == sum(end[f"tokens_{s.value}"] for s in SampleStatus)
    assert len(r.spy.batches) == sc.steps
    for g in r.sim.groups.values():
        for s in g.samples:
            assert s.generated <= min(s._target_len, sc.max_response_len)
    lags = [k for rec in r.result.steps for k, v in rec.staleness.items() if v]
    if name in STALENESS_BOUND:
        assert max(lags, default=0) <= STALENESS_BOUND[name]
    if name == "april":
        assert end["samples_discarded"] == 0
    if name in ("april_ds", "dynamic_sampling"):
        assert all(g.reward_std() > 0 for b in r.spy.batches for g in b)
