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
