"""No command replaces what a user already has without `--force` (issue 36, item 2).

`simulate --out` refused a non-empty folder; `sweep --out mine.parquet` replaced a user's own
Parquet and the `mine.csv` beside it, a second sweep merged another grid's rows into the tables
unsaid, and `advise --out`, `replay-validate --out` and `tune`'s default `SCENARIO.tuned.toml`
overwrote files. Each now claims its outputs before any work (aprilsim/outputs.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import aprilsim

pytest.importorskip("pandas")
pytest.importorskip("pyarrow")

DATA = Path(__file__).resolve().parent / "data" / "replay"
SWEEP = ["sweep", "-s", "april", "--seeds", "1", "--steps", "2", "--jobs", "1"]


def _user_file(path: Path, text: str = "mine\n") -> bytes:
    path.write_text(text)
    return path.read_bytes()


def test_sweep_never_replaces_a_users_table_or_the_csv_beside_it(tmp_path):
    parquet, csv = tmp_path / "mine.parquet", tmp_path / "mine.csv"
    before = _user_file(parquet, "PAR1 not ours"), _user_file(csv, "x,y\n1,2\n")
    r = aprilsim(*SWEEP, "--grid", "schedulers.april.ratio=1.5", "--out", parquet)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "no sweep journal" in r.stderr and "--force" in r.stderr
    assert (parquet.read_bytes(), csv.read_bytes()) == before
    r = aprilsim(*SWEEP, "--grid", "schedulers.april.ratio=1.5", "--out", parquet, "--force")
    assert r.returncode == 0, r.stderr
    assert csv.read_text().startswith("point_id,")


def test_a_resumed_sweep_says_what_it_merges_and_refuses_other_keys(tmp_path):
    import pandas as pd

    out = tmp_path / "r.parquet"
    assert aprilsim(*SWEEP, "--grid", "schedulers.april.ratio=1.5", "--out", out).returncode == 0
    r = aprilsim(*SWEEP, "--grid", "schedulers.april.ratio=2", "--out", out)
    assert r.returncode == 0, r.stderr
    assert "also keeps 1 row(s) at 1 other point(s) from earlier sweeps" in r.stdout
    assert len(pd.read_parquet(out)) == 2  # both grids, as said
    r = aprilsim(*SWEEP, "--grid", "cluster.engines=2", "--out", out)
    assert r.returncode == 2 and "holds a sweep over schedulers.april.ratio" in r.stderr
    assert len(pd.read_parquet(out)) == 2  # untouched
    r = aprilsim(*SWEEP, "--grid", "cluster.engines=2", "--out", out, "--force")
    assert r.returncode == 0 and len(pd.read_parquet(out)) == 1  # started over


def test_tune_refuses_its_default_output_before_tuning(tmp_path):
    from aprilsim.config import load_scenario

    target = tmp_path / f"{load_scenario(None).name}.tuned.toml"
    before = _user_file(target)
    r = aprilsim("tune", "--knob", "schedulers.april.ratio=1:3", "--maximize",
                 "rollout_throughput_tok_s", "--steps", "2", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--force" in r.stderr
    assert target.read_bytes() == before


@pytest.mark.parametrize("command", ["simulate", "replay-validate", "advise"])
def test_folder_outputs_refuse_a_folder_that_holds_files(tmp_path, command):
    out = tmp_path / "out"
    out.mkdir()
    names = {"simulate": "summary.json", "replay-validate": "report.md", "advise": "advice.json"}
    before = _user_file(out / names[command])
    args = {"simulate": ["simulate", "--steps", "2"],
            "replay-validate": ["replay-validate", DATA / "table.csv", "--scenario",
                                DATA / "run.toml", "-s", "sync", "--timing",
                                DATA / "table_times.csv", "--no-figures"],
            "advise": ["advise", "--steps", "2", "--seeds", "3"]}[command]
    r = aprilsim(*args, "--out", out)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "not an empty folder" in r.stderr and "--force" in r.stderr
    assert (out / names[command]).read_bytes() == before


def test_force_writes_into_a_folder_and_keeps_other_files(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    keep = _user_file(out / "notes.md")
    r = aprilsim("replay-validate", DATA / "table.csv", "--scenario", DATA / "run.toml", "-s",
                 "sync", "--timing", DATA / "table_times.csv", "--no-figures", "--out", out,
                 "--force")
    assert r.returncode == 0, r.stderr
    assert (out / "report.md").exists() and (out / "notes.md").read_bytes() == keep


@pytest.mark.parametrize("state", ["file", "folder with a file", "empty folder", "absent"])
@pytest.mark.parametrize("command", ["simulate", "replay-validate", "tune", "sweep"])
def test_no_output_state_loses_a_users_bytes(tmp_path, state, command):
    """Every command x every state of its output path (exhaustive, 16 cases): either it refuses
    in one line (exit 2) and every byte the user had is unchanged, or nothing was there."""
    from aprilsim.config import load_scenario

    tmp = tmp_path
    name = {"sweep": "r.parquet", "tune": f"{load_scenario(None).name}.tuned.toml"}.get(
        command, "out")
    out = tmp / name
    user: dict[Path, bytes] = {}
    if state == "file":
        user[out] = _user_file(out)
    elif state != "absent":
        out.mkdir()
        if state == "folder with a file":
            user[out / "summary.json"] = _user_file(out / "summary.json")
    args = {"simulate": ["simulate", "--steps", "2", "--out", out],
            "replay-validate": ["replay-validate", DATA / "table.csv", "--scenario",
                                DATA / "run.toml", "-s", "sync", "--timing",
                                DATA / "table_times.csv", "--no-figures", "--out", out],
            "tune": ["tune", "--knob", "schedulers.april.ratio=1:3", "--maximize",
                     "rollout_throughput_tok_s", "--steps", "2", "--seeds", "3", "--rounds", "1",
                     "--jobs", "1"],
            "sweep": [*SWEEP, "--grid", "schedulers.april.ratio=1.5", "--out", out]}[command]
    r = aprilsim(*args, cwd=tmp)
    if user or (state != "absent" and command in ("tune", "sweep")):
        assert r.returncode == 2 and r.stderr.count("\n") == 1, (command, state, r.stderr)
    else:
        assert r.returncode == 0, (command, state, r.stderr)
    for path, data in user.items():
        assert path.read_bytes() == data
