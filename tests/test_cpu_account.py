"""experiments/cpu_account.py: a server group's CPU by role and the cores' busy time, from /proc."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

pytestmark = pytest.mark.skipif(not Path("/proc/stat").exists(), reason="needs Linux /proc")

SPIN = ("import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"
        "time.sleep(30)\n")


def test_a_spinning_group_leader_is_counted_as_the_api_server():
    """A process in a group of its own burns 0.4 s of CPU: the delta gives it to the leader's role,
    none to the others, and the cores' busy time covers at least that much."""
    from cpu_account import cpu_delta, cpu_snapshot

    p = subprocess.Popen([sys.executable, "-c", SPIN.format(s=0.4)], start_new_session=True)
    try:
        a = cpu_snapshot([p.pid])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            d = cpu_delta(a, cpu_snapshot([p.pid]))
            if d["procs_s"]["api_server"] >= 0.35:
                break
            time.sleep(0.05)
        assert d["procs_s"]["api_server"] == pytest.approx(0.4, abs=0.15)
        assert d["procs_s"]["engine_core"] == d["procs_s"]["worker"] == d["procs_s"]["other"] == 0
        assert d["cores_s"]["busy"] >= d["procs_s"]["api_server"] - 0.05
        assert d["others_busy_s"] >= 0 and d["wall_s"] > 0
        assert len(d["cores"]) >= 1 and all(c.startswith("cpu") for c in d["cores"])
    finally:
        p.kill()
        p.wait()


def test_no_group_counts_nothing():
    from cpu_account import cpu_delta, cpu_snapshot

    d = cpu_delta(cpu_snapshot([]), cpu_snapshot([]), cores=[0])
    assert d["procs_s"] == {"api_server": 0.0, "engine_core": 0.0, "worker": 0.0, "other": 0.0}
    assert d["cores"] == ["cpu0"]
