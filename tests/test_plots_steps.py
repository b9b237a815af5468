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
    r = CliRunner().invoke(main, ["plot", "steps", str(_records(tmp_path / "s.jsonl")), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"no": 1}\n')
    r = CliRunner().invoke(main, ["plot", "steps", str(bad), "-o", str(out)])
    assert r.exit_code == 2 and "not a step record" in r.stderr
