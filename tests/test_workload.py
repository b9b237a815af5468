"""Length models, capping, per-prompt structure, rewards and drift of the workload generator."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aprilsim.workload.drift import LinearDrift, TableDrift
from aprilsim.workload.generator import RewardModel, Workload
from aprilsim.workload.lengths import (
    Empirical,
    LognormalMixture,
    Parametric,
    cap_lengths,
    length_model_from_dict,
)

MODELS = [
    Parametric("lognormal", {"mu": 7.0, "sigma": 1.0}),
    Parametric("gamma", {"shape": 2.0, "scale": 500.0}),
    Parametric("weibull", {"shape": 1.2, "scale": 1000.0}),
    Parametric("loglogistic", {"shape": 3.0, "scale": 900.0}),
    Parametric("gengamma", {"a": 2.0, "c": 0.8, "scale": 300.0}),
    LognormalMixture((0.6, 0.4), (6.0, 8.5), (0.5, 0.7)),
    Empirical((10, 20, 20, 50, 400, 9000)),
]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.family)
def test_frozen_model_contract(model):
    """ppf inverts cdf, sf = 1 - cdf, the dict form round-trips, sample means match."""
    q = np.linspace(0.01, 0.99, 41)
    x = model.ppf(q)
    assert np.all(np.diff(x) >= 0)
    if model.family != "empirical":
        np.testing.assert_allclose(model.cdf(x), q, atol=1e-8)
        np.testing.assert_allclose(model.sf(x), 1 - model.cdf(x), atol=1e-12)
    else:  # the empirical law is its values: count them instead of trusting sf = 1 - cdf
        v = np.asarray(model.values, float)
        pts = np.array([5.0, 10.0, 20.0, 49.0, 50.0, 400.0, 8999.0, 9000.0, 1e5])
        np.testing.assert_allclose(model.cdf(pts), [(v <= p).mean() for p in pts], atol=0)
        np.testing.assert_allclose(model.sf(pts), [(v > p).mean() for p in pts], atol=0)
    again = length_model_from_dict(model.to_dict())
    np.testing.assert_allclose(again.ppf(q), x, rtol=1e-12)
    draws = model.rvs(200_000, np.random.default_rng(0))
    assert abs(draws.mean() / model.mean() - 1) < 0.03


@pytest.mark.parametrize(
    "bad",
    [
        {"family": "lognormal", "mu": 7.0, "sigma": -1.0},
        {"family": "gamma", "shape": 2.0},
        {"family": "weibull", "shape": 1.0, "scale": 1.0, "loc": 3.0},
        {"family": "nope", "x": 1.0},
        {"family": "lognormal_mixture", "weights": [1, 1], "mus": [1.0], "sigmas": [1.0, 1.0]},
        {"family": "empirical", "values": [-3, 4]},
        {"mu": 1.0},
    ],
)
def test_bad_parameters_raise_value_error(bad):
    with pytest.raises(ValueError):
        length_model_from_dict(bad)


@given(st.lists(st.floats(-10, 1e6, allow_nan=False), min_size=1, max_size=50),
       st.integers(1, 5000))
def test_capping_gives_integers_in_range(xs, max_len):
    out = cap_lengths(np.array(xs), max_len)
    assert out.dtype.kind == "i"
    assert np.all((out >= 1) & (out <= max_len))
    assert np.all(out[np.array(xs) >= max_len] == max_len)


def _workload(**kw):
    base = dict(lengths=Parametric("lognormal", {"mu": 7.0, "sigma": 1.0}), max_len=8192,
                group_size=8)
    base.update(kw)
    return Workload(**base)


def test_same_seed_same_groups_other_seed_other_groups():
    a = [(s._target_len, s._reward) for g in _workload(seed=3).generate(50) for s in g.samples]
    b = [(s._target_len, s._reward) for g in _workload(seed=3).generate(50) for s in g.samples]
    c = [(s._target_len, s._reward) for g in _workload(seed=4).generate(50) for s in g.samples]
    assert a == b and a != c


def test_truncated_samples_hit_the_cap():
    w = _workload(max_len=1000)
    samples = [s for g in w.generate(500) for s in g.samples]
    capped = [s for s in samples if s._target_len >= 1000]
    expected = float(Parametric("lognormal", {"mu": 7.0, "sigma": 1.0}).sf(999))
    assert abs(len(capped) / len(samples) - expected) < 0.03
    assert all(s._target_len == 1000 for s in capped)
    assert all(s._target_len <= 1000 for s in samples)


@pytest.mark.parametrize("share", [0.0, 0.3, 0.7])
def test_prompt_share_is_the_between_prompt_share_of_log_variance(share):
    """For a lognormal the copula makes `prompt_share` exactly the between-prompt variance share."""
    w = _workload(prompt_share=share, max_len=10**9, group_size=16, seed=1)
    logs = np.log([[s._target_len for s in g.samples] for g in w.generate(3000)])
    within = logs.var(axis=1, ddof=1).mean()
    total = logs.var()
    assert abs((1 - within / total) - share) < 0.04


def test_hard_prompts_are_long_and_mostly_wrong():
    w = _workload(rewards=RewardModel(1.0, 1.0, difficulty_length_corr=0.8), prompt_share=0.5,
                  seed=2)
    groups = w.generate(3000)
    mean_log_len = np.array([np.log([s._target_len for s in g.samples]).mean() for g in groups])
    pass_rate = np.array([g._pass_rate for g in groups])
    reward = np.array([np.mean([s._reward for s in g.samples]) for g in groups])
    assert np.corrcoef(mean_log_len, pass_rate)[0, 1] < -0.4
    assert np.corrcoef(pass_rate, reward)[0, 1] > 0.6


def test_drift_scales_lengths_by_step():
    lin = _workload(drift=LinearDrift(0.01), max_len=10**9, seed=5)
    early = np.mean([s._target_len for g in lin.generate(400, step=0) for s in g.samples])
    late = np.mean([s._target_len for g in lin.generate(400, step=100) for s in g.samples])
    assert 1.7 < late / early < 2.3
    table = TableDrift((0, 100, 200), (500, 1000, 1500))
    assert table.scale(0) == 1.0 and table.scale(150) == 2.5 and table.scale(10_000) == 3.0
    with pytest.raises(ValueError):
        TableDrift((0, 0), (1, 2))


def test_expected_length_matches_the_capped_mean():
    w = _workload(max_len=2000, seed=7)
    sampled = np.mean([s._target_len for g in w.generate(4000) for s in g.samples])
    assert abs(w.expected_length(0) / sampled - 1) < 0.02


@pytest.mark.parametrize("k", [1, 2, 3, 5, 7, 9])
def test_mixture_newton_pass_is_bit_for_bit_its_pdf_and_cdf(k):
    """`LognormalMixture.ppf`'s one-pass (pdf, cdf) relies on numpy summing a short last axis left
    to right; a numpy that changes that order fails here instead of moving every drawn length."""
    rng = np.random.default_rng(k)
    w = rng.dirichlet(np.ones(k))
    mix = LognormalMixture(tuple(w.tolist()), tuple(rng.uniform(4, 10, k).tolist()),
                           tuple(rng.uniform(0.2, 1.5, k).tolist()))
    x = np.concatenate([[0.0, 1e-300, 1.0], np.exp(rng.uniform(0, 14, 2000))])
    with np.errstate(invalid="ignore"):  # 0 / 0 at x = 0, in both (masked to a density of 0)
        pdf, cdf = mix._pdf_cdf(x)
        assert pdf.tobytes() == mix.pdf(x).tobytes()
        assert cdf.tobytes() == mix.cdf(x).tobytes()
