"""Issue 22 timelines: markers apart from version colours, `--engines`/`--steps` select what is
drawn, live traces draw queued time apart from running time."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from test_plots_timeline import synthetic_trace

from aprilsim.cli import main
from aprilsim.report.timeline import PALETTE, queued_running, select

pytest.importorskip("matplotlib")


def _hex(rgba) -> str:
    return "#" + "".join(f"{round(x * 255):02x}" for x in rgba[:3])


def test_event_markers_never_use_a_version_colour():
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.collections import PathCollection

    from aprilsim.report.timeline import timeline_figure

    fig = timeline_figure(synthetic_trace(steps=3))
    lanes = [ax for ax in fig.axes if ax.get_ylabel().endswith("request slot")]
    seen = set()
    for lane in lanes:
        for marks in (c for c in lane.collections if isinstance(c, PathCollection)):
            for rgba in (*marks.get_facecolors(), *marks.get_edgecolors()):
                seen.add(_hex(rgba))
    assert seen and not seen & {c.lower() for c in PALETTE}


def test_select_engines_and_a_step_window():
    tr = synthetic_trace(n_engines=3, steps=3)
    part, labels = select(tr, engines=[2, 0], steps=(1, 1))
    assert labels == [2, 0] and part.n_engines == 2
    lo = min(p.start_s for p in tr.phases if p.step == 1)
    hi = max(p.end_s for p in tr.phases if p.step == 1)
    assert {p.step for p in part.phases} == {1}
    want = [r for r in tr.requests if r.engine in (2, 0) and r.end_s >= lo and r.submit_s <= hi]
    assert len(part.requests) == len(want) > 0
    assert {r.engine for r in part.requests} == {0, 1}  # renumbered: lane 0 is engine 2
    assert all(lo <= s.t <= hi for s in part.engine_samples)
    with pytest.raises(ValueError, match="no engine 5"):
        select(tr, engines=[5])
    with pytest.raises(ValueError, match="no such step"):
        select(tr, steps=(7, 9))


def test_cli_plot_timeline_selects(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    path = synthetic_trace(n_engines=3, steps=2).write(tmp_path / "trace.jsonl")
    out = tmp_path / "t.png"
    r = CliRunner().invoke(main, ["plot", "timeline", str(path), "-o", str(out),
                                  "--engines", "1,2", "--steps", "1:1"])
    assert r.exit_code == 0, r.output
    assert out.stat().st_size > 10_000
    r = CliRunner().invoke(main, ["plot", "timeline", str(path), "--engines", "9", "-o", str(out)])
    assert r.exit_code == 2 and "no engine 9" in r.stderr
    r = CliRunner().invoke(main, ["plot", "timeline", str(path), "--steps", "x", "-o", str(out)])
    assert r.exit_code == 2 and "expected LO:HI" in r.stderr


def test_live_traces_draw_queued_time_apart():
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.collections import LineCollection

    from aprilsim.report.timeline import timeline_figure

    tr = synthetic_trace(n_engines=1, steps=1)
    tr.source = "live"
    for r in tr.requests:
        r.first_token_s = r.submit_s + 0.25 * (r.end_s - r.submit_s)
    q, run = queued_running(tr.requests[0])
    assert q == (tr.requests[0].submit_s, tr.requests[0].first_token_s)
    assert run == (tr.requests[0].first_token_s, tr.requests[0].end_s)
    fig = timeline_figure(tr)
    lane = next(ax for ax in fig.axes if ax.get_ylabel().endswith("request slot"))
    bars, queued = [c for c in lane.collections if isinstance(c, LineCollection)]
    assert len(bars.get_segments()) == len(queued.get_segments()) == len(tr.requests)
    assert bars.get_segments()[0][0][0] == pytest.approx(tr.requests[0].first_token_s)
    assert queued.get_alpha() < 1 and max(queued.get_linewidths()) < max(bars.get_linewidths())
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "queued (submit to first token)" in labels
    # a simulated trace (no first-token times) draws one bar per submission, as before
    assert queued_running(synthetic_trace().requests[0])[0] is None
