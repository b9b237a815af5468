"""``experiments/gpu_validate.py --device cpu --tiny``: the GPU validation's one command, end to
end on CPU (issue 35, item 6): engines started, calibrated, four schedulers in two rounds, both
judgements written with their verdicts, decisions and figures, within its budget."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_gpu_shape_is_a_1_to_3_b_decoder_whose_engines_hold_128_requests():
    sys.path.insert(0, str(ROOT / "experiments"))
    import gpu_validate as g

    assert g.GPU_MODEL_PARAMS_MIN <= g.GPU.params() <= g.GPU_MODEL_PARAMS_MAX
    assert g.GPU.max_running >= 128 and g.GPU.max_response >= 4096 and g.GPU.dtype == "bfloat16"
    assert g.GPU.batch_size * g.GPU.group_size / 2 >= 128  # sync alone: 128 per engine on 2
    assert 2 * (g.GPU.kv_bytes() + g.GPU.weight_bytes()) < 0.9 * 139 * 2**30  # two fit an H200
    assert "max_response_len = 4096" in g.scenario_toml(g.GPU)


@pytest.mark.slow
def test_gpu_validate_runs_tiny_on_cpu(tmp_path):
    out = tmp_path / "gpu"
    res = subprocess.run([sys.executable, "experiments/gpu_validate.py", "--device", "cpu",
                          "--tiny", "--out", str(out), "--budget-s", "240"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    for name in ("crossfit", "sweep"):
        rep = json.loads((out / f"report_{name}" / "report.json").read_text())
        assert rep["verdict"] in ("met", "missed", "undecided")
        assert rep["meta"]["schedulers"] == ["sync", "april", "april@ratio=1.5", "async_one_step"]
        assert all(d["pooled"]["compared"] >= 0 for d in rep["decisions"].values())
        assert (out / f"report_{name}" / "rollout_per_step.png").is_file()
    assert (out / "calibration" / "cal.toml").is_file() and (out / "validate" / "runs").is_dir()
    text = (out / "summary.md").read_text()
    assert "wall in all" in text and "decisions of april" in text
