"""Progress lines for logs (issue 36, item 19): without a terminal, a long `simulate`, `fit` or
`sweep` printed one line and then nothing for minutes."""

from __future__ import annotations

from cli_helpers import aprilsim

from aprilsim.progress import PeriodicLines, period_s


def test_periodic_lines_print_at_most_once_a_period():
    now = [100.0]
    out: list[str] = []
    p = PeriodicLines("simulating seer", period=10.0, clock=lambda: now[0], echo=out.append)
    for t, done in ((101, 1), (105, 2), (111, 3), (115, 4), (121.5, 5), (140, 6)):
        now[0] = t
        p.steps(done, 6)
    assert out == ["simulating seer: step 3/6 (11 s)", "simulating seer: step 5/6 (22 s)",
                   "simulating seer: step 6/6 (40 s)"]


def test_the_period_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("APRILSIM_PROGRESS_SECONDS", "2.5")
    assert period_s() == 2.5
    monkeypatch.setenv("APRILSIM_PROGRESS_SECONDS", "x")
    assert period_s() == 10.0


def test_simulate_and_fit_print_progress_into_a_log(monkeypatch, tmp_path):
    monkeypatch.setenv("APRILSIM_PROGRESS_SECONDS", "0")  # every message: the log's view
    r = aprilsim("simulate", "--steps", "3", "-s", "sync")
    assert r.returncode == 0
    assert "simulating sync: step 1/3" in r.stderr and "simulating sync: step 3/3" in r.stderr
    log = tmp_path / "lens.txt"
    log.write_text("\n".join(str(100 + (i * 37) % 900) for i in range(400)) + "\n")
    r = aprilsim("fit", log, "--bootstrap", "20", "--families", "lognormal")
    assert r.returncode == 0, r.stderr
    assert "aprilsim: fit: bootstrap of lognormal: 10/20 resamples" in r.stderr
