"""`aprilsim sweep` on SIGTERM ends like Ctrl-C: exit 130, tables written from the journal, no
pool worker left behind (before issue 22 it died at once with -15, no tables, orphaned workers)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pd = pytest.importorskip("pandas", reason="sweeps need the `sweep` extra (pandas)")
pytest.importorskip("pyarrow", reason="sweeps need the `sweep` extra (pyarrow)")

from sweep_helpers import TINY_TOML  # noqa: E402

from aprilsim.sweep.journal import journal_path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs /proc")
def test_sweep_sigterm_writes_tables_and_leaves_no_worker(tmp_path):
    sc = tmp_path / "tiny.toml"
    sc.write_text(TINY_TOML)
    out = tmp_path / "r.parquet"
    ratios = ",".join(str(1 + i / 10) for i in range(60))
    proc = subprocess.Popen(
        [sys.executable, "-m", "aprilsim", "sweep", str(sc), "--grid",
         f"schedulers.april.ratio={ratios}", "--seeds", "10", "-j", "2", "-s", "april", "-s",
         "sync", "--out", str(out)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    journal = journal_path(out)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            if journal.exists() and len(journal.read_text().splitlines()) > 5:
                workers = _children(proc.pid)
                if workers:
                    break
            time.sleep(0.05)
        assert proc.poll() is None and workers, "the sweep ended before it could be signalled"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)  # orphaned workers would hold the pipes open
        assert proc.returncode == 130, err
        assert _gone_soon(workers), workers
        assert "interrupted" in err and "Traceback" not in err
        kept = len(journal.read_text().splitlines()) - 1  # header line
        assert 5 <= kept < 60 * 10 * 2
        assert len(pd.read_parquet(out)) == kept
        assert len(pd.read_csv(out.with_suffix(".csv"))) == kept
    finally:  # whatever happened, leave nothing running
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for w in workers:
            if _alive(w):
                os.kill(w, signal.SIGKILL)


def _gone_soon(pids: list[int], within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    return not any(_alive(p) for p in pids)
