"""The machine check (issue 35, item 3): delivery bursts, event-loop lag, /proc CPU shares, the
starved flag, and starved rounds left out of every verdict."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import pytest

from aprilsim.validate.reconstruct import StreamLog
from aprilsim.validate.starvation import BURST_SHARE, LAG_P99_MS, delivery, starved


def _steady(n_req: int = 8, steps: int = 50, gap: float = 0.01) -> list[StreamLog]:
    """Requests receiving one token per iteration, ``gap`` apart, as a quiet client sees them."""
    logs = []
    for i in range(n_req):
        lg = StreamLog(submitted=0.0, input_tokens=4, finished=steps * gap + 0.001)
        lg.events = [((k + 1) * gap + 1e-5 * i, 1) for k in range(steps)]
        logs.append(lg)
    return logs


def test_a_steady_stream_has_no_bursts_and_a_starved_one_has():
    quiet = delivery(_steady())
    assert quiet["burst_share"] == 0.0 and quiet["max_silence_s"] == pytest.approx(0.01, abs=2e-4)
    starved_logs = _steady()
    for lg in starved_logs:  # the client read 10 iterations' tokens at once, after a silence
        lg.events = [(0.1 * (k + 1) + 1e-6 * j, 1) for k in range(5) for j in range(10)]
    d = delivery(starved_logs)
    assert d["burst_share"] == 1.0 and d["max_silence_s"] == pytest.approx(0.1, abs=1e-3)
    assert starved({"burst_share": d["burst_share"]})[0]
    assert delivery([])["burst_share"] is None


def test_the_starved_flag_names_every_threshold_crossed():
    ok, why = starved({"loop_lag_ms": {"p99": 5.0}, "run_delay_share": 0.05, "burst_share": 0.1,
                       "other_cpu_share": 0.2})
    assert not ok and why == ""
    ok, why = starved({"loop_lag_ms": {"p99": LAG_P99_MS + 1}, "run_delay_share": 0.5,
                       "burst_share": BURST_SHARE + 0.1, "other_cpu_share": 0.95})
    assert ok and why.count(";") == 3 and "event-loop lag" in why and "other processes" in why


def test_loop_lag_sees_a_blocked_loop():
    from real.machine import LoopLag

    async def go():
        lag = LoopLag(0.005)
        lag.start()
        await asyncio.sleep(0.05)
        time.sleep(0.12)  # the loop blocked, as a starved client's is
        await asyncio.sleep(0.02)
        return await lag.stop()
    got = asyncio.run(go())
    assert got["max"] >= 100 and got["samples"] >= 5


def test_proc_accounting_tells_our_children_from_other_processes():
    """A child that burns CPU is ours (client share), not other processes'; /proc/stat parses."""
    from real.machine import CpuWindow, cpu_times

    t = cpu_times("cpu  10 2 3 100 4 5 6 7 0 0\ncpu0 1 1 1 1 1 1 1 1\n")
    assert t == {"busy": 10 + 2 + 3 + 5 + 6, "steal": 7, "total": 137}
    if not os.path.exists("/proc/self/stat"):
        pytest.skip("no /proc")
    w = CpuWindow()
    w.start()
    burn = "import time\nwhile time.process_time() < 0.5: pass\nprint('done', flush=True)\n"
    child = subprocess.Popen([sys.executable, "-c", burn + "time.sleep(5)"],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "done"  # alive (sleeping) when the window closes
    got = w.stop()
    child.kill()
    child.wait()
    assert got["client_cpu_share"] * got["cpus"] * got["wall_s"] >= 0.45, got
    assert 0.0 <= got["other_cpu_share"] <= 1.0 and got["run_delay_share"] >= 0.0


def test_engine_processes_are_found_by_their_loopback_port():
    from real.machine import engine_pids

    if not os.path.exists("/proc/net/tcp"):
        pytest.skip("no /proc")
    srv = subprocess.Popen([sys.executable, "-c",
                            "import socket,time\ns=socket.socket()\ns.bind(('127.0.0.1',0))\n"
                            "s.listen()\nprint(s.getsockname()[1],flush=True)\ntime.sleep(30)"],
                           stdout=subprocess.PIPE, text=True)
    try:
        port = int(srv.stdout.readline())
        assert engine_pids([f"http://127.0.0.1:{port}"]) == [srv.pid]
        assert engine_pids([f"vllm+http://localhost:{port}"]) == [srv.pid]
        assert engine_pids([f"http://10.255.0.1:{port}"]) == []  # not this machine's loopback
    finally:
        srv.kill()
        srv.wait()


def test_starved_rounds_are_left_out_of_every_verdict(tmp_path):
    """Round 2 of 3 starved (its measured times 3x): left out, the verdicts come from rounds 1
    and 3, and the report says which round was left out and why."""
    import copy

    from test_validate import TRUE, small_scenario

    from aprilsim.metrics.trace import Trace
    from aprilsim.validate import simulate_matched
    from aprilsim.validate.scaled import matched_engine
    from real.runner.options import EngineTarget
    from real.validate import LiveOutcome, ValidateOptions, judge, write_all

    sc = small_scenario()
    cal = tmp_path / "cal.toml"
    cal.write_text("[cost]\na = 2e-3\nb = 1e-4\nc = 1e-6\np0 = 1e-3\np1 = 5e-4\n")
    eng = matched_engine(TRUE, max_running=64, kv_capacity=5120)
    outs = []
    for r in range(3):
        for lab in ("sync", "april"):
            res = simulate_matched(sc, lab, eng, n_engines=2, scale=1 / 256, seed=1, steps=4)
            res = copy.deepcopy(res)
            for s in res.steps:
                s.rollout_time_s *= 3.0 if r == 1 else 1.0
            o = LiveOutcome(lab, res, [[], []], Trace(scheduler=lab, n_engines=2), 1.0, 0.0,
                            round=r)
            o.machine = {"starved": r == 1,
                         "why": "event-loop lag p99 90 ms > 50" if r == 1 else "",
                         "loop_lag_ms": {"p50": 1.0, "p99": 90.0 if r == 1 else 2.0, "max": 95.0}}
            outs.append(o)
    opts = ValidateOptions(EngineTarget(engines=("saved",)), seed=1, steps=4, scale=1 / 256,
                           calibration=cal, repeats=3)
    limits = {"max_running": 64, "kv_capacity": 5120}
    v = judge(sc, ["sync", "april"], opts, outs, limits, "x", [], 0.0)
    rep = write_all(v, tmp_path / "out", figures=False)
    assert rep["meta"]["rounds"] == 2 and rep["machine"]["starved_rounds"] == [1]
    assert rep["targets"]["step_rollout_error"]["worst"] == pytest.approx(0.0, abs=1e-9)
    assert rep["targets"]["step_rollout_error"]["verdict"] == "met"
    md = (tmp_path / "out" / "report.md").read_text()
    assert "1 of 3 rounds left out of every verdict, starved: event-loop lag p99 90 ms in 2" in md
    assert "| sync round 2 | 1.0 / 90.0 / 95.0 |" in md
