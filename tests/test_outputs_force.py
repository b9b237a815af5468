"""`fit --out`, `calibrate --out` and `validate --out` keep what a user has (issue 36, item 2).

Before, `fit --out m.toml` and `calibrate --out cal.toml` replaced an existing file without a
word, and `validate --out DIR` wrote into a folder of the user's files. Each now refuses in one
line (exit 2) before any work, unless `--force` (or, for validate, `--resume`): the shared rule
of aprilsim/outputs.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from cli_helpers import aprilsim


def _user_file(path: Path, text: str = "mine\n") -> bytes:
    path.write_text(text)
    return path.read_bytes()


def _lengths(tmp_path: Path) -> Path:
    p = tmp_path / "l.csv"
    x = np.ceil(np.random.default_rng(0).lognormal(5, 0.6, 300)).astype(int)
    p.write_text("response_length\n" + "\n".join(map(str, x.tolist())) + "\n")
    return p


def _timings(tmp_path: Path) -> Path:
    """A valid calibration CSV: decode steps t = 5 ms + 20 us * B + 30 ns * K, and prefills."""
    rows = ["phase,batch_size,kv_tokens,prefill_tokens,duration_s"]
    for b in (1, 2, 4, 8, 16, 32):
        for k in (100, 1000, 5000):
            rows.append(f"decode,{b},{b * k},0,{5e-3 + 2e-5 * b + 3e-8 * b * k:.9f}")
    rows += [f"prefill,1,0,{n},{0.01 + 1e-5 * n:.9f}" for n in (64, 256, 1024)]
    p = tmp_path / "t.csv"
    p.write_text("\n".join(rows) + "\n")
    return p


def test_fit_refuses_an_existing_model_or_figure_unless_force(tmp_path):
    log = _lengths(tmp_path)
    for flag, name in (("--out", "m.toml"), ("--plot", "f.png")):
        target = tmp_path / name
        before = _user_file(target)
        r = aprilsim("fit", log, "--bootstrap", "0", "--families", "gamma", flag, target)
        assert r.returncode == 2, r.stderr
        assert r.stderr.strip().splitlines() == [
            f"aprilsim fit: error: {flag} {target}: exists; choose another {flag}, or --force "
            "to replace it"]
        assert target.read_bytes() == before and r.stdout == ""  # refused before the fit
    r = aprilsim("fit", log, "--bootstrap", "0", "--families", "gamma", "--out",
                 tmp_path / "m.toml", "--force")
    assert r.returncode == 0, r.stderr
    assert "[lengths]" in (tmp_path / "m.toml").read_text()


def test_calibrate_refuses_an_existing_preset_records_or_plot_unless_force(tmp_path):
    csv = _timings(tmp_path)
    for flag, name in (("--out", "cal.toml"), ("--records-out", "r.csv"), ("--plot", "p.png")):
        target = tmp_path / name
        before = _user_file(target)
        r = aprilsim("calibrate", "--csv", csv, flag, target)
        assert r.returncode == 2, r.stderr
        assert r.stderr.strip().splitlines() == [
            f"aprilsim: error: {flag} {target}: exists; choose another {flag}, "
            "or --force to replace it"], r.stderr
        assert target.read_bytes() == before and r.stdout == ""
    r = aprilsim("calibrate", "--csv", csv, "--out", tmp_path / "cal.toml", "--force")
    assert r.returncode == 0, r.stderr
    assert "[cost]" in (tmp_path / "cal.toml").read_text()


def test_validate_refuses_a_folder_that_holds_files_unless_force_or_resume(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    before = _user_file(out / "report.md")
    base = ["validate", "--local", "1", "-s", "sync", "--out", out]
    r = aprilsim(*base)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "not an empty folder" in r.stderr and "--force" in r.stderr
    assert (out / "report.md").read_bytes() == before and not (out / "runs").exists()
    # --force claims it (the validate itself is not run here: its store is begun as the
    # command begins it, and the user's other files stay)
    from real.validate_store import RunStore

    assert RunStore(out).begin({"scenario": "x"}, resume=False, force=True) == 0
    assert (out / "report.md").read_bytes() == before and (out / "runs" / "state.json").is_file()
    r = aprilsim(*base)  # a validate's state, no finished run: --resume is named too
    assert r.returncode == 2 and "--resume continues the validate it holds" in r.stderr


def test_validate_force_starts_over_an_earlier_validates_runs(tmp_path):
    from real.validate_store import RunStore

    out = tmp_path / "out"
    RunStore(out).begin({"scenario": "x"}, resume=False)
    (out / "runs" / "round0-sync.pkl").write_bytes(b"x")
    r = aprilsim("validate", "--local", "1", "-s", "sync", "--out", out)
    assert r.returncode == 2 and "or --force to start over" in r.stderr
    assert RunStore(out).begin({"scenario": "y"}, resume=False, force=True) == 0
    assert not (out / "runs" / "round0-sync.pkl").exists()


def test_validate_may_run_again_where_an_earlier_one_failed_before_its_first_run(tmp_path):
    """A validate that stopped before any run (engines not up) left only its state: the same
    command again loses nothing, so it is not refused."""
    from real.validate_store import RunStore

    out = tmp_path / "out"
    RunStore(out).begin({"scenario": "x"}, resume=False)
    assert RunStore(out).begin({"scenario": "x"}, resume=False) == 0
    (out / "calibration.toml").write_text("[cost]\n")  # something measured: kept unless told
    r = aprilsim("validate", "--local", "1", "-s", "sync", "--out", out)
    assert r.returncode == 2 and "--resume continues the validate it holds" in r.stderr
