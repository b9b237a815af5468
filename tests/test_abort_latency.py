"""An abort lands no earlier than `abort_latency_s` after it is sent (the client's confirmation:
closing streams or POST /abort_request, then asking until nothing runs), whatever the engine
family's own rule; validate measures it on the live traces' abort spans."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
from pydantic import ValidationError

from aprilsim.config import scenario_from_dict
from aprilsim.metrics.trace import PhaseSpan, Trace
from aprilsim.sim.run import simulate
from aprilsim.validate.abort_latency import abort_spans, measured_abort_latency

BASE = {
    "name": "abort-latency", "seed": 1, "steps": 3, "batch_size": 8, "group_size": 4,
    "max_response_len": 4096, "cluster": {"engines": 2},
    "lengths": {"family": "lognormal", "mu": 6.5, "sigma": 0.9},
    "schedulers": {"april": {"ratio": 2.0}},
}
LATENCY = 0.5


def _run(scheduler: str, latency: float | None, family: str = "sglang"):
    d = copy.deepcopy(BASE)
    d["cluster"]["family"] = family
    if latency is not None:
        d["cluster"]["abort_latency_s"] = latency
    return simulate(scenario_from_dict(d), scheduler)


@pytest.mark.parametrize("family", ["sglang", "vllm"])
def test_an_abort_lands_its_latency_after_it_is_sent_and_cuts_the_same_tokens(family):
    base, slow = _run("april", None, family), _run("april", LATENCY, family)
    a, b = base.steps[0], slow.steps[0]
    # the same abort, the same tokens back: only its confirmation comes later; the family's own
    # rule (the step in flight, abort_steps more) takes less than the latency, so the step's
    # rollout grows by the latency less the time that rule took (one engine step or two)
    assert (a.generated_tokens, a.trained_tokens) == (b.generated_tokens, b.trained_tokens)
    grew = b.rollout_time_s - a.rollout_time_s
    assert LATENCY - 0.2 < grew <= LATENCY + 1e-9, grew


def test_without_an_abort_the_latency_changes_nothing():
    assert _run("sync", None).summary() == _run("sync", LATENCY).summary()


def test_a_negative_latency_is_refused():
    spec = scenario_from_dict(copy.deepcopy(BASE)).engine_spec()
    with pytest.raises(ValueError, match="abort_latency_s"):
        replace(spec, abort_latency_s=-1.0)
    d = copy.deepcopy(BASE)
    d["cluster"]["abort_latency_s"] = -0.1
    with pytest.raises((ValidationError, ValueError), match="abort_latency_s"):
        scenario_from_dict(d)


def test_the_measured_latency_is_the_median_of_the_live_abort_spans():
    tr = Trace(scheduler="april", n_engines=1, source="live")
    tr.phases += [PhaseSpan("rollout", 0, 0.0, 1.0), PhaseSpan("abort", 0, 0.9, 0.95),
                  PhaseSpan("abort", 1, 1.9, 1.93), PhaseSpan("abort", 2, 2.9, 2.98)]
    assert abort_spans([tr, None]) == pytest.approx([0.05, 0.03, 0.08])
    assert measured_abort_latency([tr]) == pytest.approx(0.05)
    assert measured_abort_latency([Trace(scheduler="sync", n_engines=1)]) is None


def test_engines_step_on_until_a_posted_abort_reaches_them():
    """`abort_delivery_s`: the engines run until the abort arrives, then the family's rule: more
    tokens come back and the step ends later than with the abort there at once."""
    d = copy.deepcopy(BASE)
    base = simulate(scenario_from_dict(d), "april")
    d["cluster"]["abort_delivery_s"] = 0.2
    late = simulate(scenario_from_dict(d), "april")
    a, b = base.steps[0], late.steps[0]
    assert b.generated_tokens > a.generated_tokens
    assert b.rollout_time_s >= a.rollout_time_s + 0.2 - 0.1
    # a family that lands aborts at once has no step to wait for: refused, by name
    d["cluster"]["abort_steps"] = -1
    with pytest.raises((ValidationError, ValueError), match="abort_delivery_s"):
        scenario_from_dict(d).engine_spec()


@pytest.mark.parametrize(("family", "send"), [("sglang", 0.003), ("bundled", 0.003),
                                              ("sglang", 0.15)])
def test_the_client_knobs_together_run_alike_on_the_fast_and_the_reference_engine(family, send):
    """Sends one at a time, a posted abort's delivery and its confirmation (at 0.15 s a send,
    APRIL's aborts catch requests still on their way: `test_client_send`): both engines give
    the same run, step for step."""
    from sched_helpers import run
    from test_whole_run_equivalence import _assert_same_run

    from aprilsim.engine.reference import ReferenceEngine

    d = copy.deepcopy(BASE)
    d["cluster"].update(family=family, client_overhead_s=0.004, client_send_s=send,
                        abort_delivery_s=0.006, abort_latency_s=0.02)
    sc = scenario_from_dict(d)
    for name in ("april", "async_one_step"):
        fast = run(sc, name)
        ref = run(sc, name, engine_factory=ReferenceEngine)
        _assert_same_run(fast, ref)
        assert all(s.trained_groups == BASE["batch_size"] for s in fast.result.steps)


def test_the_delivery_is_the_delay_that_fits_the_most_aborts():
    from aprilsim.validate.abort_latency import delivery_bounds, measured_abort_delivery

    tr = Trace(scheduler="april", n_engines=2, source="live")
    tr.phases += [PhaseSpan("abort", 0, 1.0, 1.05), PhaseSpan("abort", 1, 2.0, 2.05)]
    step = {"phase": "decode"}
    # abort 1: engine 0 ran one step after it (ending 1.004: the arrival came by then), engine 1
    # two (the one ending 1.001 ended before it arrived); abort 2: one step each
    rows = [[{**step, "t_run": t} for t in (0.99, 1.004, 1.99, 2.010)],
            [{**step, "t_run": t} for t in (0.985, 1.001, 1.021, 1.99, 2.003)]]
    got = delivery_bounds(tr, rows, 0)
    assert [tuple(round(x, 6) for x in b) for b in got] == [
        (0.0, 0.004), (0.001, 0.021), (0.0, 0.01), (0.0, 0.003)]
    d = measured_abort_delivery([(tr, rows)], 0)
    assert 0.001 < d <= 0.003  # inside all four
    assert measured_abort_delivery([(tr, [[], []])], 0) is None  # no step seen: not measured
    # with abort_steps 1 the step in flight is the one before the last
    assert delivery_bounds(tr, rows, 1) == [(0.0, pytest.approx(0.001))]


def test_the_client_knobs_at_users_scale_run_alike_on_both_engines():
    """The default scenario (16k cap, SGLang's decaying ratio, 4 engines) with KV binding at
    150,000 tokens an engine and every client knob on: the fast and the reference engine give the
    same APRIL run, and the regime is reached (retractions, aborts)."""
    from sched_helpers import run
    from test_whole_run_equivalence import _assert_same_run

    from aprilsim.config import load_scenario, with_overrides
    from aprilsim.engine.reference import ReferenceEngine

    sc = with_overrides(load_scenario(None), steps=3, warmup=None)
    sc = sc.model_copy(update={"cluster": sc.cluster.model_copy(update={
        "client_overhead_s": 0.01, "client_send_s": 0.002, "abort_delivery_s": 0.03,
        "abort_latency_s": 0.05, "kv_capacity": 150_000})})
    fast = run(sc, "april")
    _assert_same_run(fast, run(sc, "april", engine_factory=ReferenceEngine))
    assert sum(s.retractions for s in fast.result.steps) > 100
    assert sum(s.scheduler_stats.get("aborted", 0) + s.partial_samples
               for s in fast.result.steps) > 0
