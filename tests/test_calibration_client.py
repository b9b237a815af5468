"""What `calibrate` says of the client overhead and the prefix cache (issue 19 item 5)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from aprilsim.cli import main
from aprilsim.config import load_preset_file
from aprilsim.engine.calibration.client import (
    client_overhead_lines,
    fit_client_overhead,
    sglang_cached_share,
)
from aprilsim.engine.calibration.preset import write_preset
from aprilsim.engine.cost import CostModel

COST = CostModel(a=0.01, b=1e-4, c=1e-7, p0=0.02, p1=1e-5, p2=1e-8, pr=1e-3)
WALLS = [(n, COST.prefill_time(n, n * n, 1, 1) + 0.031 + j * 1e-3) for n in (32, 128, 512)
         for j in (-1, 0, 1)]


def test_client_overhead_is_the_median_gap_between_client_and_engine_time():
    assert fit_client_overhead(COST, WALLS) == pytest.approx(0.031)
    assert fit_client_overhead(COST, [(32, 1e-6)]) == 0.0  # never negative
    assert fit_client_overhead(COST, []) is None


@pytest.mark.parametrize(("timing", "fitted"), [("iteration log", True), ("vLLM /metrics", True),
                                                ("token stream", False)])
def test_client_overhead_is_fitted_only_from_engine_side_timings(timing, fitted):
    info = {"client_walls": WALLS, "timing": timing}
    got = client_overhead_lines(COST, info)
    if fitted:
        assert got == pytest.approx(0.031) and "client_overhead_s" in info["measured"][0]
    else:
        assert got is None and "not fitted" in info["assumed"][0]


def test_the_preset_records_the_client_overhead(tmp_path):
    p = tmp_path / "cal.toml"
    write_preset(p, COST, client_overhead_s=0.031)
    spec = load_preset_file(p)
    assert spec.client_overhead_s == pytest.approx(0.031) and spec.cost == COST
    write_preset(p, COST)
    assert load_preset_file(p).client_overhead_s == 0.0


PREFILL = ("[2026-11-30 09:00:00 TP0] Prefill batch, #new-seq: 2, #new-token: {}, "
           "#cached-token: 100, token usage: 0.01, #running-req: 0, #queue-req: 1, "
           "#pending-token: 0, cuda graph: False, input throughput (token/s): 100.00\n")
LOG = PREFILL.format(300) + "".join(
    f"[2026-11-30 09:00:01 TP0] Decode batch, #running-req: {b}, #token: {k}, token usage: 0.02, "
    f"cuda graph: True, gen throughput (token/s): {b / (0.01 + 1e-4 * b + 1e-7 * k):.2f}, "
    "#queue-req: 0\n" for b in (1, 4, 16) for k in (1000, 20000)) + PREFILL.format(500)


def test_an_sglang_log_reports_what_its_prefix_cache_served(tmp_path):
    assert sglang_cached_share(LOG.splitlines()) == pytest.approx(200 / 1000)
    assert sglang_cached_share(["Decode batch, #running-req: 3"]) is None
    p = tmp_path / "server.log"
    p.write_text(LOG)
    res = CliRunner().invoke(main, ["calibrate", "--sglang-log", str(p), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["prefix_hit_share"] == pytest.approx(0.2)
    assert any("prefix cache served 20.0%" in m for m in out["measured"])
    p.write_text(LOG.replace("#cached-token: 100", "#cached-token: 0"))
    out = json.loads(CliRunner().invoke(main, ["calibrate", "--sglang-log", str(p),
                                               "--json"]).stdout)
    assert out["prefix_hit_share"] == 0.0
