"""`aprilsim calibrate` fits speculative decoding's acceptance from logs that report accepted
tokens (SGLang's `accept len` decode lines, vLLM's spec_decode counters) and writes it into the
preset file, which a scenario then runs with."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from aprilsim.cli import main
from aprilsim.config import load_preset_file
from aprilsim.engine.calibration.speculative_log import (
    fit_from_sglang_lines,
    fit_from_vllm_metrics,
    fit_speculative_file,
)
from aprilsim.engine.speculative import SpeculativeSpec, tokens_per_step

# SGLang 0.5.23's decode line with speculative decoding (metrics_reporter.py: "accept len: ..,
# accept rate: .., " after the token usage); k = 4 draft tokens per round: accept rate =
# (accept len - 1) / 4
SGLANG_SPEC_LOG = """\
[2026-11-30 09:00:00 TP0] Prefill batch, #new-seq: 2, #new-token: 1024, #cached-token: 0, \
token usage: 0.01, #running-req: 0, #queue-req: 0, #pending-token: 0, cuda graph: False, \
input throughput (token/s): 0.00
[2026-11-30 09:00:01 TP0] Decode batch, #running-req: 30, #token: 16000, token usage: 0.02, \
accept len: 2.60, accept rate: 0.40, cuda graph: True, gen throughput (token/s): 3000.00, \
#queue-req: 0
[2026-11-30 09:00:02 TP0] Decode batch, #running-req: 10, #token: 9000, token usage: 0.01, \
accept len: 3.00, accept rate: 0.50, cuda graph: True, gen throughput (token/s): 1500.00, \
#queue-req: 0
[2026-11-30 09:00:04 TP0] Decode batch, #running-req: 5, #token: 3500, token usage: 0.01, \
accept len: 2.70, accept rate: 0.42, cuda graph: True, gen throughput (token/s): 550.00, \
#queue-req: 0
[2026-11-30 09:00:05 TP0] Decode batch, #running-req: 20, #token: 14000, token usage: 0.01, \
accept len: 2.70, accept rate: 0.42, cuda graph: True, gen throughput (token/s): 2800.00, \
#queue-req: 0
[2026-11-30 09:00:06 TP0] Decode batch, #running-req: 50, #token: 35000, token usage: 0.01, \
accept len: 2.70, accept rate: 0.42, cuda graph: True, gen throughput (token/s): 10000.00, \
#queue-req: 0
[2026-11-30 09:00:03 TP0] Decode batch, #running-req: 0, #token: 0, token usage: 0.00, \
accept len: 0.00, accept rate: 0.00, cuda graph: True, gen throughput (token/s): 0.00, #queue-req: 0
"""

# vLLM's Prometheus text (v1/spec_decode/metrics.py counters), two engines' label sets
VLLM_METRICS = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 600.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 400.0
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 1800.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="m"} 1200.0
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 1000.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="m"} 500.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 500.0
"""


def test_sglang_accept_len_lines_give_p_at_the_logged_draft_length():
    """Windows weighted by #running-req (the empty one left out): accept len (30*2.6 + 10*3 +
    75*2.7)/115 = 2.7, k = (accept len - 1) / accept rate ~ 4, p solves E(4, p) = 2.7."""
    fit = fit_from_sglang_lines(SGLANG_SPEC_LOG.splitlines())
    assert fit is not None and fit.k == 4 and fit.steps == 115
    assert fit.accept_len == pytest.approx(2.7)
    assert tokens_per_step(4, fit.p) == pytest.approx(2.7, rel=1e-9)
    assert fit_from_sglang_lines(SGLANG_SPEC_LOG.splitlines(), k=6).k == 6  # given: kept
    assert fit_from_sglang_lines(
        ["Decode batch, #running-req: 3, gen throughput (token/s): 1"]) is None


def test_vllm_counters_give_p_from_accepted_over_drafts():
    """Summed over engines: accept length 1 + 1500/1000 = 2.5, k = 3000/1000 = 3."""
    fit = fit_from_vllm_metrics(VLLM_METRICS)
    assert fit is not None and fit.k == 3 and fit.accept_len == pytest.approx(2.5)
    assert tokens_per_step(3, fit.p) == pytest.approx(2.5, rel=1e-9)
    assert fit_from_vllm_metrics("vllm:num_requests_running 3\n") is None


def test_a_file_without_accepted_tokens_is_refused(tmp_path):
    p = tmp_path / "plain.log"
    p.write_text("[x] Decode batch, #running-req: 3, #token: 10, gen throughput (token/s): 30.0\n")
    with pytest.raises(ValueError, match="accept len"):
        fit_speculative_file(p)


def test_calibrate_writes_the_fit_into_the_preset_a_scenario_runs(tmp_path):
    """`calibrate --sglang-log` on a log with accept len lines fits the cost and the acceptance;
    the preset file's [speculative] loads as the engine's setting (a draft model's acceptance,
    k_max = k), and the report places the measured accept length against the published ones."""
    log = tmp_path / "server.log"
    log.write_text(SGLANG_SPEC_LOG)
    out = tmp_path / "cal.toml"
    res = CliRunner().invoke(main, ["calibrate", "--sglang-log", str(log), "--out", str(out),
                                    "--json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)["speculative"]
    assert got["k"] == 4 and got["accept_len"] == pytest.approx(2.7)
    spec = load_preset_file(out).speculative
    assert spec == SpeculativeSpec(acceptance="model", p=spec.p, k_max=4)
    assert spec.p == pytest.approx(got["p"], rel=1e-12)
    assert "accept length 2.700" in out.read_text()
    # 2.7 is above NeMo-RL's 2.05-2.47 for EAGLE-3 in RL rollouts: said, not refused
    assert "accept length 2.70 is above the published 2.05-2.47" in out.read_text()


def test_calibrate_reads_a_vllm_metrics_page_given_apart(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(SGLANG_SPEC_LOG)
    prom = tmp_path / "metrics.txt"
    prom.write_text(VLLM_METRICS)
    out = tmp_path / "cal.toml"
    res = CliRunner().invoke(main, ["calibrate", "--sglang-log", str(log), "--speculative-log",
                                    str(prom), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert load_preset_file(out).speculative.k_max == 3
    bad = CliRunner().invoke(main, ["calibrate", "--sglang-log", str(log), "--speculative-log",
                                    str(tmp_path / "nope.txt")])
    assert bad.exit_code == 2 and "--speculative-log" in bad.output
