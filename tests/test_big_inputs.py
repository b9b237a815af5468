"""Readers refuse binary input early and read large files in bounded memory (issue 36,
item 25): `fit` on 1 GB of NUL bytes reached 9.47 GB of memory; `/dev/zero` and 1 GB files ran
past 90 s in `fit`, `replay-validate`, `lengths.replay` and `sweep`."""

from __future__ import annotations

import resource
import time
import types
from pathlib import Path

import pytest
from cli_helpers import aprilsim

DATA = Path(__file__).resolve().parent / "data" / "replay"
MB = 2**20


def _sparse(path: Path, size: int = 2**30) -> Path:
    """A 1 GiB file of NUL bytes that takes no disk (sparse)."""
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _commands(bad: Path, tmp: Path) -> dict[str, list]:
    replay = tmp / "replay.toml"
    replay.write_text(f'[lengths]\nreplay = "{bad}"\n')
    return {
        "fit": ["fit", bad],
        "replay-validate RUN": ["replay-validate", bad, "-s", "sync", "--out", tmp / "o1"],
        "replay-validate --timing": ["replay-validate", DATA / "table.csv", "--scenario",
                                     DATA / "run.toml", "-s", "sync", "--timing", bad,
                                     "--out", tmp / "o2"],
        "lengths.replay": ["simulate", replay, "--steps", "2"],
        "sweep": ["sweep", replay, "--grid", "schedulers.april.ratio=2", "--seeds", "1",
                  "--jobs", "1", "--out", tmp / "s.parquet"],
    }


@pytest.mark.parametrize("kind", ["sparse 1 GiB of NUL", "/dev/zero", "/dev/urandom"])
def test_binary_input_is_refused_at_once_in_bounded_memory(tmp_path, kind):
    if kind.startswith("/dev/") and not Path(kind).exists():
        pytest.skip(f"no {kind}")
    bad = Path(kind) if kind.startswith("/dev/") else _sparse(tmp_path / "big.csv")
    for name, args in _commands(bad, tmp_path).items():
        if name == "sweep":
            pytest.importorskip("pandas")
        before = _peak_mb()
        t0 = time.monotonic()
        r = aprilsim(*args)
        took = time.monotonic() - t0
        assert r.returncode == 2, (name, r.stderr)
        assert r.stderr.strip().splitlines()[-1].startswith("aprilsim"), (name, r.stderr)
        assert "binary data" in r.stderr or "not a regular file" in r.stderr, (name, r.stderr)
        assert took < 20, (name, took)  # it was > 90 s
        assert _peak_mb() - before < 300, (name, _peak_mb() - before)  # was 9.47 GB


def test_a_verl_dump_of_binary_data_and_an_endless_line(tmp_path):
    d = tmp_path / "rollout_data"
    d.mkdir()
    _sparse(d / "1.jsonl")
    before = _peak_mb()
    r = aprilsim("replay-validate", d, "-s", "sync", "--out", tmp_path / "o")
    assert r.returncode == 2 and "binary data" in r.stderr, r.stderr
    long = tmp_path / "long.log"
    long.write_text("x" * (65 * MB))  # text, no newline
    r = aprilsim("replay-validate", DATA / "table.csv", "--scenario", DATA / "run.toml", "-s",
                 "sync", "--timing", long, "--out", tmp_path / "o2")
    assert r.returncode == 2 and "a line longer than 64 MiB" in r.stderr, r.stderr
    assert _peak_mb() - before < 400


def test_tables_are_read_as_they_are_consumed(tmp_path):
    """A replay table's rows come from a generator over the file, not a list of its lines."""
    from aprilsim.workload.replay.tables import table_records

    p = tmp_path / "t.csv"
    p.write_text("step,prompt_id,response_length\n" + "".join(
        f"{i // 8},{i // 4},{100 + i}\n" for i in range(2000)))
    columns, rows = table_records(p)
    assert columns == ["step", "prompt_id", "response_length"]
    assert isinstance(rows, types.GeneratorType)
    assert next(rows) == {"step": "0", "prompt_id": "0", "response_length": "100"}
    assert sum(1 for _ in rows) == 1999
