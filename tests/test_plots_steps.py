"""`aprilsim plot steps`: the four per-step panels, checked through matplotlib's own objects."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from aprilsim.cli import main
from aprilsim.metrics.records import StepRecord

pytest.importorskip("matplotlib")
from aprilsim.report.steps_plot import PANELS, plot_steps, read_steps, step_series  # noqa: E402


def _records(path, schedulers=("sync", "april"), steps=4):
    rows = []
    for k, name in enumerate(schedulers):
        for i in range(steps):
            r = StepRecord(step=i, rollout_start_s=100.0 * i, rollout_time_s=50.0 + 10 * k,
                           generated_tokens=100_000 * (k + 1), trained_tokens=80_000,
                           offpolicy_tokens=20_000 * k, partial_samples=5 * k * i)
            rows.append({"scheduler": name, **r.to_dict()})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_series_values(tmp_path):
    by = read_steps(_records(tmp_path / "s.jsonl"))
    assert list(by) == ["sync", "april"]
    s = step_series(by["april"])
    assert s["step"] == [0, 1, 2, 3]
    assert s["rollout_time_s"] == [60.0] * 4
    assert s["throughput_tok_s"] == pytest.approx([200_000 / 60.0] * 4)
    assert s["offpolicy_pct"] == pytest.approx([25.0] * 4)
    assert s["buffer_samples"] == [0, 5, 10, 15]


def test_figure_has_four_labelled_panels_and_a_legend(tmp_path):
    out = tmp_path / "steps.png"
    fig = plot_steps(read_steps(_records(tmp_path / "s.jsonl", ("sync", "april", "april_ds"))), out)
    assert out.stat().st_size > 10_000
    axes = fig.get_axes()
    assert len(axes) == 4
    for ax, (_, title, ylabel) in zip(axes, PANELS):
        assert ax.get_title() == title and ax.get_ylabel() == ylabel
        assert "(" in ax.get_ylabel()  # every axis says its unit
        assert [line.get_label() for line in ax.get_lines()] == ["sync", "april", "april_ds"]
        assert len(ax.get_lines()[0].get_xdata()) == 4
    assert [ax.get_xlabel() for ax in axes[2:]] == ["training step"] * 2
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert texts == ["sync", "april", "april_ds"]


def test_cli_plot_steps(tmp_path):
    out = tmp_path / "f.png"
    r = CliRunner().invoke(main, ["plot", "steps", str(_records(tmp_path / "s.jsonl")),
                                  "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"no": 1}\n')
    r = CliRunner().invoke(main, ["plot", "steps", str(bad), "-o", str(out)])
    assert r.exit_code == 2 and "not a step record" in r.stderr


def _seeded(path, seeds=(0, 1, 2), steps=3):
    """April run on several seeds (as `simulate --seeds N --steps-out` writes), rollout time
    10 * (seed + 1) at every step, beside one-seed sync."""
    rows = [{"scheduler": "sync", "seed": 0, **StepRecord(step=i, rollout_start_s=0.0,
             rollout_time_s=5.0, generated_tokens=10, trained_tokens=10).to_dict()}
            for i in range(steps)]
    for s in seeds:
        for i in range(steps):
            r = StepRecord(step=i, rollout_start_s=0.0, rollout_time_s=10.0 * (s + 1),
                           generated_tokens=1000, trained_tokens=100)
            rows.append({"scheduler": "april", "seed": s, **r.to_dict()})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_seeds_are_a_mean_with_a_band_not_one_zigzag_line(tmp_path):
    fig = plot_steps(read_steps(_seeded(tmp_path / "s.jsonl")))
    ax = fig.get_axes()[0]  # rollout time
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert set(lines) == {"sync", "april (mean of 3 seeds)"}
    april = lines["april (mean of 3 seeds)"]
    assert list(april.get_xdata()) == [0, 1, 2]  # one point per step, not one per seed and step
    assert list(april.get_ydata()) == pytest.approx([20.0] * 3)
    (band,) = ax.collections  # the min-max band over the seeds
    ys = band.get_paths()[0].vertices[:, 1]
    assert min(ys) == pytest.approx(10.0) and max(ys) == pytest.approx(30.0)
    assert "min-max over seeds" in fig.legends[0].get_title().get_text()


def test_each_seed_draws_one_labelled_line_per_seed(tmp_path):
    out = tmp_path / "f.png"
    r = CliRunner().invoke(main, ["plot", "steps", str(_seeded(tmp_path / "s.jsonl")), "-o",
                                  str(out), "--each-seed"])
    assert r.exit_code == 0, r.output
    fig = plot_steps(read_steps(_seeded(tmp_path / "s.jsonl")), each_seed=True)
    ax = fig.get_axes()[0]
    labels = [ln.get_label() for ln in ax.get_lines()]
    assert labels == ["sync", "april seed 0", "april seed 1", "april seed 2"]
    assert [list(ln.get_ydata()) for ln in ax.get_lines()[1:]] == [[10.0] * 3, [20.0] * 3,
                                                                   [30.0] * 3]


def test_simulate_seeds_output_plots_one_band_per_scheduler(tmp_path):
    """End to end: the file `simulate --seeds 2 --steps-out` writes gives one mean line per
    scheduler, one point per step."""
    from sweep_helpers import TINY_TOML

    sc, steps = tmp_path / "tiny.toml", tmp_path / "steps.jsonl"
    sc.write_text(TINY_TOML)
    r = CliRunner().invoke(main, ["simulate", str(sc), "-s", "sync", "-s", "april", "--seeds", "2",
                                  "--steps-out", str(steps)])
    assert r.exit_code == 0, r.output
    fig = plot_steps(read_steps(steps))
    lines = fig.get_axes()[0].get_lines()
    assert [ln.get_label() for ln in lines] == ["sync (mean of 2 seeds)", "april (mean of 2 seeds)"]
    assert all(list(ln.get_xdata()) == [0, 1, 2, 3] for ln in lines)
