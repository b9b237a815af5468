"""The machine check of a live run: what the client and the machine did while it ran.

Three measurements, all from this process and ``/proc`` (Linux; elsewhere they read n/a):

- **event-loop lag**: a task asks to wake every ``LAG_PERIOD_S`` and records how late it woke
  (the runner reacts to a finished group that late);
- **CPU accounting** over the run: the busy time of every CPU (``/proc/stat``), of this process
  and its children, of the engine processes (found by the loopback ports their URLs name, and
  their children), so the share of the machine that *other* processes took; and the client's
  own wait for a CPU (the main thread's run delay, ``/proc/self/schedstat``);
- **delivery bursts** come from the token streams (:mod:`aprilsim.validate.delivery`).

:func:`pin` puts the client and the engines on separate cores (``--pin``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

LAG_PERIOD_S = 0.01
PROC = Path("/proc")


class LoopLag:
    """Samples how late the event loop wakes a task that sleeps ``period`` (seconds)."""

    def __init__(self, period: float = LAG_PERIOD_S) -> None:
        self.period = period
        self.lags: list[float] = []
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._loop())

    async def _loop(self) -> None:
        while True:
            t = time.monotonic()
            await asyncio.sleep(self.period)
            self.lags.append(max(0.0, time.monotonic() - t - self.period))

    async def stop(self) -> dict[str, float]:
        """p50, p99 and max lag in milliseconds (zeros when nothing was sampled)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        xs = sorted(self.lags)
        if not xs:
            return {"p50": 0.0, "p99": 0.0, "max": 0.0, "samples": 0}

        def q(p: float) -> float:
            return 1e3 * xs[min(len(xs) - 1, int(p * (len(xs) - 1) + 0.5))]
        return {"p50": q(0.5), "p99": q(0.99), "max": 1e3 * xs[-1], "samples": len(xs)}


# ------------------------------------------------------------------------------ /proc
def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def cpu_times(stat: str | None = None) -> dict[str, float] | None:
    """All CPUs' busy and steal jiffies from ``/proc/stat`` (its first ``cpu`` line), or None."""
    text = stat if stat is not None else _read(PROC / "stat")
    if not text:
        return None
    for line in text.splitlines():
        if line.startswith("cpu "):
            v = [float(x) for x in line.split()[1:]]
            v += [0.0] * (8 - len(v))
            return {"busy": v[0] + v[1] + v[2] + v[5] + v[6], "steal": v[7],
                    "total": sum(v[:8])}
    return None


def proc_jiffies(pid: int) -> float:
    """User + system jiffies of one process (all its threads); 0 when it is gone."""
    text = _read(PROC / str(pid) / "stat")
    if not text:
        return 0.0
    fields = text[text.rfind(")") + 2:].split()
    return float(fields[11]) + float(fields[12])  # utime, stime (fields 14 and 15)


def children_map() -> dict[int, list[int]]:
    """Parent pid -> child pids of every process this user can read."""
    out: dict[int, list[int]] = {}
    for d in PROC.glob("[0-9]*"):
        text = _read(d / "stat")
        if text:
            ppid = int(text[text.rfind(")") + 2:].split()[1])
            out.setdefault(ppid, []).append(int(d.name))
    return out


def tree(roots: Iterable[int], kids: dict[int, list[int]] | None = None) -> set[int]:
    """``roots`` and all their descendants."""
    kids = children_map() if kids is None else kids
    seen, todo = set(), list(roots)
    while todo:
        p = todo.pop()
        if p not in seen:
            seen.add(p)
            todo += kids.get(p, [])
    return seen


LOOPBACK = {"127.0.0.1", "localhost", "::1", "0.0.0.0", "[::1]"}


def listening_inodes(port: int) -> set[str]:
    """Socket inodes listening on ``port`` (``/proc/net/tcp`` and ``tcp6``)."""
    out = set()
    for name in ("tcp", "tcp6"):
        text = _read(PROC / "net" / name) or ""
        for line in text.splitlines()[1:]:
            f = line.split()
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                out.add(f[9])
    return out


def engine_pids(urls: Sequence[str]) -> list[int]:
    """The processes listening on the loopback ports of ``urls`` (engines on this machine)."""
    inodes: set[str] = set()
    for u in urls:
        parts = urlsplit(u.split("+", 1)[-1])
        if parts.hostname in LOOPBACK and parts.port:
            inodes |= listening_inodes(parts.port)
    if not inodes:
        return []
    want = {f"socket:[{i}]" for i in inodes}
    pids = []
    for d in PROC.glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) in want for fd in (d / "fd").iterdir()):
                pids.append(int(d.name))
    return pids


def run_delay_ns() -> float | None:
    """Nanoseconds this process's main thread has waited on a run queue (``schedstat``)."""
    text = _read(PROC / "self" / "schedstat")
    return float(text.split()[1]) if text else None


class CpuWindow:
    """The CPU accounting of one live run (see the module docstring)."""

    def __init__(self, engines: Sequence[int] = ()) -> None:
        self.engines = list(engines)
        self.hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.ncpu = os.cpu_count() or 1

    def _ours(self) -> tuple[float, float]:
        kids = children_map()
        mine = tree([os.getpid()], kids)
        eng = tree(self.engines, kids) - mine
        return sum(proc_jiffies(p) for p in mine), sum(proc_jiffies(p) for p in eng)

    def start(self) -> None:
        self.t0, self.cpu0 = time.monotonic(), cpu_times()
        self.mine0, self.eng0 = self._ours()
        self.delay0 = run_delay_ns()

    def stop(self) -> dict[str, Any]:
        """Shares of all CPUs over the run (client, engines, others, stolen) and the client's
        wait for a CPU as a share of the wall; None for what /proc did not give."""
        wall = max(1e-9, time.monotonic() - self.t0)
        cpu1, (mine1, eng1), delay1 = cpu_times(), self._ours(), run_delay_ns()
        out: dict[str, Any] = {"wall_s": wall, "cpus": self.ncpu, "engine_pids": self.engines}
        if self.cpu0 and cpu1:
            cap = self.ncpu * wall * self.hz
            busy = cpu1["busy"] - self.cpu0["busy"]
            mine, eng = mine1 - self.mine0, eng1 - self.eng0
            out.update(client_cpu_share=mine / cap, engines_cpu_share=eng / cap,
                       other_cpu_share=max(0.0, busy - mine - eng) / cap,
                       steal_share=(cpu1["steal"] - self.cpu0["steal"]) / cap)
        if self.delay0 is not None and delay1 is not None:
            out["run_delay_share"] = (delay1 - self.delay0) / 1e9 / wall
        return out


# ------------------------------------------------------------------------------ pinning
def _set(tid: int, cores: set[int]) -> None:
    with contextlib.suppress(OSError):
        os.sched_setaffinity(tid, cores)


def pin_process(pid: int, cores: set[int]) -> None:
    """Every thread of ``pid`` and of its descendants onto ``cores``."""
    for p in tree([pid]):
        for t in (PROC / str(p) / "task").glob("[0-9]*"):
            _set(int(t.name), cores)


def pin(engine_roots: Sequence[int]) -> dict[str, Any]:
    """The client (this process's main thread) on the first allowed core, each engine process
    tree on the others in turn; ValueError with fewer than two cores."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise ValueError(f"--pin needs at least 2 cores; this process may use {len(cores)}")
    client, rest = cores[0], cores[1:]
    placed = {}
    for i, pid in enumerate(engine_roots):
        core = rest[i % len(rest)]
        pin_process(pid, {core})
        placed[pid] = core
    os.sched_setaffinity(0, {client})
    return {"client_core": client, "engines": placed}


async def pin_local(workers: Sequence[Any], cores: Sequence[int]) -> dict[int, int]:
    """In-process engines: each worker's step thread onto its core (run on that thread)."""
    loop = asyncio.get_running_loop()
    placed = {}
    for i, w in enumerate(workers):
        runner = getattr(getattr(w, "inner", None), "runner", None)
        ex = getattr(runner, "_executor", None)
        if ex is None:
            continue
        core = cores[i % len(cores)]
        await loop.run_in_executor(ex, os.sched_setaffinity, 0, {core})
        placed[i] = core
    return placed
