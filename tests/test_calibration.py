"""`aprilsim calibrate` without a live engine: fits recover known coefficients, every reader turns
its format into the right records, the preset file drives a simulation, bad input is one line."""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from aprilsim.cli import main
from aprilsim.config import ScenarioError, default_scenario, scenario_from_dict
from aprilsim.engine.calibration import (
    CostCalibrator,
    Record,
    choose_knots,
    read_csv,
    read_iteration_log,
    read_sglang_log,
    read_vidur,
    write_csv,
)
from aprilsim.engine.cost import CostModel, TabulatedCost
from aprilsim.sim.run import simulate

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TRUE = CostModel(a=5e-3, b=2e-5, c=3e-8, p0=0.01, p1=1e-5, p2=1e-9)


def _synthetic(cost, noise: float, seed: int = 0, batches=(1, 2, 4, 8, 16, 32, 64, 128, 256)):
    rng = np.random.default_rng(seed)
    out = []
    for b in batches:
        for k_per in (50, 400, 2000):
            for _ in range(4):
                k = float(b * k_per)
                out.append(Record("decode", b, k, 0,
                                  cost.decode_time(b, k) * (1 + noise * rng.standard_normal())))
    for n in (64, 256, 1024, 4096):
        for bs in (1, 4):
            sizes = [n] * bs
            t = cost.prefill_time(sum(sizes), sum(s * s for s in sizes))
            out.append(Record("prefill", bs, 0.0, sum(sizes),
                              t * (1 + noise * rng.standard_normal()),
                              float(sum(s * s for s in sizes))))
    return out


def test_linear_fit_recovers_known_coefficients_under_noise():
    cal = CostCalibrator("linear").fit(_synthetic(TRUE, noise=0.02))
    c = cal.cost_
    assert isinstance(c, CostModel)
    for k in ("a", "b", "c", "p0", "p1", "p2"):
        assert getattr(c, k) == pytest.approx(getattr(TRUE, k), rel=0.1), k
    assert cal.n_decode_ == 108 and cal.n_prefill_ == 8
    assert all(e.median_abs < 0.03 for e in cal.errors_)


def test_noiseless_fit_is_exact():
    c = CostCalibrator("linear", robust=False).fit(_synthetic(TRUE, noise=0.0)).cost_
    for k in ("a", "b", "c", "p0", "p1", "p2"):
        assert getattr(c, k) == pytest.approx(getattr(TRUE, k), rel=1e-6), k


def test_tables_recover_a_curve_the_linear_form_cannot_follow():
    # f bends at small B (what Vidur's profiles show): tables follow it, the 3-term form cannot
    truth = TabulatedCost((1, 8, 64, 256), (4e-3, 6e-3, 7e-3, 1.1e-2), (2e-8, 2e-8, 3e-8, 3e-8),
                          0.01, 1e-5, 1e-9)
    recs = _synthetic(truth, noise=0.02, batches=(1, 2, 4, 8, 16, 32, 64, 128, 256))
    tab = CostCalibrator("tables").fit(recs)
    lin = CostCalibrator("linear").fit(recs)
    assert isinstance(tab.cost_, TabulatedCost)
    for b in (1, 8, 64, 256):
        f, g = tab.cost_.coefficients(b)
        assert f == pytest.approx(truth.coefficients(b)[0], rel=0.1)
    small = {e.regime: e for e in tab.errors_}["decode B <= 8"]
    small_lin = {e.regime: e for e in lin.errors_}["decode B <= 8"]
    assert small.median_abs < 0.03 < small_lin.median_abs


def test_coefficients_are_never_negative():
    # times that fall with K would want c < 0: the fit clamps it at 0
    recs = [Record("decode", b, k, 0, 0.01 + 1e-4 * b - 1e-8 * k)
            for b in (1, 4, 16) for k in (10.0, 1000.0, 100000.0)]
    c = CostCalibrator().fit(recs).cost_
    assert c.c == 0 and c.a > 0 and c.b >= 0


def test_knots_are_visited_sizes_dense_at_small_batch():
    assert choose_knots([1, 2, 2, 4]) == (1, 2, 4)
    knots = choose_knots(list(range(1, 257)), max_knots=8)
    assert knots[0] == 1 and knots[-1] == 256 and len(knots) <= 9
    assert sum(k <= 16 for k in knots) >= sum(k > 16 for k in knots) - 1


def test_csv_round_trip_and_per_request_prefill_sizes(tmp_path):
    recs = _synthetic(TRUE, 0.0)[:5] + [Record("prefill", 2, 0, 300, 0.02, 50000.0)]
    p = tmp_path / "r.csv"
    write_csv(recs, p)
    back = read_csv(p)
    assert [(r.phase, r.batch_size, r.prefill_tokens) for r in back] == \
        [(r.phase, r.batch_size, r.prefill_tokens) for r in recs]
    assert back[-1].tokens_sq == 50000.0
    q = tmp_path / "sizes.csv"
    q.write_text("phase,batch_size,kv_tokens,prefill_tokens,duration_s,prefill_sizes\n"
                 "prefill,,0,,0.05,100;200\n")
    (r,) = read_csv(q)
    assert (r.batch_size, r.prefill_tokens, r.tokens_sq) == (2, 300, 50000.0)


SGLANG_LOG = """\
[2026-11-30 09:00:00 TP0] Prefill batch, #new-seq: 2, #new-token: 1024, #cached-token: 0, \
token usage: 0.01, #running-req: 0, #queue-req: 1, #pending-token: 0, cuda graph: False, \
input throughput (token/s): 0.00
[2026-11-30 09:00:00 TP0] Prefill batch, #new-seq: 1, #new-token: 512, #cached-token: 0, \
token usage: 0.02, #running-req: 2, #queue-req: 0, #pending-token: 0, cuda graph: False, \
input throughput (token/s): 25600.00
[2026-11-30 09:00:01 TP0] Decode batch, #running-req: 3, #token: 1600, token usage: 0.02, \
cuda graph: True, gen throughput (token/s): 300.00, #queue-req: 0
[2026-11-30 09:00:02 TP0] Some other line: #running-req: 99
[2026-11-30 09:00:03 TP0] Decode batch [812], #running-req: 64, #token: 80000, token usage: 0.40, \
cuda graph: True, gen throughput (token/s): 3200.00, #queue-req: 5
"""


def test_sglang_log_lines_give_per_iteration_times_from_throughput(tmp_path):
    p = tmp_path / "server.log"
    p.write_text(SGLANG_LOG)
    recs = read_sglang_log(p)
    dec = [r for r in recs if r.phase == "decode"]
    assert [(r.batch_size, r.kv_tokens) for r in dec] == [(3, 1600.0), (64, 80000.0)]
    assert dec[0].duration_s == pytest.approx(3 / 300) and dec[1].duration_s == pytest.approx(0.02)
    (pre,) = [r for r in recs if r.phase == "prefill"]  # the first batch, timed by the second line
    assert (pre.batch_size, pre.prefill_tokens) == (2, 1024)
    assert pre.duration_s == pytest.approx(512 / 25600)


def test_iteration_log_uses_the_previous_steps_kv_as_the_load_at_start(tmp_path):
    rows = [
        {"seq": 1, "phase": "prefill", "batch_size": 2, "prefill_tokens": 20, "kv_tokens": 20,
         "running": 2, "retracted": 0, "duration_s": 0.01},
        {"seq": 2, "phase": "decode", "batch_size": 2, "prefill_tokens": 0, "kv_tokens": 22,
         "running": 2, "retracted": 0, "duration_s": 0.002},
        {"seq": 4, "phase": "decode", "batch_size": 2, "prefill_tokens": 0, "kv_tokens": 30,
         "running": 2, "retracted": 0, "duration_s": 0.002},
    ]
    p = tmp_path / "it.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recs = read_iteration_log(p)
    assert [(r.phase, r.kv_tokens) for r in recs] == [("prefill", 0.0), ("decode", 20.0),
                                                      ("decode", 28.0)]
    q = tmp_path / "endpoint.json"  # a saved GET /iteration_log answer reads the same
    q.write_text(json.dumps({"records": rows, "last_seq": 4}))
    assert read_iteration_log(q) == recs


def _write_vidur(d):
    """A small profile in Vidur's CSV layout (numbers made up: per layer, milliseconds)."""
    d.mkdir()
    mlp = ["n_head,n_kv_head,n_embd,n_expanded_embd,vocab_size,use_gated_mlp,num_tokens,"
           "num_tensor_parallel_workers,time_stats.attn_pre_proj.median,"
           "time_stats.mlp_up_proj.median,time_stats.mlp_down_proj.median"]
    for tp in (1, 2):
        for n in (1, 16, 64, 256, 1024, 4096):
            base = 0.02 + 0.0002 * n / tp
            mlp.append(f"8,8,512,1024,32000,True,{n},{tp},{base:.6f},{base:.6f},{base:.6f}")
    (d / "mlp.csv").write_text("\n".join(mlp) + "\n")
    att = ["n_embd,n_q_head,n_kv_head,block_size,num_tensor_parallel_workers,max_model_len,"
           "batch_size,prefill_chunk_size,kv_cache_size,is_prefill,attention_backend,"
           "time_stats.attn_prefill.median,time_stats.attn_decode.median"]
    for b in (1, 4, 16, 64):
        for k in (128, 1024, 4096):
            att.append(f"512,8,8,16,1,4096,{b},0,{k},False,FLASHINFER,,{0.01 + 2e-6 * b * k:.6f}")
    for n in (128, 512, 2048):
        att.append(f"512,8,8,16,1,4096,1,{n},0,True,FLASHINFER,{0.02 + 1e-7 * n * n:.6f},")
    (d / "attention.csv").write_text("\n".join(att) + "\n")


def test_vidur_profiles_become_layered_step_times(tmp_path):
    d = tmp_path / "vidur"
    _write_vidur(d)
    recs = read_vidur(d, layers=10)
    dec = {(r.batch_size, r.kv_tokens): r.duration_s for r in recs if r.phase == "decode"}
    # B = 4, k = 1024: 10 layers x (3 x (0.02 + 0.0002*4) + 0.01 + 2e-6*4*1024) ms
    assert dec[(4, 4096.0)] == pytest.approx(10 * (3 * 0.0208 + 0.01 + 2e-6 * 4096) / 1e3, rel=1e-4)
    pre = [r for r in recs if r.phase == "prefill"]
    assert sorted(r.prefill_tokens for r in pre) == [128, 512, 2048]
    assert all(r.tokens_sq == r.prefill_tokens**2 for r in pre)
    cal = CostCalibrator().fit(recs)
    assert cal.cost_.c > 0 and cal.cost_.p2 > 0  # attention: linear in K, quadratic in n
    with pytest.raises(ValueError, match="no rows at tp 8"):
        read_vidur(d, layers=10, tp=8)


def _scenario_data():
    d = default_scenario().model_dump(mode="json", exclude_none=True)
    d["batch_size"], d["max_response_len"], d["group_size"] = 4, 256, 4
    d["prompts"] = {"family": "lognormal", "mu": 3.0, "sigma": 0.3, "max_len": 64}
    d["lengths"] = {"family": "lognormal", "mu": 4.0, "sigma": 0.5}
    return d


def test_preset_file_from_the_cli_is_loaded_and_simulated(tmp_path):
    csv_path = tmp_path / "r.csv"
    write_csv(_synthetic(TRUE, 0.01), csv_path)
    res = CliRunner().invoke(main, ["calibrate", "--csv", str(csv_path), "--form", "tables",
                                    "--out", str(tmp_path / "cal.toml"), "--plot",
                                    str(tmp_path / "res.png"), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["form"] == "tables" and out["errors"][-1]["regime"] == "all"
    assert (tmp_path / "res.png").stat().st_size > 1000
    preset = tomllib.loads((tmp_path / "cal.toml").read_text())
    assert preset["cost"]["table_b"] == out["cost"]["table_b"]
    d = _scenario_data()
    d["cluster"]["preset"] = "cal.toml"
    sc = scenario_from_dict(d, tmp_path)
    spec = sc.engine_spec()
    assert isinstance(spec.cost, TabulatedCost) and spec.label == "calibrated"
    assert spec.cost.coefficients(1)[0] == pytest.approx(out["cost"]["table_f"][0])
    summary = simulate(sc, "april", steps=2).summary()
    assert summary["generated_tokens"] > 0 and math.isfinite(summary["total_time_s"])


def test_text_output_has_the_coefficients_and_the_error_table(tmp_path):
    csv_path = tmp_path / "r.csv"
    write_csv(_synthetic(TRUE, 0.01), csv_path)
    res = CliRunner().invoke(main, ["calibrate", "--csv", str(csv_path)])
    assert res.exit_code == 0
    assert "t(B, K) = 0.005" in res.stdout
    for regime in ("decode B <= 8", "decode B 9-64", "decode B > 64", "prefill"):
        assert regime in res.stdout


def test_bad_preset_files_are_one_line_scenario_errors(tmp_path):
    d = _scenario_data()
    (tmp_path / "neg.toml").write_text("[cost]\na = -1\nb = 0\nc = 0\np0 = 0\np1 = 0\n")
    (tmp_path / "nocost.toml").write_text('label = "x"\n')
    (tmp_path / "extra.toml").write_text("bogus = 1\n[cost]\na=1\nb=0\nc=0\np0=0\np1=0\n")
    for name, msg in (("neg.toml", "cost.a"), ("nocost.toml", "cost: required key is missing"),
                      ("extra.toml", "bogus: unknown key"), ("absent.toml", "cannot read")):
        d["cluster"]["preset"] = name
        with pytest.raises(ScenarioError, match=msg) as e:
            scenario_from_dict(d, tmp_path)
        assert str(e.value).startswith("cluster.preset") and "\n" not in str(e.value)


@pytest.mark.parametrize(("args", "message"), [
    ([], "give exactly one of"),
    (["--csv", "a.csv", "--sglang-log", "b.log"], "give exactly one of"),
    (["--csv", "missing.csv"], "cannot read"),
    (["--csv", "bad.csv"], "missing column(s) duration_s"),
    (["--csv", "neg.csv"], "neg.csv:2: duration_s must be > 0"),
    (["--csv", "prefill_only.csv"], "no decode records"),
    (["--sglang-log", "bad.csv"], "no 'Decode batch"),
    (["--iteration-log", "bad.csv"], "not a JSON line"),
    (["--vidur", "nodir"], "not a directory"),
    (["--csv", "ok.csv", "--plot", "x.txt"], "must end in .png"),
    (["--csv", "ok.csv", "--out", "nowhere/cal.toml"], "does not exist"),
    (["--csv", "ok.csv", "--form", "cubic"], "Invalid value for '--form'"),
    (["--local", "0"], "--local must be >= 1"),
    (["--local", "1", "--batch-sizes", "1,x"], "--batch-sizes must be comma-separated"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.csv").write_text("phase,batch_size,kv_tokens,prefill_tokens\ndecode,1,1,0\n")
    (tmp_path / "neg.csv").write_text(
        "phase,batch_size,kv_tokens,prefill_tokens,duration_s\ndecode,1,1,0,-1\n")
    (tmp_path / "prefill_only.csv").write_text(
        "phase,batch_size,kv_tokens,prefill_tokens,duration_s\nprefill,1,0,10,0.1\n")
    write_csv(_synthetic(TRUE, 0.0)[:10], tmp_path / "ok.csv")
    res = CliRunner().invoke(main, ["calibrate", *args])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], res.stderr
