"""Prompt split, drift, cap detection, goodness of fit, the sklearn-style API and the model file."""

from __future__ import annotations

import numpy as np
import pytest

from aprilsim.workload.drift import LinearDrift
from aprilsim.workload.fitting import Histogram, LengthData, LengthFitter, detect_cap
from aprilsim.workload.fitting.api import fit_log
from aprilsim.workload.fitting.drift_fit import DriftFitter
from aprilsim.workload.fitting.prompt_split import PromptSplit
from aprilsim.workload.generator import Workload
from aprilsim.workload.lengths import Parametric, cap_lengths
from aprilsim.workload.model_file import read_model_file

GAMMA = Parametric("gamma", {"shape": 1.5, "scale": 400.0})


def grouped(share: float, n_groups: int = 800, drift=None, steps: int = 1, seed: int = 0):
    kw = {} if drift is None else {"drift": drift}
    w = Workload(lengths=GAMMA, max_len=3000, prompt_share=share, group_size=8, seed=seed, **kw)
    rows = []
    for step in range(steps):
        for g in w.generate(n_groups // steps, step=step * 100):
            rows += [(s._target_len, s.group_id, step * 100) for s in g.samples]
    return np.array(rows).T


@pytest.mark.parametrize("share", [0.0, 0.3, 0.6])
def test_prompt_split_recovers_the_simulators_prompt_share(share):
    lengths, groups, _ = grouped(share)
    p = PromptSplit(n_bootstrap=100).fit(lengths, groups, GAMMA, 3000)
    assert abs(p.share_ - share) < 0.06
    assert p.ci_[0] - 0.02 <= share <= p.ci_[1] + 0.02
    assert p.n_groups_ == 800 and p.mean_group_size_ == 8.0


def test_grouped_fit_writes_prompt_share_that_round_trips(tmp_path):
    lengths, groups, _ = grouped(0.4)
    data = LengthData.from_array(lengths, groups=groups)
    rep = fit_log(data, max_len=3000, families=["gamma", "lognormal"], n_bootstrap=20)
    rep.write_model(tmp_path / "m.toml")
    mf = read_model_file(tmp_path / "m.toml")
    assert abs(mf.prompt_share - 0.4) < 0.06 and mf.max_len == 3000
    assert mf.lengths.family == "gamma"
    # the simulator fed with the fitted file reproduces the share it was fitted on
    w = Workload(lengths=mf.lengths, max_len=3000, prompt_share=mf.prompt_share, seed=9)
    gs = w.generate(800)
    l2 = np.array([s._target_len for g in gs for s in g.samples])
    g2 = np.array([s.group_id for g in gs for s in g.samples])
    assert abs(PromptSplit(n_bootstrap=0).fit(l2, g2, mf.lengths, 3000).share_ - 0.4) < 0.07


def test_drift_from_per_sample_steps_recovers_a_linear_slope(tmp_path):
    lengths, groups, steps = grouped(0.0, n_groups=2000, drift=LinearDrift(0.002), steps=10)
    data = LengthData.from_array(lengths, steps=steps)
    rep = fit_log(data, families=["gamma"], n_bootstrap=0, max_len=3000)
    d = rep.drift
    assert d.kind_ == "linear" and not d.is_curve_
    assert abs(d.linear_.slope - 0.002) < 0.0006  # capped means grow a little less than 0.2 %/step
    # the pooled model was moved to step 0: its mean is near the step-0 mean (600), far from the
    # pooled one (about 1,100); capping flattens the fitted slope, so the move falls a bit short
    pooled = LengthFitter(families=["gamma"], n_bootstrap=0, max_len=3000).fit(lengths).model_
    assert pooled.mean() > 1.5 * GAMMA.mean()
    assert abs(rep.model.mean() / GAMMA.mean() - 1) < 0.15
    rep.write_model(tmp_path / "m.toml")
    assert read_model_file(tmp_path / "m.toml").drift == LinearDrift(d.linear_.slope)


def test_drift_needs_three_steps():
    from aprilsim.workload.fitting import LengthDataError

    with pytest.raises(LengthDataError, match="3 or more distinct steps"):
        DriftFitter().fit(np.array([0, 0, 1, 1]), np.array([5, 6, 7, 8]))


def test_cap_detection_needs_a_spike():
    rng = np.random.default_rng(0)
    x = np.ceil(GAMMA.rvs(20000, rng)).astype(int)
    smooth = Histogram.from_lengths(np.minimum(x, 10**6))
    assert detect_cap(smooth)[0] is None
    capped = Histogram.from_lengths(cap_lengths(GAMMA.rvs(20000, rng), 1500))
    assert detect_cap(capped)[0] == 1500
    # a dense region at the maximum is not a spike just because its count is high
    tiny = Histogram.from_lengths(np.clip(x, 1, None) % 7 + 1)
    assert detect_cap(tiny)[0] is None


def test_goodness_prefers_the_true_family():
    x = cap_lengths(GAMMA.rvs(5000, np.random.default_rng(2)), 10**7)
    f = LengthFitter(families=["gamma", "lognormal", "weibull"], n_bootstrap=0).fit(x)
    g, ln = f.result("gamma"), f.result("lognormal")
    assert f.best_.family == "gamma"
    assert g.ks < ln.ks and g.ad < ln.ad and g.aic < ln.aic and g.bic < ln.bic
    assert g.ks < 0.03 and g.ad < 3.0  # a correct model sits near the null distribution


def test_sklearn_style_api():
    f = LengthFitter(families=["lognormal"], n_bootstrap=50, random_state=1)
    with pytest.raises(RuntimeError, match="not fitted"):
        f.sample(3)
    x = cap_lengths(
        Parametric("lognormal", {"mu": 6, "sigma": 1}).rvs(3000, np.random.default_rng(0)), 2000
    )
    assert f.fit(x) is f
    for attr in ("results_", "best_", "model_", "cap_", "max_len_", "bootstrap_", "quantiles_"):
        assert hasattr(f, attr)
    assert f.cap_.source == "detected" and f.max_len_ == 2000
    m = f.model_
    q = np.array([0.1, 0.5, 0.9])
    np.testing.assert_allclose(m.cdf(m.ppf(q)), q, rtol=1e-6)
    np.testing.assert_allclose(m.sf(m.ppf(q)), 1 - q, rtol=1e-6)
    assert np.all(m.pdf(m.ppf(q)) > 0)
    s = f.sample(1000, random_state=0)
    assert s.dtype.kind == "i" and s.max() <= 2000 and s.min() >= 1
    np.testing.assert_array_equal(s, f.sample(1000, random_state=0))
    # bootstrap intervals bracket the estimate, and the capped share is the data's
    for k, ci in f.bootstrap_.items():
        assert ci["lo"] <= ci["estimate"] <= ci["hi"], k
    assert abs(f.bootstrap_["capped_share"]["estimate"] - np.mean(x == 2000)) < 0.01
    # same configuration and seed -> identical results
    g = LengthFitter(families=["lognormal"], n_bootstrap=50, random_state=1).fit(x)
    assert g.bootstrap_ == f.bootstrap_


def test_histogram_input_equals_raw_input():
    x = cap_lengths(GAMMA.rvs(3000, np.random.default_rng(4)), 10**7)
    v, c = np.unique(x, return_counts=True)
    a = LengthFitter(families=["gamma"], n_bootstrap=0).fit(x)
    b = LengthFitter(families=["gamma"], n_bootstrap=0).fit(v, counts=c)
    assert a.best_.loglik == b.best_.loglik


def test_plot_writes_all_panels(tmp_path):
    pytest.importorskip("matplotlib")
    lengths, groups, steps = grouped(0.2, n_groups=400, drift=LinearDrift(0.002), steps=4)
    rep = fit_log(
        LengthData.from_array(lengths, steps=steps),
        families=["gamma", "lognormal"],
        n_bootstrap=0,
        max_len=3000,
    )
    rep.plot(tmp_path / "f.png")
    from matplotlib import image

    img = image.imread(tmp_path / "f.png")
    assert img.shape[1] > 3.5 * img.shape[0]  # four panels side by side


def test_fitted_models_are_frozen_and_sample_like_rvs():
    import dataclasses

    x = cap_lengths(GAMMA.rvs(2000, np.random.default_rng(6)), 10**7)
    f = LengthFitter(families=["gamma", "lognormal_mixture2", "empirical"], n_bootstrap=0).fit(x)
    for r in f.results_:
        m = r.model
        np.testing.assert_array_equal(m.sample(50, 3), m.rvs(50, np.random.default_rng(3)))
        with pytest.raises(dataclasses.FrozenInstanceError):
            m.family = "other"
