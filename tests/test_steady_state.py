"""The summary's steady-state check: a short APRIL run is not settled, a long one is."""

from __future__ import annotations

import random

import pytest

from aprilsim.config import load_scenario
from aprilsim.metrics.records import StepRecord
from aprilsim.metrics.steady import steady_state, trend
from aprilsim.sim.run import simulate


def _steps(tput: list[float], buffer: list[float]) -> list[StepRecord]:
    return [StepRecord(step=i, rollout_start_s=0.0, rollout_time_s=1.0, generated_tokens=int(t),
                       partial_samples=int(b)) for i, (t, b) in enumerate(zip(tput, buffer))]


def test_trend_recovers_a_line():
    slope, se = trend([3.0 + 0.5 * i for i in range(10)])
    assert slope == pytest.approx(0.5) and se == pytest.approx(0.0, abs=1e-12)


def test_flat_noise_settles_a_drift_does_not_too_few_steps_cannot():
    rng = random.Random(0)
    flat = _steps([10_000 * (1 + rng.gauss(0, 0.005)) for _ in range(40)], [200.0] * 40)
    assert steady_state(flat)["settled"]
    drifting = _steps([10_000 * (1 - 0.01 * i) for i in range(40)], [200.0] * 40)
    out = steady_state(drifting)
    assert not out["settled"] and out["throughput_drift_per_10_steps"] < -0.09
    assert "throughput" in out["unsettled_reason"]
    filling = _steps([10_000.0] * 40, [100.0 + 5 * i for i in range(40)])
    assert "buffer" in steady_state(filling)["unsettled_reason"]
    assert not steady_state(flat[:3])["settled"]


def test_the_default_scenarios_april_run_settles_only_when_long():
    sc = load_scenario(None)
    short = simulate(sc, "april", steps=10).summary()
    assert not short["settled"] and short["unsettled_reason"]
    long = simulate(sc, "april", steps=60).summary(warmup=10)
    assert long["settled"], long["unsettled_reason"]
    assert abs(long["throughput_drift_per_10_steps"]) < 0.03
