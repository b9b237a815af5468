"""Engine events of a live run, as the user hears of them (issue 36, items 6-9).

6. A server that hangs while APRIL's abort waits on it is a fault: one `engine_died` line that
   says so, with the requests it cost, and which steps ran without it (it was a silent
   `0 faults` while the rest of the run went on one engine).
7. A dead engine that serves again (SIGCONTed, or restarted on the same URL) is probed with
   back-off and re-admitted between steps, with a line; before, it got no request again.
8. One fault per engine event, with its request count (not one line per request).
9. A silence under the progress deadline is said while it lasts, and when tokens flow again;
   a signal before the run loop exits 130 with one line (not -15, not click's `Aborted!`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT, VOCAB, run, start_server
from runner_helpers import assert_ledger, live_run, tiny_scenario

from real.clients.sglang import SGLangClient
from real.protocol import GenerateRequest, Progress
from real.runner.cluster import Cluster, Fault
from real.runner.faults import FaultLog, fault_line


class HangsOnAbort:
    """A server's client whose first abort reaching it while it holds >= 2 requests stops the
    server first (SIGSTOP): the engine hangs exactly while the abort waits on it."""

    def __init__(self, inner: SGLangClient, pid: int) -> None:
        self.inner, self.pid, self.slot, self.stopped_at = inner, pid, None, None

    async def abort_all(self):
        if self.stopped_at is None and self.slot is not None and self.slot.outstanding >= 2:
            os.kill(self.pid, signal.SIGSTOP)
            self.stopped_at = time.monotonic()
        return await self.inner.abort_all()

    def __getattr__(self, name):
        return getattr(self.inner, name)


@contextlib.contextmanager
def continued(proc):
    """Whatever happens, the server runs again (SIGCONT) and is stopped at the end."""
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.popen.pid, signal.SIGCONT)
        proc.stop()


def test_a_hang_during_aprils_abort_is_one_fault_and_the_engine_comes_back(tmp_logs, servers):
    """Items 6, 7, 8 on two servers: the victim hangs when APRIL's abort reaches it. The
    progress deadline finds it dead: one engine_died fault counting the requests the abort was
    waiting for, said at once; then SIGCONT: it is probed, re-admitted for a later step (on the
    run's weights) and serves again; the ledger balances."""
    victim = start_server(tmp_logs, "--min-step-seconds", "0.01")
    sc = tiny_scenario(max_len=48, steps=8)
    said: list[tuple[float, str]] = []
    with continued(victim):
        async def main():
            eng = HangsOnAbort(SGLangClient(victim.url), victim.popen.pid)
            cluster = Cluster([eng, SGLangClient(servers[0].url)], names=["victim", "ok"],
                              progress_deadline_s=1.0, health_timeout_s=1.0)
            eng.slot = cluster.slots[0]

            async def cont_once_dead():
                while cluster.slots[0].alive:
                    await asyncio.sleep(0.02)
                await asyncio.sleep(0.3)
                os.kill(victim.popen.pid, signal.SIGCONT)

            k = asyncio.create_task(cont_once_dead())
            try:
                case = await asyncio.wait_for(
                    live_run(sc, "april", cluster, vocab=VOCAB,
                             notify=lambda line: said.append((time.monotonic(), line))), 90)
                return case, eng, cluster.slots[0]
            finally:
                k.cancel()
                await cluster.close()

        case, eng, slot = run(main())
    assert eng.stopped_at is not None, "APRIL never aborted while the victim held requests"
    faults = case.run.faults
    assert len(faults) == 1, faults  # one event, however many requests it cost
    f = faults[0]
    assert (f.engine, f.kind) == ("victim", "engine_died") and f.requests >= 2, f
    assert f.message.startswith("hung: no token for") and "while an abort waited on it" in f.message
    lines = [line for _, line in said]
    print("\n".join(lines))
    dropped = [ln for ln in lines if ln.startswith("engine victim dropped")]
    assert dropped == [f"engine victim dropped at {f.t:.1f}s in step {f.step}: {f.message}"], lines
    # back for a later step, on the weights the others serve, and given work again
    assert f.back_at is not None and f.back_at > f.step, f
    assert slot.alive and slot.readmissions == 1
    assert any(line.startswith(f"engine victim re-admitted for step {f.back_at}: serving again")
               for line in lines), lines
    steps = case.run.result.steps
    assert any(s.busy_by_engine_s[0] > 0 for s in steps[f.back_at:]), \
        [s.busy_by_engine_s for s in steps]
    assert all(s.busy_by_engine_s[0] == 0 for s in steps[f.step + 1:f.back_at])
    gone = "" if f.back_at == f.step + 1 else "out for step"
    assert gone in fault_line(f, len(steps)) and f"re-admitted for step {f.back_at}" in \
        fault_line(f, len(steps))
    assert_ledger(case)
    assert len(steps) == 8


def test_aprilsim_run_says_a_death_once_and_readmits_a_restarted_server(tmp_path, tmp_logs,
                                                                         servers):
    """The CLI end to end (items 7, 8): `aprilsim run --engines U1,U2 -s april`; U1 is SIGKILLed
    after the first step and a new server started on its URL. Stderr says the drop once, then
    the re-admission; the run's notes hold one fault line for the death, with its request count
    and the steps it was out; the re-admitted engine serves steps again; Ctrl-C then ends the
    run with 130 and the finished steps written."""
    import json

    from test_runner_http import _scenario_file

    victim = start_server(tmp_logs, "--min-step-seconds", "0.01")
    port = int(victim.url.rsplit(":", 1)[1])
    sc = _scenario_file(tmp_path, steps=500)
    sc.write_text(sc.read_text().replace("base_s = 0.01", "base_s = 0.1"))
    steps_out = tmp_path / "steps.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "aprilsim", "run", str(sc), "--engines",
         f"{victim.url},{servers[1].url}", "-s", "april", "--progress-deadline", "2",
         "--steps-out", str(steps_out)], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    reborn = None
    seen: list[str] = []

    def until(what: str, timeout: float = 90) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            seen.append(line.rstrip("\n"))
            if what in line:
                return line
        raise AssertionError(f"no {what!r} in:\n" + "\n".join(seen[-30:]))

    try:
        until("april: step 1/")
        victim.kill()
        dropped = until(f"april: engine {victim.url} dropped at")
        reborn = start_server(tmp_logs, "--min-step-seconds", "0.01", port=port)
        back = until(f"april: engine {victim.url} re-admitted for step ")
        back_at = int(back.split("re-admitted for step ")[1].split(":")[0])
        until(f"april: step {back_at + 3}/")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if reborn is not None:
            reborn.stop()
        victim.stop()
    lines = seen + err.splitlines()
    assert proc.returncode == 130, "\n".join(lines[-20:])
    assert sum("dropped at" in ln for ln in lines) == 1, dropped
    faults = [ln for ln in lines if "fault at" in ln]
    assert len(faults) == 1, faults  # one line for the death, not one per request
    assert f"on {victim.url}: engine_died in step " in faults[0]
    n = int(faults[0].split(", ")[1].split(" request")[0])
    assert n >= 1 and f"re-admitted for step {back_at}" in faults[0], faults[0]
    print("\n".join(ln for ln in lines if "step " not in ln[:20]))
    rows = [json.loads(ln) for ln in steps_out.read_text().splitlines()]
    assert len(rows) >= back_at + 2
    assert any(r["busy_by_engine_s"][0] > 0 for r in rows[back_at:]), rows[back_at:]


# ---------------------------------------------------------------- without servers (fast)
class Scripted:
    """An engine whose health and one-token answers the test switches: ``up`` (serves),
    ``wedged`` (/health answers, generation hangs), or neither (refuses everything)."""

    def __init__(self) -> None:
        self.up = self.wedged = False
        self.health_calls, self.calls = 0, []

    async def health(self):
        self.health_calls += 1
        return self.up or self.wedged

    async def generate(self, request, on_progress=None):
        from aprilsim.types import FinishReason
        from real.protocol import GenerateResult, Timings

        if self.wedged:
            await asyncio.Event().wait()
        now = time.monotonic()
        return GenerateResult("r", request, [5] if self.up else [], FinishReason.LENGTH,
                              Timings(now, now, now), error=None if self.up else "refused")

    async def abort_all(self):
        self.calls.append("abort_all")

    async def update_weights(self, version, path=None):
        self.calls.append(f"update_weights {version}")

    async def pause(self):
        pass

    async def resume(self):
        pass

    async def close(self):
        pass


def test_a_dead_engine_is_probed_with_back_off_and_readmitted_once_it_serves():
    """Item 7 at the cluster: probes come at growing intervals while the engine refuses, one
    that answers /health but does not generate (wedged) is not taken, and one that serves
    again is re-admitted only by `readmit` (between steps): what it held aborted, the run's
    weights loaded, its death forgotten."""
    async def main():
        eng = Scripted()
        cluster = Cluster([eng], progress_deadline_s=None, health_timeout_s=0.2)
        slot = cluster.slots[0]
        slot.backoff = 0.1
        slot.mark_dead("killed")
        cluster.watch()
        try:
            await asyncio.sleep(1.7)  # probes at ~0.1, 0.3, 0.7, 1.5 s: back-off doubles
            refused = eng.health_calls
            eng.wedged = True
            await asyncio.sleep(1.0)
            wedged_serving = slot.serving_since
            assert await cluster.readmit(3) == []  # nobody found serving: nobody back
            eng.wedged, eng.up = False, True
            while slot.serving_since is None:
                await asyncio.sleep(0.05)
            alive_before = slot.alive
            back = await cluster.readmit(3, "/ckpt")
            return refused, wedged_serving, alive_before, back, slot, eng
        finally:
            await cluster.close()

    refused, wedged_serving, alive_before, back, slot, eng = run(main())
    assert 3 <= refused <= 5, refused  # not every watchdog tick (0.5 s) nor once: back-off
    assert wedged_serving is None  # /health alone does not bring an engine back
    assert not alive_before and back == [slot] and slot.alive and slot.hung is None
    assert eng.calls == ["abort_all", "update_weights 3"]
    assert slot.readmissions == 1 and slot.backoff == 2.0  # a second death waits longer


def test_a_silence_under_the_deadline_is_said_while_it_lasts_and_when_it_ends():
    """Item 9: an engine that streams, then nothing for 1.6 s (under its 10 s deadline), then
    streams again: the cluster says so after 0.3 s, 0.6 s and 1.2 s, then that it streams
    again; a healthy engine's ordinary gaps say nothing."""
    from aprilsim.types import FinishReason
    from real.protocol import GenerateResult, Timings

    class Pauses:
        async def generate(self, request, on_progress=None):
            for gap in (0.02, 0.02, 1.6, 0.02):
                on_progress(Progress("r", (7,), 1))
                await asyncio.sleep(gap)
            now = time.monotonic()
            return GenerateResult("r", request, [7] * 4, FinishReason.LENGTH,
                                  Timings(now, now, now))

        async def health(self):
            return True

        async def close(self):
            pass

    async def main():
        cluster = Cluster([Pauses()], names=["e"], progress_deadline_s=10.0)
        assert cluster.stall_note_s == 5.0  # half the deadline, at most STALL_NOTE_S (10 s)
        cluster.stall_note_s = 0.3
        notes: list[str] = []
        cluster.on_note = notes.append
        try:
            await cluster.generate(cluster.slots[0], GenerateRequest((1, 2), 4))
            await asyncio.sleep(0.6)  # the watchdog's next ticks
            return notes
        finally:
            await cluster.close()

    notes = run(main())
    waiting = [n for n in notes if n.startswith("waiting on e: no token for ")]
    assert len(waiting) == 3, notes  # at 0.3, 0.6 and 1.2 s of silence: doubling, not each tick
    assert all(n.endswith("from its 1 requests; health check after 10s without one")
               for n in waiting), waiting
    again = [n for n in notes if n.startswith("e streams again after ")]
    assert len(again) == 1 and 1.5 <= float(again[0].split("after ")[1].split("s")[0]) < 2.8


def test_one_fault_per_engine_event_and_what_its_line_says():
    """Item 8: a death counts every request it cost on one fault (a death found by a health
    check alone too, with 0), alike failures of a live engine in a step are one fault; the
    line says the count and which steps ran without the engine."""
    from real.runner.cluster import Slot

    now, step = [1.0], [2]
    heard: list[str] = []
    log = FaultLog(lambda: now[0], lambda: step[0], heard.append)
    a, b, c = (Slot(None, n, i) for i, n in enumerate("abc"))  # type: ignore[arg-type]
    a.alive = False
    for _ in range(177):
        log.died(a, "gave up after 4 attempts")
    for _ in range(3):
        log.failed(b, "HTTP 503")
    log.failed(b, "cut")
    step[0] = 3
    log.failed(b, "HTTP 503")
    c.mark_dead("hung: no token")
    log.sweep([a, b, c])
    log.readmitted(a, 5, 4)
    assert [(f.engine, f.kind, f.requests, f.step) for f in log.faults] == [
        ("a", "engine_died", 177, 2), ("b", "request_failed", 3, 2),
        ("b", "request_failed", 1, 2), ("b", "request_failed", 1, 3),
        ("c", "engine_died", 0, 3)]
    assert heard == ["engine a dropped at 1.0s in step 2: gave up after 4 attempts",
                     "engine c dropped at 1.0s in step 3: hung: no token",
                     "engine a re-admitted for step 5: serving again, on weights version 4"]
    assert fault_line(log.faults[0], 8) == (
        "fault at 1.0s on a: engine_died in step 2, 177 requests affected (gave up after 4 "
        "attempts); out for steps 3-4, re-admitted for step 5")
    assert fault_line(log.faults[1], 8) == (
        "fault at 1.0s on b: request_failed in step 2, 3 requests resubmitted (HTTP 503)")
    assert fault_line(log.faults[4], 8).endswith("out for steps 4-7 (the rest of the run)")
    assert fault_line(Fault(0, "d", "engine_died", "x", 1, 7), 8).endswith(
        "1 request affected (x); out for the rest of the last step")
    assert fault_line(Fault(0, "d", "engine_died", "x", 1, 2, back_at=3), 8).endswith(
        "; re-admitted for step 3")


def test_the_run_keeps_the_signal_handlers_it_found():
    """asyncio leaves SIGINT/SIGTERM at their defaults when its loop closes: a SIGTERM while
    `aprilsim run` writes its results killed it silently (-15). `run_schedulers` now puts the
    handlers back (here: after a run refused at its first health check)."""
    from real.runner.api import run_schedulers
    from real.runner.options import EngineTarget, RunOptions

    def mine(*_a):
        pass

    old = signal.signal(signal.SIGTERM, mine)
    try:
        with pytest.raises(ValueError, match="not reachable"):
            run_schedulers(tiny_scenario(), ["sync"], RunOptions(
                target=EngineTarget(engines=("http://127.0.0.1:9",))))
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, old)


SLOW_LOAD = """
import sys, time
import aprilsim.cli as c
def slow(self, name):  # the command's import, made slow (torch, a loaded disk)
    print("loading", flush=True)
    time.sleep(60)
c._LazyGroup.load = slow
sys.argv = ["aprilsim", "run", "--engines", "http://127.0.0.1:9", "-s", "sync"]
c.main()
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_while_run_loads_exits_130_with_one_line(sig):
    """Item 9: `aprilsim run` in its first seconds (the command not even imported yet):
    SIGTERM killed it silently (-15) and SIGINT gave click's `Aborted!` and exit 1."""
    proc = subprocess.Popen([sys.executable, "-c", SLOW_LOAD], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert proc.stdout.readline().strip() == "loading"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, (proc.returncode, err)
    assert err.strip().splitlines() == [
        "aprilsim: error: interrupted before the run started; nothing was sent to the engines"]
