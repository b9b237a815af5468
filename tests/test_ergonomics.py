"""The CLI and API ergonomics of issue 36, item 20: `sweep --set`, `.paired()` with 95 %
intervals, `Results`' short repr and HTML table, `simulate --out` without a timeline per run
unless asked, run folders with safe names, and `plot sweep`'s ticks, separators and labels."""

from __future__ import annotations

import pytest
from cli_helpers import aprilsim
from sweep_helpers import TINY_TOML

from aprilsim.notebook import Paired


def test_paired_gains_carry_their_95_percent_interval():
    import aprilsim as api

    res = api.simulate(schedulers=["sync", "april"], seeds=3, steps=3)
    p = res.paired()["april"]
    assert isinstance(p, Paired) and p.n == 3
    gain, sd, n = p  # still unpacks as (mean, sd, n)
    assert p.lo < gain < p.hi and p.hi - p.lo == pytest.approx(2 * p.half_width)
    assert p.half_width == pytest.approx(4.302653 * sd / 3 ** 0.5, rel=1e-5)  # t(0.975, 2)
    assert str(p).startswith(f"{gain:+.1%} [") and str(p).endswith("(3 seeds)")
    assert str(Paired(0.1, 0.0, 1)) == "+10.0% (1 seed)"


def test_results_repr_is_short_and_the_notebook_gets_a_table():
    import aprilsim as api

    res = api.simulate(schedulers=["sync", "april@ratio=1.5"], seeds=2, steps=3)
    r = repr(res)
    assert r.startswith("<Results 'april-paper-default': sync, april@ratio=1.5 x 2 seed(s)")
    assert len(r) < 200 and "lengths" not in r  # not the whole scenario
    html = res._repr_html_()
    assert html.count("<tr>") == 3 and "april@ratio=1.5" in html and "[" in html


def test_out_folders_have_safe_names_and_timelines_are_opt_in(tmp_path):
    out = tmp_path / "o"
    r = aprilsim("simulate", "--steps", "2", "-s", "april@ratio=1.5,recycle=false", "-s", "sync",
                 "--out", out)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == \
        ["april_ratio-1.5_recycle-false", "sync"]
    assert not list(out.rglob("timeline.png"))
    pytest.importorskip("matplotlib")
    out2 = tmp_path / "o2"
    assert aprilsim("simulate", "--steps", "2", "-s", "sync", "--out", out2,
                    "--out-timelines").returncode == 0
    assert (out2 / "sync" / "timeline.png").exists()


def test_sweep_takes_set_for_every_point(tmp_path):
    pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    import pandas as pd

    (tmp_path / "tiny.toml").write_text(TINY_TOML)
    out = tmp_path / "r.parquet"
    r = aprilsim("sweep", tmp_path / "tiny.toml", "--grid", "schedulers.april.ratio=1.5,2",
                 "--set", "cluster.engines=3", "--set", "steps=3", "-s", "april", "--seeds", "1",
                 "--jobs", "1", "--out", out)
    assert r.returncode == 0, r.stderr
    df = pd.read_parquet(out)
    assert len(df) == 2 and set(df["steps"] + df["warmup_steps"]) == {3}
    bad = aprilsim("sweep", tmp_path / "tiny.toml", "--grid", "schedulers.april.ratio=2",
                   "--set", "cluster.enignes=3", "--out", tmp_path / "b.parquet")
    assert bad.returncode == 2 and "enignes" in bad.stderr and bad.stderr.count("\n") == 1


def test_plot_sweep_ticks_the_swept_values_separates_thousands_and_labels_sync(tmp_path):
    pytest.importorskip("pandas")
    pytest.importorskip("matplotlib")
    from aprilsim.sweep.plots import sweep_figure

    (tmp_path / "tiny.toml").write_text(TINY_TOML)
    out = tmp_path / "r.parquet"
    assert aprilsim("sweep", tmp_path / "tiny.toml", "--grid", "schedulers.april.ratio=1.25,2,3.5",
                    "--set", "batch_size=16", "-s", "sync", "-s", "april", "--seeds", "2",
                    "--steps", "3", "--jobs", "1", "--out", out).returncode == 0
    fig = sweep_figure(out)
    a = fig.axes[0]
    assert list(a.get_xticks()) == [1.25, 2.0, 3.5]
    assert [t.get_text() for t in a.get_xticklabels()] == ["1.25", "2", "3.5"]
    assert a.yaxis.get_major_formatter()(12345.0, 0) == "12,345"
    pareto = fig.axes[5]
    labels = [t.get_text() for t in pareto.texts]
    at_zero = [t.get_text() for t in pareto.texts if t.xy[0] == 0.0]  # sync: 0 % off-policy
    assert at_zero == ["sync"], labels  # not a ratio it does not read
    r = aprilsim("plot", "sweep", out, "-o", tmp_path / "f.png")
    assert r.returncode == 0 and (tmp_path / "f.png").exists()
