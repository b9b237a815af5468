"""The shared real traces fit end to end through the CLI; the fitted model simulates.

Data: ../shared/data/lengths/ (see its README), or $APRILSIM_SHARED_DATA/lengths.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import aprilsim
from click.testing import CliRunner

from aprilsim.workload.fitting.cli import fit_command
from aprilsim.workload.generator import Workload
from aprilsim.workload.model_file import read_model_file


def _data_dir() -> Path:
    env = os.environ.get("APRILSIM_SHARED_DATA")
    base = Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "data"
    return base / "lengths"


DATA = _data_dir()
pytestmark = pytest.mark.skipif(
    not (DATA / "mooncake_conversation_trace.jsonl").exists(),
    reason=f"shared length data not found at {DATA} (set APRILSIM_SHARED_DATA)",
)

# file -> (detected cap, censored count, family ranked first by BIC, family ranked last)
TRACES = {
    "mooncake_conversation_trace.jsonl": (2000, 30, "lognormal_mixture3", "lognormal"),
    "azure2023_conv.csv": (1000, 11, "empirical", "loglogistic"),  # a lumpy histogram
    "azure2023_code.csv": (None, 0, "lognormal_mixture3", "gamma"),
}


def run_fit(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(fit_command, list(args))
    return res.exit_code, res.stdout, res.stderr


@pytest.mark.parametrize("name", sorted(TRACES))
def test_trace_fits_end_to_end(name, tmp_path):
    cap, n_cens, first, last = TRACES[name]
    out = tmp_path / "m.toml"
    code, stdout, stderr = run_fit(
        str(DATA / name), "--json", "--bootstrap", "30", "--out", str(out)
    )
    assert code == 0, stderr
    res = json.loads(stdout)
    assert res["cap"]["max_len"] == cap
    assert res["cap"]["source"] == ("detected" if cap else "none")
    assert res["cap"]["n_censored"] == n_cens
    ranking = [r["family"] for r in res["ranking"]]
    assert ranking[0] == first and ranking[-1] == last
    assert sorted(ranking) == sorted(
        [
            "lognormal",
            "gamma",
            "weibull",
            "loglogistic",
            "gengamma",
            "lognormal_mixture2",
            "lognormal_mixture3",
            "empirical",
        ]
    )
    # the chosen model reproduces the data's median within its bootstrap interval (+-1 token)
    # and its p90 within 10 % (azure code's lumpy histogram is not matched more closely)
    ci = res["bootstrap"]["p50"]
    assert ci["lo"] - 1 <= res["empirical_quantiles"]["p50"] <= ci["hi"] + 1
    assert abs(res["quantiles"]["p90"] / res["empirical_quantiles"]["p90"] - 1) < 0.1
    mf = read_model_file(out)
    assert mf.max_len == cap and mf.fit["family"] == first
    w = Workload(lengths=mf.lengths, max_len=cap or 4096, seed=0)
    lengths = np.array([s._target_len for g in w.generate(500) for s in g.samples])
    emp = res["empirical_quantiles"]["p50"]
    assert abs(np.median(lengths) / emp - 1) < 0.1


def test_mooncake_done_criterion(tmp_path):
    """The issue's acceptance command: fit, write, plot, and simulate the model."""
    m, png = tmp_path / "m.toml", tmp_path / "m.png"
    code, stdout, stderr = run_fit(
        str(DATA / "mooncake_conversation_trace.jsonl"),
        "--max-len",
        "2000",
        "--out",
        str(m),
        "--plot",
        str(png),
        "--bootstrap",
        "20",
    )
    assert code == 0, stderr
    assert "cap 2000 (given): 30 lengths" in stdout
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
    scen = tmp_path / "scen.toml"
    scen.write_text(
        'name = "fit"\nsteps = 2\nbatch_size = 4\ngroup_size = 4\nmax_response_len = 2000\n'
        'compare = ["sync"]\nlengths = { from = "m.toml" }\n'
    )
    proc = aprilsim("simulate", scen, "--json", cwd=tmp_path)  # in-process: the model is the point
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out[0]["trained_samples"] == out[0]["steps"] * 4 * 4 and out[0]["warmup_steps"] == 1
    # the simulated workload's mean is the fitted model's capped mean (mooncake: about 350-400)
    assert 250 < out[0]["workload_mean_length"] < 500


@pytest.mark.parametrize(
    "name,kind",
    [
        ("dapo_mean_response_length_digitized.csv", "table"),
        ("deepseek_r1_zero_avg_length_digitized.csv", "linear"),
    ],
)
def test_rl_length_curves_fit_drift(name, kind, tmp_path):
    code, stdout, stderr = run_fit(str(DATA / name), "--json")
    assert code == 0, stderr
    res = json.loads(stdout)
    d = res["drift"]
    assert d["kind"] == kind and d["is_curve"]
    assert d["linear_slope"] > 0  # responses grow during RL
    assert d["extrapolate_to"] >= d["last_step"]
    # DAPO rises then plateaus (linear is poor, the table is used, trusted only to its end);
    # R1-Zero grows almost linearly (and may be extrapolated a little)
    if kind == "table":
        assert d["extrapolate_to"] == d["last_step"] and d["r2_linear"] < 0.95
    else:
        assert d["r2_linear"] >= 0.95 and d["extrapolate_to"] > d["last_step"]
    # a curve alone cannot make a model file, and says why
    code, _, stderr = run_fit(str(DATA / name), "--out", str(tmp_path / "x.toml"))
    assert code == 2 and "--drift-from" in stderr


def test_drift_from_curve_is_written_into_the_model(tmp_path):
    out = tmp_path / "m.toml"
    code, stdout, stderr = run_fit(
        str(DATA / "mooncake_conversation_trace.jsonl"),
        "--bootstrap",
        "0",
        "--families",
        "lognormal,gamma",
        "--drift-from",
        str(DATA / "deepseek_r1_zero_avg_length_digitized.csv"),
        "--out",
        str(out),
    )
    assert code == 0, stderr
    mf = read_model_file(out)
    assert mf.drift is not None and mf.drift.kind == "linear"
    w = Workload(lengths=mf.lengths, max_len=mf.max_len, drift=mf.drift, seed=0)
    assert w.expected_length(step=2000) > 1.5 * w.expected_length(step=0)
