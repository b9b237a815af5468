"""The live runner over HTTP: bundled servers by URL and behind the real sglang-router, faults
(a server killed mid-rollout, a cut stream, a 503), every engine gone, Ctrl-C."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from conftest import ROOT, VOCAB, run, start_server
from fault_proxy import FaultProxy, Faults
from runner_helpers import assert_batches, assert_ledger, live_run, tiny_scenario

from aprilsim.sim.run import simulate
from real.clients.sglang import ClientConfig, RetryPolicy, SGLangClient
from real.runner.cluster import Cluster

NO_RETRY = ClientConfig(retry=RetryPolicy(max_attempts=1), read_timeout_s=20, connect_timeout_s=2)


def _check(case, name: str) -> None:
    assert_ledger(case)
    assert_batches(case)
    r = case.run.result
    if name == "sync":
        sim = simulate(case.scenario, "sync")
        assert [s.trained_tokens for s in r.steps] == [s.trained_tokens for s in sim.steps]
        assert r.end_state == sim.end_state
    if name == "april":  # discards: only groups completing with the N-th (slime drops them)
        dropped = sum(s.scheduler_stats.get("dropped_groups", 0) for s in r.steps)
        assert r.end_state["samples_discarded"] == dropped * case.scenario.group_size


@pytest.mark.parametrize("name", ["sync", "april"])
def test_through_the_router(router, name):
    """One engine slot = the router; abort fans out to its workers."""
    async def main():
        cluster = Cluster([SGLangClient(router.url)], names=["router"])
        try:
            return await live_run(tiny_scenario(steps=2), name, cluster, vocab=VOCAB)
        finally:
            await cluster.close()

    _check(run(main()), name)


@pytest.mark.parametrize("name", ["april", "fully_async"])
def test_engine_urls(servers, name):
    async def main():
        cluster = Cluster([SGLangClient(s.url) for s in servers], names=[s.url for s in servers])
        try:
            return await live_run(tiny_scenario(steps=2), name, cluster, vocab=VOCAB)
        finally:
            await cluster.close()

    case = run(main())
    _check(case, name)
    assert all(b > 0 for b in case.run.result.steps[0].busy_by_engine_s)


def test_server_killed_mid_rollout(fresh_server, servers):
    """kill -9 one of two servers mid-rollout: partials resume on the other, nothing is lost."""
    sc = tiny_scenario(max_len=64, steps=2)

    async def main():
        dying = SGLangClient(fresh_server.url, config=ClientConfig(
            retry=RetryPolicy(max_attempts=2, initial_backoff_s=0.02), connect_timeout_s=2))
        cluster = Cluster([dying, SGLangClient(servers[0].url)], names=["dying", "ok"])

        async def killer():
            while cluster.slots[0].outstanding < 3:
                await asyncio.sleep(0.005)
            await asyncio.sleep(0.15)
            fresh_server.kill()

        k = asyncio.create_task(killer())
        try:
            return await live_run(sc, "sync", cluster, vocab=VOCAB)
        finally:
            k.cancel()
            await cluster.close()

    case = run(main())
    assert case.run.faults and all(f.engine == "dying" for f in case.run.faults)
    assert "engine_died" in {f.kind for f in case.run.faults}
    _check(case, "sync")


@pytest.mark.parametrize("fault", [Faults(n=3, status_503=True), Faults(n=3, cut_after=4)],
                         ids=["503", "cut-stream"])
def test_failed_requests_are_resubmitted(servers, fault):
    """With no retry in the adapter, a 503 or a cut stream reaches the runner as a failed
    request with partial output: it is resubmitted, the engine stays in the cluster."""
    async def main():
        async with FaultProxy(servers[0].url, fault) as proxy:
            cluster = Cluster([SGLangClient(proxy.url, config=NO_RETRY)], names=["proxy"])
            try:
                return await live_run(tiny_scenario(steps=1), "april", cluster, vocab=VOCAB)
            finally:
                await cluster.close()

    case = run(main())
    faults = case.run.faults  # one fault per failure burst, counting its requests
    assert {f.kind for f in faults} == {"request_failed"} and sum(f.requests for f in faults) == 3
    assert len(faults) == len({f.message for f in faults}), faults
    _check(case, "april")


def test_timed_out_requests_are_resubmitted(servers):
    """Streams that go silent hit the client's read timeout: the partial output is kept and the
    remainder resubmitted; nothing is lost."""
    from hang_proxy import HangProxy

    cfg = ClientConfig(retry=RetryPolicy(max_attempts=1), read_timeout_s=0.4, connect_timeout_s=2)

    async def main():
        async with HangProxy(servers[0].url, n=2) as proxy:
            cluster = Cluster([SGLangClient(proxy.url, config=cfg)], names=["proxy"])
            try:
                return await live_run(tiny_scenario(steps=1), "sync", cluster, vocab=VOCAB)
            finally:
                await cluster.close()

    case = run(main())
    kinds = [f.kind for f in case.run.faults]
    # the two hung streams time out; on a loaded machine a slow real stream may too (0.4 s)
    assert sum(f.requests for f in case.run.faults) >= 2 and set(kinds) == {"request_failed"}
    assert all("Timeout" in f.message for f in case.run.faults)
    _check(case, "sync")


def _cli(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "aprilsim", "run", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, **kw)


def _scenario_file(tmp_path, steps: int, max_len: int = 64):
    from test_runner import TINY_TOML

    p = tmp_path / "tiny.toml"
    p.write_text(TINY_TOML.replace("steps = 2", f"steps = {steps}")
                 .replace("max_response_len = 40", f"max_response_len = {max_len}"))
    return p


def test_all_engines_gone_exits_1_after_writing_finished_steps(tmp_path, tmp_logs):
    """The only server dies after two steps: one error line, exit code 1, finished steps written."""
    from click.testing import CliRunner

    from aprilsim.cli import main

    server = start_server(tmp_logs, "--min-step-seconds", "0.01")
    steps_out = tmp_path / "steps.jsonl"

    def kill_after_two_steps() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not _served(server, 2 * 3 * 2 + 4):
            time.sleep(0.05)
        server.kill()

    killer = threading.Thread(target=kill_after_two_steps, daemon=True)
    killer.start()
    try:
        res = CliRunner().invoke(main, ["run", str(_scenario_file(tmp_path, steps=50)), "--engines",
                                        server.url, "-s", "sync", "--steps-out", str(steps_out),
                                        "--json"])
    finally:
        killer.join(timeout=60)
        server.stop()
    assert res.exit_code == 1, res.output
    lines = [line for line in res.stderr.splitlines() if line.startswith("aprilsim: error")]
    assert len(lines) == 1 and "all engines are gone" in lines[0]
    rows = [json.loads(line) for line in steps_out.read_text().splitlines()]
    assert len(rows) >= 2 and all(r["scheduler"] == "sync" for r in rows)


def _served(server, n: int) -> bool:
    """True once the server has received ``n`` generate requests."""
    try:
        with urllib.request.urlopen(server.url + "/server_info", timeout=1) as r:
            return json.loads(r.read())["internal_states"][0]["total_requests"] >= n
    except OSError:
        return False


def test_ctrl_c_aborts_and_writes_finished_steps(tmp_path, servers):
    steps_out = tmp_path / "steps.jsonl"
    proc = _cli(str(_scenario_file(tmp_path, steps=50)), "--engines", servers[1].url,
                "-s", "april", "--steps-out", str(steps_out))
    seen = ""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "step 2/" not in seen:
        seen += proc.stderr.readline()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err
    rows = [json.loads(line) for line in steps_out.read_text().splitlines()]
    assert len(rows) >= 2
    async def loads():
        async with SGLangClient(servers[1].url) as c:
            return await c.loads(servers[1].url)

    loads = run(loads())
    assert loads is not None and loads["num_running_reqs"] + loads["num_waiting_reqs"] == 0
