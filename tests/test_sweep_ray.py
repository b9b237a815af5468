"""`aprilsim sweep --ray`: the same table from Ray tasks on a local Ray with 2 CPUs."""

from __future__ import annotations

import pytest

pytest.importorskip("pandas", reason="sweeps need the `sweep` extra (pandas)")
ray = pytest.importorskip("ray", reason="ray is not importable: pip install 'aprilsim[sweep]'")

from sweep_helpers import tiny  # noqa: E402

import aprilsim  # noqa: E402
from aprilsim.sweep.api import run_sweep  # noqa: E402

RATIO = "schedulers.april.ratio"


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False, _node_ip_address="127.0.0.1")
    yield
    ray.shutdown()


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
