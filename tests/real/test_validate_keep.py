"""Nothing measured is lost (issue 35, item 4): every finished live run is kept in ``--out`` as
it finishes; SIGINT and SIGTERM exit 130 with one line saying what was kept; a dead engine exits
1 and keeps the finished runs; ``--resume`` runs only what is missing and reports."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import ROOT, start_server

from aprilsim.cli import main

SMALL = """
name = "keep-small"
seed = 3
steps = 3
warmup_steps = 1
batch_size = 4
group_size = 4
max_response_len = 16384
[cluster]
engines = 1
[trainer]
base_s = 2.0
per_token_s = 1.26e-5
sync_s = 1.0
[lengths]
family = "lognormal_mixture"
weights = [0.7, 0.3]
mus = [7.313, 8.854]
sigmas = [0.6, 0.7]
[prompts]
family = "lognormal"
mu = 5.3
sigma = 0.5
max_len = 2048
"""


def _start(tmp: Path, *args: str) -> subprocess.Popen:
    sc = tmp / "small.toml"
    sc.write_text(SMALL)
    return subprocess.Popen([sys.executable, "-m", "aprilsim", "validate", str(sc), "-s", "sync",
                             "-s", "april", "--no-figures", *args],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"validate ended first: {proc.communicate()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"{path} never appeared")
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_validate_keeps_its_runs_and_resumes(tmp_path, sig):
    out = tmp_path / "out"
    args = ("--local", "1", "--repeats", "2", "--cross-fit", "--out", str(out))
    p = _start(tmp_path, *args)
    _wait_for(out / "runs" / "round0-sync.pkl", p)
    p.send_signal(sig)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    last = err.strip().splitlines()[-1]
    assert "interrupted" in last and "kept in" in last and "--resume" in last, err
    assert "Traceback" not in err and "Aborted!" not in err
    kept = sorted(x.name for x in (out / "runs").glob("round*.pkl"))
    assert "round0-sync.pkl" in kept and not (out / "report.json").exists()
    q = _start(tmp_path, *args, "--resume")
    _, err2 = q.communicate(timeout=300)
    assert q.returncode == 0, err2
    assert f"resuming: {len(kept)} finished runs" in err2
    assert "live sync (round 1/2)" not in err2  # not run again
    rep = json.loads((out / "report.json").read_text())
    assert rep["meta"]["rounds_run"] == 2 and rep["verdict"] in ("met", "missed", "undecided")
    assert (out / "calibration.toml").is_file()


def test_resume_refuses_another_validate_s_runs_and_a_fresh_one_refuses_to_overwrite(tmp_path):
    from real.validate_store import RunStore

    out = tmp_path / "out"
    sc = tmp_path / "small.toml"
    sc.write_text(SMALL)
    RunStore(out).begin({"scenario": "keep-small", "schedulers": ["sync"]}, resume=False)
    (out / "runs" / "round0-sync.pkl").write_bytes(b"x")
    base = ["validate", str(sc), "--local", "1", "-s", "sync", "-s", "april", "--out", str(out)]
    for extra, want in (([], "give --resume to continue it"),
                        (["--resume"], "was written by another validate (it differs in:")):
        r = CliRunner().invoke(main, base + extra)
        assert r.exit_code == 2 and want in r.output, r.output
        assert len(r.output.strip().splitlines()) == 1
    r = CliRunner().invoke(main, ["validate", str(sc), "--local", "1", "--resume",
                                  "--out", str(tmp_path / "none")])
    assert r.exit_code == 2 and "holds no interrupted validate" in r.output


@pytest.mark.slow
def test_a_dead_engine_exits_1_and_keeps_the_finished_runs(tmp_path):
    srv = start_server(tmp_path, "--max-running-requests", "64")
    try:
        out = tmp_path / "out"
        p = _start(tmp_path, "--engines", srv.url, "--scale", "0.00390625", "--out", str(out))
        _wait_for(out / "runs" / "round0-sync.pkl", p)
        srv.kill()
        t0 = time.monotonic()
        _, err = p.communicate(timeout=180)
        took = time.monotonic() - t0
    finally:
        srv.stop()
    assert p.returncode == 1, err
    last = err.strip().splitlines()[-1]
    assert ("engines are gone" in last or "engine died" in last) and "kept in" in last, err
    assert "Traceback" not in err
    assert (out / "runs" / "round0-sync.pkl").is_file()
    assert took < 120, took
