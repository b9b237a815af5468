"""Live-run faults that fail nothing: a hung engine (SIGSTOP), an unreachable URL, signals.

A stopped server keeps its sockets open and answers nothing, so no request fails: before issue
22 the run waited out the client's 600 s read timeout (x 4 attempts). Now the cluster's progress
deadline notices the silence, health-checks the engine, treats it as dead and the runtime
resubmits its work to the others; the fault is reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, VOCAB, free_port, run, start_server
from runner_helpers import assert_batches, assert_ledger, live_run, tiny_scenario

from real.clients.sglang import SGLangClient
from real.runner.cluster import (
    AllEnginesDown,
    Cluster,
    EnginesUnreachable,
    check_reachable,
)


@contextlib.contextmanager
def stopped(proc):
    """SIGSTOP ``proc`` on demand; SIGCONT and stop it whatever happens."""
    try:
        yield lambda: os.kill(proc.popen.pid, signal.SIGSTOP)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.popen.pid, signal.SIGCONT)
        proc.stop()


@pytest.mark.parametrize("name", ["sync", "april"])
def test_a_hung_engine_is_declared_dead_and_its_work_resubmitted(tmp_logs, servers, name):
    """SIGSTOP one of two servers mid-rollout: after 1 s without a token and a failed health
    check it is dead, its requests resume on the other with the tokens they had streamed, the
    run finishes with its ledger balanced and the fault reported."""
    victim = start_server(tmp_logs, "--min-step-seconds", "0.01")
    sc = tiny_scenario(max_len=48, steps=3)
    with stopped(victim) as stop:
        async def main():
            cluster = Cluster([SGLangClient(victim.url), SGLangClient(servers[0].url)],
                              names=["victim", "ok"], progress_deadline_s=1.0,
                              health_timeout_s=1.0)

            async def hang_it():
                slot = cluster.slots[0]
                while slot.outstanding < 2:
                    await asyncio.sleep(0.005)
                await asyncio.sleep(0.1)  # some tokens streamed
                stop()

            k = asyncio.create_task(hang_it())
            t0 = time.monotonic()
            try:
                case = await asyncio.wait_for(live_run(sc, name, cluster, vocab=VOCAB), 50)
                return case, time.monotonic() - t0, cluster.slots[0]
            finally:
                k.cancel()
                await cluster.close()

        case, wall, slot = run(main())
    faults = case.run.faults
    assert faults and {f.engine for f in faults} == {"victim"}
    assert {f.kind for f in faults} == {"engine_died"}
    assert all("hung: no token for" in f.message for f in faults), faults
    assert not slot.alive and slot.hung and "did not answer" in slot.hung
    assert_ledger(case)  # nothing lost: every sample in exactly one place, every id kept
    assert_batches(case)
    assert len(case.run.result.steps) == 3
    assert wall < 40, wall


def test_a_busy_but_healthy_engine_gets_another_deadline(servers):
    """No token for longer than the deadline, but /health answers: the engine stays."""
    class Silent:
        """Streams nothing for 2.5 s, then returns what a real engine would; healthy."""

        def __init__(self, inner):
            self.inner = inner
            self.health_calls = 0

        async def generate(self, request, on_progress=None):
            await asyncio.sleep(2.5)
            return await self.inner.generate(request)

        async def health(self):
            self.health_calls += 1
            return True

        def __getattr__(self, name):
            return getattr(self.inner, name)

    from real.protocol import GenerateRequest

    async def main():
        eng = Silent(SGLangClient(servers[0].url))
        cluster = Cluster([eng], progress_deadline_s=0.5, health_timeout_s=1.0, stalled_after=10)
        try:
            request = GenerateRequest((1, 2, 3), 4, replay_len=4)
            res = await cluster.generate(cluster.slots[0], request)
            return res, eng.health_calls, cluster.slots[0]
        finally:
            await cluster.close()

    res, calls, slot = run(main())
    assert res.error is None and len(res.output_ids) == 4
    assert calls >= 2 and slot.alive and slot.hung is None


class Wedged:
    """Streams two tokens, then nothing ever again; /health keeps answering healthy (a wedged
    scheduler behind a live HTTP server)."""

    def __init__(self) -> None:
        self.health_calls = 0

    async def generate(self, request, on_progress=None):
        from real.protocol import Progress

        on_progress(Progress("r", (7, 8), 2))
        await asyncio.Event().wait()  # forever, until cancelled

    async def health(self):
        self.health_calls += 1
        return True

    async def close(self):
        pass


def test_a_healthy_engine_that_streams_nothing_is_dead_after_n_deadlines():
    """/health answers but no token comes: before, every deadline ended in "healthy, wait
    again", forever. Now ``stalled_after`` such deadlines in a row make it dead; the request
    comes back failed with the tokens it had streamed."""
    from real.protocol import GenerateRequest

    async def main():
        eng = Wedged()
        cluster = Cluster([eng], progress_deadline_s=0.2, health_timeout_s=1.0, stalled_after=3)
        t0 = time.monotonic()
        try:
            res = await asyncio.wait_for(
                cluster.generate(cluster.slots[0], GenerateRequest((1, 2, 3), 8)), 20)
            return res, eng.health_calls, cluster.slots[0], time.monotonic() - t0
        finally:
            await cluster.close()

    res, calls, slot, wall = run(main())
    assert calls == 3 and not slot.alive
    assert slot.hung.startswith("stalled: /health answered but no token came for")
    assert "3 progress deadlines of 0.2s in a row" in slot.hung
    assert res.error and "stalled" in res.error and res.output_ids == [7, 8]
    assert 0.6 <= wall < 10, wall


def test_stalls_need_consecutive_deadlines_and_pauses_do_not_count():
    """A token between healthy deadlines starts the count again, and a deadline met while the
    cluster is paused (a weight sync) is no stall."""
    from real.protocol import GenerateRequest, Progress

    class Trickle(Wedged):
        async def generate(self, request, on_progress=None):
            for _ in range(6):  # a token every 2.5 deadlines: two healthy deadlines between
                on_progress(Progress("r", (5,), 1))
                await asyncio.sleep(0.5)
            return await Wedged().generate(request, on_progress)

    async def main():
        eng = Trickle()
        cluster = Cluster([eng], progress_deadline_s=0.2, health_timeout_s=1.0, stalled_after=3)
        try:
            task = asyncio.ensure_future(cluster.generate(cluster.slots[0],
                                                          GenerateRequest((1,), 9)))
            await asyncio.sleep(3.2)  # 6 tokens: never 3 healthy deadlines in a row
            alive_while_trickling = cluster.slots[0].alive
            await cluster.pause()  # now silent for good, but paused: nothing counts
            await asyncio.sleep(1.5)
            alive_while_paused = cluster.slots[0].alive
            await cluster.resume()
            res = await asyncio.wait_for(task, 20)
            return alive_while_trickling, alive_while_paused, res, cluster.slots[0]
        finally:
            await cluster.close()

    trickling, paused, res, slot = run(main())
    assert trickling and paused
    assert not slot.alive and "stalled" in slot.hung and "stalled" in res.error


def test_a_wedged_local_engine_is_dead_its_work_resubmitted_and_reported():
    """A run on two in-process engines, one of which stops generating mid-rollout while its
    /health stays healthy: after 2 stalled deadlines it is dead, its requests finish on the other
    engine, the ledger balances and the fault says why."""
    from runner_helpers import local_spec

    from real.runner.local import start_local

    sc = tiny_scenario(max_len=48, steps=3)

    async def main():
        engines = await start_local(2, local_spec())
        cluster = Cluster(engines, names=["victim", "ok"], progress_deadline_s=0.3,
                          health_timeout_s=1.0, stalled_after=2)

        async def wedge_it():
            slot = cluster.slots[0]
            while slot.outstanding < 2 or slot.tokens + slot.outstanding < 3:
                await asyncio.sleep(0.005)
            await engines[0].pause()  # its scheduler stops; /health still answers

        k = asyncio.create_task(wedge_it())
        try:
            case = await asyncio.wait_for(live_run(sc, "sync", cluster), 60)
            return case, cluster.slots[0]
        finally:
            k.cancel()
            await cluster.close()

    case, slot = run(main())
    faults = case.run.faults
    assert faults and {f.engine for f in faults} == {"victim"}
    assert {f.kind for f in faults} == {"engine_died"}
    assert all("stalled: /health answered" in f.message for f in faults), faults
    assert not slot.alive
    assert_ledger(case)
    assert_batches(case)
    assert len(case.run.result.steps) == 3


def test_unreachable_engines_are_refused_before_the_first_step_in_one_line(tmp_path, servers):
    from test_runner_http import _scenario_file

    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "aprilsim", "run", str(_scenario_file(tmp_path, steps=2)),
         "--engines", f"{servers[0].url},{dead}", "-s", "sync"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.monotonic() - t0
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("aprilsim: error: "), done.stderr
    assert dead in lines[0] and "not reachable" in lines[0] and "step" not in done.stderr
    assert wall < 30, wall  # the whole command, imports included, on a loaded machine


def test_the_reachability_check_takes_under_two_seconds():
    """A refused port and a port that accepts but never answers, asked at once."""
    with socket.socket() as mute:
        mute.bind(("127.0.0.1", 0))
        mute.listen(16)  # the kernel completes connections; nothing ever reads them
        urls = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{mute.getsockname()[1]}"]

        async def main():
            cluster = Cluster([SGLangClient(u) for u in urls], names=urls)
            t0 = time.monotonic()
            try:
                with pytest.raises(EnginesUnreachable) as e:
                    await check_reachable(cluster)
                return str(e.value), time.monotonic() - t0
            finally:
                await cluster.close()

        msg, took = run(main())
    assert took < 2.0, took
    assert urls[0] in msg and "and 1 more" in msg


def test_all_engines_gone_says_it_once():
    async def main():
        cluster = Cluster([SGLangClient("http://127.0.0.1:9")], names=["a"])
        cluster.slots[0].mark_dead("hung: no token for 3.0s")
        with pytest.raises(AllEnginesDown) as e:
            cluster.pick()
        await cluster.close()
        return str(e.value)

    msg = run(main())
    assert "1 of 1 dead" in msg and "a: hung: no token" in msg
    from real.runner import api

    text = "all engines are gone: " + msg  # what run_all writes
    assert text.count("gone") == 1 and "every engine is gone" not in text
    assert 'f"all engines are gone: {e}' in Path(api.__file__).read_text()


def test_signals_before_the_run_loop_exit_130_with_a_line():
    from real.runner.cli import early_signals_interrupt
    from real.runner.options import EXIT_INTERRUPTED

    with pytest.raises(SystemExit) as e, early_signals_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this ends
    assert e.value.code == EXIT_INTERRUPTED
    with pytest.raises(SystemExit) as e, early_signals_interrupt():
        raise KeyboardInterrupt
    assert e.value.code == EXIT_INTERRUPTED
    assert signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None) or callable(
        signal.getsignal(signal.SIGTERM))


def test_aprilsim_run_sigterm_while_loading_exits_130_not_143(tmp_path):
    """The scenario is a FIFO nobody writes yet: the command blocks reading it, before any
    asyncio loop exists; SIGTERM then gives one line and 130."""
    fifo = tmp_path / "scenario.toml"
    os.mkfifo(fifo)
    proc = subprocess.Popen([sys.executable, "-m", "aprilsim", "run", str(fifo), "--engines",
                             "http://127.0.0.1:9", "-s", "sync"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        wchan = Path(f"/proc/{proc.pid}/wchan")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(OSError):
                if wchan.read_text().strip() in ("wait_for_partner", "fifo_open"):
                    break
            time.sleep(0.05)
        else:
            if proc.poll() is not None:
                pytest.skip(f"the command did not block on the FIFO: {proc.stderr.read()[-300:]}")
            time.sleep(3)  # no wchan here: give it time to reach the read
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, (proc.returncode, err)
    assert err.strip().splitlines() == [
        "aprilsim: error: interrupted before the run started; nothing was sent to the engines"]


def test_aprilsim_run_reports_a_hung_engine_and_finishes(tmp_path, tmp_logs, servers):
    """The CLI end to end: --progress-deadline 1, one of two servers SIGSTOPped after the first
    step: exit 0, every step written, the fault in the notes."""
    from test_runner_http import _scenario_file

    victim = start_server(tmp_logs, "--min-step-seconds", "0.01")
    steps_out = tmp_path / "steps.jsonl"
    with stopped(victim) as stop:
        proc = subprocess.Popen(
            [sys.executable, "-m", "aprilsim", "run", str(_scenario_file(tmp_path, steps=4)),
             "--engines", f"{victim.url},{servers[1].url}", "-s", "sync",
             "--progress-deadline", "1", "--steps-out", str(steps_out)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
        try:
            seen = ""
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and "step 1/" not in seen:
                line = proc.stderr.readline()
                if not line:
                    break
                seen += line
            stop()
            out, err = proc.communicate(timeout=50)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0, seen + err
    rows = [json.loads(line) for line in steps_out.read_text().splitlines()]
    assert len(rows) == 4 and all(r["trained_groups"] == 3 for r in rows)
    notes = [ln for ln in err.splitlines() if "fault at" in ln]
    assert notes and all(victim.url in ln and "engine_died" in ln and "hung" in ln
                         for ln in notes), err
