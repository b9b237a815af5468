"""Issue 22: `plot sweep` with two swept keys, and `sweep` warning about keys a scheduler
ignores."""

from __future__ import annotations

import pytest

pd = pytest.importorskip("pandas")
pytest.importorskip("pyarrow")

from click.testing import CliRunner  # noqa: E402

from aprilsim.cli import main  # noqa: E402
from aprilsim.sweep.plots import default_x, series_plan  # noqa: E402

RATIO, RECYCLE, ENGINES = "schedulers.april.ratio", "schedulers.april.recycle", "cluster.engines"


def frame(keys: dict[str, list], schedulers=("sync", "april")):
    import itertools

    rows = [{"scheduler": s, **dict(zip(keys, combo))}
            for s in schedulers for combo in itertools.product(*keys.values())]
    return pd.DataFrame(rows)


def test_x_is_the_key_with_most_values():
    df = frame({ENGINES: [1, 2], RATIO: [1.0, 1.5, 2.0]})
    assert default_x(df, [ENGINES, RATIO]) == RATIO
    assert default_x(frame({ENGINES: [1, 2], RATIO: [1.0, 2.0]}), [ENGINES, RATIO]) == ENGINES


def test_second_key_styles_lines_and_ignoring_schedulers_are_drawn_once():
    df = frame({RATIO: [1.0, 1.5, 2.0], RECYCLE: [True, False]})
    plan = series_plan(df, RATIO, [RECYCLE])
    by = {}
    for label, sched, _fixed, style in plan:
        by.setdefault(sched, []).append((label, style))
    assert by["sync"] == [("sync", 0)]  # sync reads no schedulers.april.* key: one line
    assert sorted(by["april"]) == [("april (recycle=False)", 1), ("april (recycle=True)", 0)]
    # a key every scheduler reads gives each scheduler one line per value
    plan = series_plan(frame({RATIO: [1.0, 2.0], ENGINES: [1, 2]}), RATIO, [ENGINES])
    assert sorted(p[0] for p in plan) == ["april (engines=1)", "april (engines=2)",
                                          "sync (engines=1)", "sync (engines=2)"]


TINY = """name = "tiny"
steps = 2
warmup_steps = 0
batch_size = 2
group_size = 2
max_response_len = 256
compare = ["sync", "april"]
[cluster]
engines = 1
[lengths]
family = "lognormal"
mu = 4.0
sigma = 0.5
[prompts]
family = "lognormal"
mu = 3.0
sigma = 0.3
max_len = 64
"""


def test_sweep_warning_and_two_key_plot(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text(TINY)
    out = tmp_path / "r.parquet"
    r = CliRunner().invoke(main, ["sweep", str(p), "--grid", f"{RATIO}=1,1.5,2", "--grid",
                                  f"{ENGINES}=1,2", "--seeds", "2", "-j", "1", "-o", str(out)])
    assert r.exit_code == 0, r.output
    warnings = [ln for ln in r.stderr.splitlines() if "warning" in ln]
    assert warnings == [f"aprilsim: warning: sync does not read {RATIO}: its runs are the same "
                        "at every value (simulated once, drawn once by `aprilsim plot sweep`)"]
    pytest.importorskip("matplotlib")
    png = tmp_path / "f.png"
    r = CliRunner().invoke(main, ["plot", "sweep", str(out), "-o", str(png)])
    assert r.exit_code == 0, r.output
    assert png.stat().st_size > 10_000
