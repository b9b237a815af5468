"""Live calibration on the bundled engine (CPU, small): `aprilsim calibrate --local 1` end to end,
and a real `python -m real.serve --iteration-log` server calibrated over HTTP, whose log file is
then read back. Each test stays well under a minute on two shared cores."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from cli_helpers import Result, aprilsim

pytest.importorskip("torch")
pytest.importorskip("aiohttp")

from aprilsim.engine.calibration import CostCalibrator, read_iteration_log  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _aprilsim(*args: str) -> Result:
    """The command in this process (the calibration is the point here, not the interpreter)."""
    return aprilsim(*args, cwd=ROOT)


@pytest.mark.slow
def test_calibrate_local_1_end_to_end(tmp_path):
    t = time.monotonic()
    res = _aprilsim("calibrate", "--local", "1", "--out", str(tmp_path / "cal.toml"), "--json")
    wall = time.monotonic() - t
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["n_decode"] >= 100 and out["n_prefill"] >= 5
    assert out["max_running"] >= 8 and out["kv_capacity"] > 0
    assert {"decode B <= 8", "prefill", "all"} <= {e["regime"] for e in out["errors"]}
    cost = out["cost"]
    assert cost["a"] + cost["b"] > 0  # an iteration takes time
    assert "[cost]" in (tmp_path / "cal.toml").read_text()
    # timed by the engine's own log: the client's time per request is fitted and recorded
    assert out["client_overhead_s"] >= 0
    assert "client_overhead_s = " in (tmp_path / "cal.toml").read_text()
    assert any(m.startswith("client_overhead_s") for m in out["measured"])
    assert wall < 90, f"calibrate --local 1 took {wall:.0f} s"


@pytest.fixture
def server(tmp_path):
    port = _free_port()
    log = tmp_path / "iterations.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "real.serve", "--port", str(port), "--d-model", "64",
         "--n-layers", "2", "--max-context", "1024", "--max-running-requests", "4",
         "--tokenizer-path", "none", "--torch-threads", "1", "--iteration-log", str(log)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"{url}/health", timeout=1).read()
                break
            except OSError:
                if proc.poll() is not None:
                    pytest.fail(f"server died: {proc.stderr.read()[-2000:]}")
                time.sleep(0.1)
        yield url, log
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.mark.slow
def test_engines_url_calibration_and_the_servers_iteration_log(server, tmp_path):
    url, log = server
    res = _aprilsim("calibrate", "--engines", url, "--batch-sizes", "1,2,4", "--kv-loads", "8,64",
                    "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert "iteration log" in out["source"] and out["max_running"] == 4
    # the file the server wrote holds the same steps: read and fit it on its own
    recs = read_iteration_log(log)
    decode_batches = {r.batch_size for r in recs if r.phase == "decode"}
    assert {1, 2, 4} <= decode_batches
    assert any(r.phase == "prefill" and r.prefill_tokens >= 64 for r in recs)
    cal = CostCalibrator("tables").fit(recs)
    assert cal.cost_.table_b[0] == 1 and cal.cost_.table_b[-1] == 4
    live = _aprilsim("calibrate", "--iteration-log", str(log))
    assert live.returncode == 0 and "decode B <= 8" in live.stdout


def test_token_stream_timing_for_engines_without_an_iteration_log():
    """SGLang and routers have no /iteration_log: the iterations are rebuilt from the arrivals of
    the batch's tokens (aprilsim.validate.reconstruct) and become calibration records."""
    from aprilsim.engine.calibration import records_from_iterations
    from aprilsim.validate.reconstruct import StreamLog, reconstruct

    logs = [StreamLog(10.0, 100, [(10.5, 1), (10.6, 1), (10.8, 1)]),
            StreamLog(10.0, 100, [(10.5004, 1), (10.6003, 1), (10.8002, 1)])]
    pre, *dec = records_from_iterations(reconstruct(logs))
    assert (pre.phase, pre.batch_size, pre.prefill_tokens) == ("prefill", 2, 200)
    assert pre.duration_s == pytest.approx(0.5)
    assert [(r.batch_size, r.kv_tokens) for r in dec] == [(2, 202.0), (2, 204.0)]
    assert [r.duration_s for r in dec] == pytest.approx([0.1, 0.2])
