"""Where the CPU went during a live run: each server process's CPU seconds and each core's busy,
idle and stolen time, read from /proc (Linux), so a run can be split into the engine's own work,
its API server's, other processes' on the same core, and the hypervisor's steal.

    snap = cpu_snapshot(pgids=[1234]); ...; print(cpu_delta(snap, cpu_snapshot([1234])))
"""

from __future__ import annotations

import os
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
ROLES = ("api_server", "engine_core", "worker", "other")


def _group_procs(pgid: int) -> dict[str, float]:
    """CPU seconds (user + system) of a process group's live processes, summed by role:
    ``api_server`` (the group's leader), ``engine_core`` (vLLM's scheduler, ``VLLM::EngineCore``),
    ``worker`` (vLLM's model executor, ``VLLM::Worker``), ``other``."""
    out = dict.fromkeys(ROLES, 0.0)
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1: stat.rindex(")")]
        f = stat.rsplit(")", 1)[1].split()
        if int(f[2]) != pgid:
            continue
        role = ("api_server" if int(d.name) == pgid
                else "engine_core" if comm.startswith("VLLM::EngineCor")
                else "worker" if comm.startswith("VLLM::Worker") else "other")
        out[role] += (int(f[11]) + int(f[12])) / TICK
    return out


def _cores() -> dict[str, dict[str, float]]:
    """Per-core seconds from /proc/stat: busy (user, nice, system, irq, softirq), idle, steal."""
    out = {}
    for line in Path("/proc/stat").read_text().splitlines():
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        name, *v = line.split()
        x = [int(n) / TICK for n in v[:8]]
        out[name] = {"busy": x[0] + x[1] + x[2] + x[5] + x[6], "idle": x[3] + x[4], "steal": x[7]}
    return out


def cpu_snapshot(pgids: list[int]) -> dict:
    """The server groups' process CPU and every core's times, now."""
    procs = dict.fromkeys(ROLES, 0.0)
    for g in pgids:
        for k, v in _group_procs(g).items():
            procs[k] += v
    return {"t": time.monotonic(), "procs": procs, "cores": _cores()}


def cpu_delta(a: dict, b: dict, cores: list[int] | None = None) -> dict:
    """What happened between two snapshots: wall seconds, the servers' CPU seconds by role, and
    over ``cores`` (default all) busy, idle and steal seconds, with the busy time that was not
    the servers' (other processes on those cores, the client included if it shares them)."""
    wall = b["t"] - a["t"]
    procs = {k: b["procs"][k] - a["procs"][k] for k in a["procs"]}
    names = [f"cpu{c}" for c in cores] if cores else list(a["cores"])
    tot = {k: sum(b["cores"][n][k] - a["cores"][n][k] for n in names)
           for k in ("busy", "idle", "steal")}
    return {"wall_s": wall, "procs_s": procs, "cores": names, "cores_s": tot,
            "others_busy_s": max(0.0, tot["busy"] - sum(procs.values()))}
