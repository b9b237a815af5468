"""The bootstrap shortcut of `aprilsim fit` (issue 23, item 4) keeps the intervals' meaning.

Each refit starts BFGS at the full-data optimum with the full-data inverse Hessian (`warm_hessian`)
instead of the identity: the same maximisation of the same resampled likelihood, in a few steps.
On the shared Mooncake trace (real lengths, capped at 2,000; the 3-lognormal mixture wins there)
these tests check, against the plain bootstrap on the same resamples, that every refit ends at
the same optimum (log-likelihood within 1e-6 per observation of the plain refit run to full
convergence) and that the intervals of p50/p90/p99 agree within 0.5 % (about one token at these
lengths) and the capped share within 1 %, with a fraction of the likelihood evaluations.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest

from aprilsim.workload.fitting import LengthFitter, read_lengths
from aprilsim.workload.fitting.bootstrap import resample
from aprilsim.workload.fitting.families import FAMILY_SPECS
from aprilsim.workload.fitting.likelihood import inverse_hessian, maximise


def _trace() -> Path:
    env = os.environ.get("APRILSIM_SHARED_DATA")
    base = Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "data"
    return base / "lengths" / "mooncake_conversation_trace.jsonl"


TRACE = _trace()
pytestmark = pytest.mark.skipif(not TRACE.exists(), reason=f"shared trace not found at {TRACE}")
FAMILY = "lognormal_mixture3"
N_BOOT = 40


@pytest.fixture(scope="module")
def fitted() -> LengthFitter:
    f = LengthFitter(families=[FAMILY], n_bootstrap=0).fit(read_lengths(TRACE))
    assert f.best_.family == FAMILY and f.cap_.max_len == 2000
    return f


def test_every_warm_refit_ends_at_the_plain_optimum(fitted):
    fam = FAMILY_SPECS[FAMILY]
    theta = fitted.best_.theta
    h_inv = inverse_hessian(fam, fitted.data_, theta)
    assert h_inv is not None and np.all(np.linalg.eigvalsh(h_inv) > 0)
    rng = np.random.default_rng(1)
    warm_steps, plain_steps = [], []
    for _ in range(8):
        d = resample(fitted.data_, rng)
        warm = maximise(fam, d, [theta], maxiter=40, hess_inv0=h_inv)
        plain = maximise(fam, d, [theta], maxiter=40)
        full = maximise(fam, d, [theta], maxiter=2000)  # the plain refit to convergence
        assert warm.loglik >= full.loglik - 1e-6 * d.n, (warm.loglik, full.loglik)
        assert plain.loglik >= full.loglik - 1e-6 * d.n
        warm_steps.append(warm.n_iter)
        plain_steps.append(plain.n_iter)
    assert max(warm_steps) <= 10 and np.mean(plain_steps) > 2 * np.mean(warm_steps), (
        warm_steps,
        plain_steps,
    )


def counting(monkeypatch) -> dict[str, int]:
    calls = {"n": 0}
    fam = FAMILY_SPECS[FAMILY]

    def wrap(fn):
        def inner(*a):
            calls["n"] += 1
            return fn(*a)

        return inner

    monkeypatch.setitem(
        FAMILY_SPECS,
        FAMILY,
        dataclasses.replace(fam, cdf_sf=wrap(fam.cdf_sf), cdf_sf_grad=wrap(fam.cdf_sf_grad)),
    )
    return calls


def test_warm_intervals_agree_with_the_plain_bootstrap(fitted, monkeypatch):
    calls = counting(monkeypatch)
    out = {}
    for warm in (True, False):
        fitted.warm_hessian, fitted.n_bootstrap = warm, N_BOOT
        calls["n"] = 0
        out[warm] = (fitted._bootstrap(fitted.data_), calls["n"])
    (fast, fast_calls), (plain, plain_calls) = out[True], out[False]
    assert plain_calls > 3 * fast_calls, (plain_calls, fast_calls)  # the shortcut is one
    for q in ("p50", "p90", "p99"):
        assert fast[q]["n"] == plain[q]["n"] == N_BOOT
        assert fast[q]["hi"] > fast[q]["lo"] or q == "p50"  # a real interval, not a point
        for end in ("lo", "hi"):
            assert fast[q][end] == pytest.approx(plain[q][end], rel=0.005), (q, end)
    for end in ("lo", "hi"):
        share = fast["capped_share"][end]
        assert share == pytest.approx(plain["capped_share"][end], rel=0.01), end
