"""The slow path of `aprilsim fit` (issue #13, item 15): the bootstrap of a lognormal mixture.

Its cost was BFGS's finite-difference gradient: n_params + 1 likelihood evaluations per gradient.
The mixtures now give BFGS an analytic gradient. These tests check the gradient against finite
differences (censored, binned, with a length-1 bin whose lower edge is 0), that a bootstrap refit
needs a fraction of the evaluations it used to, that the intervals are the same as with finite
differences, and that the benchmark times the default command on data where the 3-mixture wins.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from aprilsim.workload.fitting import LengthFitter
from aprilsim.workload.fitting import fitter as fitter_module
from aprilsim.workload.fitting.censoring import CensoredHistogram, coarsen
from aprilsim.workload.fitting.families import FAMILY_SPECS
from aprilsim.workload.fitting.likelihood import Grid, loglik, loglik_and_grad
from aprilsim.workload.lengths import LognormalMixture, cap_lengths

ROOT = Path(__file__).resolve().parents[1]
TRUTH = LognormalMixture((0.3, 0.3, 0.4), (4.0, 6.0, 6.6), (1.2, 0.5, 0.25))


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("binned", [False, True])
def test_mixture_gradient_matches_finite_differences(k, binned):
    rng = np.random.default_rng(k)
    v = np.arange(1, 4000)
    data = CensoredHistogram(v, rng.integers(0, 40, len(v)), 57, 4000)
    if binned:
        data = coarsen(data, 600)
        assert data.binned
    fam = FAMILY_SPECS[f"lognormal_mixture{k}"]
    grid = Grid.of(data)
    # plausible parameters: no bin probability underflows (there the objective is clamped flat)
    theta = np.concatenate(
        [rng.normal(0, 0.5, k - 1), rng.uniform(4, 7, k), np.log(rng.uniform(0.6, 1.5, k))]
    )
    ll, g = loglik_and_grad(fam, theta, data, grid)
    assert ll == pytest.approx(loglik(fam, theta, data, grid), rel=1e-12)
    h = 1e-6
    num = [
        (loglik(fam, theta + e, data, grid) - loglik(fam, theta - e, data, grid)) / (2 * h)
        for e in np.eye(len(theta)) * h
    ]
    np.testing.assert_allclose(g, num, rtol=1e-5, atol=1e-3 * np.abs(g).max())


def counting(monkeypatch, name: str) -> dict[str, int]:
    calls = {"n": 0}
    fam = FAMILY_SPECS[name]

    def wrap(fn):
        def inner(*a):
            calls["n"] += 1
            return fn(*a)

        return inner

    monkeypatch.setitem(
        FAMILY_SPECS,
        name,
        dataclasses.replace(fam, cdf_sf=wrap(fam.cdf_sf), cdf_sf_grad=wrap(fam.cdf_sf_grad)),
    )
    return calls


def bootstrap_evaluations(monkeypatch, use_gradient: bool) -> tuple[float, dict]:
    x = cap_lengths(TRUTH.rvs(20000, np.random.default_rng(0)), 3000)
    f = LengthFitter(families=["lognormal_mixture3"], n_bootstrap=0).fit(x)
    calls = counting(monkeypatch, "lognormal_mixture3")
    original = fitter_module.maximise
    monkeypatch.setattr(
        fitter_module,
        "maximise",
        lambda *a, **kw: original(*a, **{**kw, "use_gradient": use_gradient}),
    )
    f.n_bootstrap = 20
    bs = f._bootstrap(f.data_)
    return calls["n"] / 20, bs


def test_a_bootstrap_refit_needs_few_likelihood_evaluations(monkeypatch):
    per_refit, bs = bootstrap_evaluations(monkeypatch, True)
    assert bs["p99"]["n"] == 20
    # finite differences spend n_params + 1 = 9 evaluations per gradient: about 300 per refit
    assert per_refit < 80, per_refit


def test_the_analytic_gradient_gives_the_finite_difference_intervals(monkeypatch):
    _, fast = bootstrap_evaluations(monkeypatch, True)
    monkeypatch.undo()
    slow_per_refit, slow = bootstrap_evaluations(monkeypatch, False)
    assert slow_per_refit > 150  # the old path really was the expensive one
    for q in ("p50", "p90", "p99"):
        for end in ("lo", "hi"):
            assert fast[q][end] == pytest.approx(slow[q][end], rel=0.01), (q, end)


def test_benchmark_times_the_default_command_on_a_3_mixture_sample():
    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "fit_speed.py"),
            "--json",
            "--n",
            "30000",
            "--bootstrap",
            "20",
            "--baseline",
            "none",
            "--cases",
            "mixture3",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    out = json.loads(res.stdout)["cases"]["mixture3"]
    assert out["best"] == "lognormal_mixture3" and out["delta_bic_runner_up"] > 10
    assert out["bootstrap_resamples_ok"] == 20
    cpu = out["cpu_s"]
    assert cpu["cli"] > 0 and all(cpu[k] >= 0 for k in ("import", "read", "fit", "bootstrap"))
    assert cpu["cli"] >= cpu["fit"] + cpu["bootstrap"]  # the CLI does all of it


ONE_COMPONENT = {
    "gengamma": [(2.0, 0.8, 300.0), (20.0, 0.3, 5.0), (0.7, 1.5, 900.0), (300.0, 0.1, 1e-6)],
    "gamma": [(1.5, 300.0), (0.5, 2000.0), (30.0, 50.0)],
    "weibull": [(1.3, 700.0), (0.6, 300.0), (4.0, 2000.0)],
    "loglogistic": [(3.0, 500.0), (1.2, 100.0), (8.0, 2500.0)],
    "lognormal": [(6.0, 1.0), (4.0, 0.4), (7.5, 2.0)],
}


@pytest.mark.parametrize("family", sorted(ONE_COMPONENT))
@pytest.mark.parametrize("binned", [False, True])
def test_one_component_gradients_match_finite_differences(family, binned):
    """Analytic gradients of the one-component families (gamma and gengamma: a central
    difference in a, analytic in the rest), at typical and extreme parameters."""
    rng = np.random.default_rng(7)
    v = np.arange(1, 4000)
    data = CensoredHistogram(v, rng.integers(0, 40, len(v)), 57, 4000)
    if binned:
        data = coarsen(data, 600)
    fam = FAMILY_SPECS[family]
    assert fam.cdf_sf_grad is not None
    grid = Grid.of(data)
    for params in ONE_COMPONENT[family]:
        theta = np.array(params, float)
        if family == "lognormal":
            theta[1] = np.log(theta[1])  # (mu, log sigma)
        else:
            theta = np.log(theta)
        ll, g = loglik_and_grad(fam, theta, data, grid)
        assert ll == pytest.approx(loglik(fam, theta, data, grid), rel=1e-12)
        h = 1e-6
        num = [
            (loglik(fam, theta + e, data, grid) - loglik(fam, theta - e, data, grid)) / (2 * h)
            for e in np.eye(len(theta)) * h
        ]
        np.testing.assert_allclose(g, num, rtol=1e-4, atol=1e-4 * np.abs(g).max())


def test_warm_hessian_falls_back_to_a_plain_start_where_it_cannot_help():
    """No warm curvature at a bound (the objective is flat there) or without a gradient: the
    bootstrap then starts BFGS from the identity, as it always did."""
    from aprilsim.workload.fitting.likelihood import inverse_hessian

    x = cap_lengths(TRUTH.rvs(20000, np.random.default_rng(0)), 3000)
    f = LengthFitter(families=["lognormal_mixture3"], n_bootstrap=0).fit(x)
    fam = FAMILY_SPECS["lognormal_mixture3"]
    h_inv = inverse_hessian(fam, f.data_, f.best_.theta)
    assert h_inv is not None and np.allclose(h_inv, h_inv.T)
    assert np.all(np.linalg.eigvalsh(h_inv) > 0)
    at_bound = f.best_.theta.copy()
    at_bound[0] = fam.bounds[0][1]
    assert inverse_hessian(fam, f.data_, at_bound) is None
    no_grad = dataclasses.replace(fam, cdf_sf_grad=None)
    assert inverse_hessian(no_grad, f.data_, f.best_.theta) is None
