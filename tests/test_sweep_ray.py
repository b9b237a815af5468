"""`aprilsim sweep --ray`: the same table from Ray tasks on a local Ray with 2 CPUs."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("pandas", reason="sweeps need the `sweep` extra (pandas)")
ray = pytest.importorskip("ray", reason="ray is not importable: pip install 'aprilsim[sweep]'")

from sweep_helpers import tiny  # noqa: E402

import aprilsim  # noqa: E402
from aprilsim.sweep.api import run_sweep  # noqa: E402

RATIO = "schedulers.april.ratio"


@pytest.fixture(scope="module")
def local_ray():
    """A fresh local Ray of 2 CPUs, also where a Ray cluster is already running: `address="local"`
    starts a new one instead of joining the running one (a plain `ray.init(num_cpus=2)` joins it,
    or RAY_ADDRESS, and then refuses `num_cpus`)."""
    saved = os.environ.pop("RAY_ADDRESS", None)
    try:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                 configure_logging=False, _node_ip_address="127.0.0.1")
        yield
    finally:
        ray.shutdown()
        if saved is not None:
            os.environ["RAY_ADDRESS"] = saved


def test_ray_sweep_matches_local_and_resumes(local_ray, tmp_path):
    grid = {RATIO: [1.0, 2.0]}
    local = aprilsim.sweep(tiny(), grid, seeds=2, jobs=1)
    out = tmp_path / "r.parquet"
    remote = aprilsim.sweep(tiny(), grid, seeds=2, ray=True, out=out)
    cols = [c for c in local.columns if c != "sim_s"]
    assert len(remote) == 8
    assert local[cols].equals(remote[cols])
    _, stats, _ = run_sweep(tiny(), grid, seeds=2, ray=True, out=out)
    assert stats["runs"] == 0 and stats["skipped"] == 8
