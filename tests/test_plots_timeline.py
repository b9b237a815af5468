"""The timeline renderer on synthetic traces: bars, marks, curves, bands, PNG and offline HTML."""

from __future__ import annotations

import importlib.util
import random

import pytest
from click.testing import CliRunner

from aprilsim.cli import main
from aprilsim.metrics.trace import EngineSample, PhaseSpan, RequestSpan, Trace
from aprilsim.report.timeline import pack_rows, version_color

pytest.importorskip("matplotlib")


def synthetic_trace(n_engines: int = 2, steps: int = 2, per_engine: int = 12,
                    seed: int = 0) -> Trace:
    """An APRIL-like run: each step aborts the stragglers, and they resume in the next step."""
    rng = random.Random(seed)
    tr = Trace(scheduler="april", n_engines=n_engines, source="sim")
    t0, rid, uid = 0.0, 0, 0
    carried: dict[int, list[tuple[int, int]]] = {e: [] for e in range(n_engines)}
    for step in range(steps):
        stop = t0 + 60.0
        for e in range(n_engines):
            resumed, carried[e] = carried[e], []
            for k in range(per_engine):
                submit = t0 + 0.5 * k
                end = submit + rng.uniform(5, 90)
                carry, sample = (resumed[k][1], resumed[k][0]) if k < len(resumed) else (0, uid)
                if k >= len(resumed):
                    uid += 1
                reason = "stop" if end <= stop else "abort"
                end = min(end, stop)
                tokens = int((end - submit) * 40)
                if reason == "abort":
                    carried[e].append((sample, carry + tokens))
                tr.requests.append(RequestSpan(engine=e, rid=rid, sample_uid=sample,
                                               group_id=sample // 4, version=step,
                                               submit_s=submit, end_s=end, tokens=tokens,
                                               reason=reason, carried=carry,
                                               retractions=1 if k == 3 else 0))
                rid += 1
            for j in range(0, 61, 5):
                t = t0 + j
                running = sum(1 for r in tr.requests if r.engine == e and r.submit_s <= t < r.end_s)
                tr.engine_samples.append(EngineSample(engine=e, t=t, running=running,
                                                      kv_tokens=running * 2000 + j * 10))
        tr.phases += [PhaseSpan("rollout", step, t0, stop),
                      PhaseSpan("train", step, stop, stop + 15),
                      PhaseSpan("sync", step, stop + 15, stop + 18)]
        t0 = stop + 18
    return tr


def test_pack_rows_never_overlaps_and_uses_peak_concurrency():
    spans = [(0, 10), (1, 3), (3, 5), (2, 4), (10, 12), (4.5, 6)]
    rows = pack_rows(spans)
    for i, (a0, a1) in enumerate(spans):
        for j, (b0, b1) in enumerate(spans):
            if i < j and rows[i] == rows[j]:
                assert a1 <= b0 or b1 <= a0
    assert max(rows) + 1 == 3  # at most 3 intervals are open at once


def test_png_has_a_bar_per_request_marks_curves_and_bands(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.collections import LineCollection, PathCollection

    from aprilsim.report.timeline import timeline_figure, write_timeline

    tr = synthetic_trace()
    fig = timeline_figure(tr)
    lanes = [ax for ax in fig.axes if ax.get_ylabel().endswith("request slot")]
    assert len(lanes) == 2
    for e, lane in enumerate(lanes):
        bars = [c for c in lane.collections if isinstance(c, LineCollection)][0]
        mine = [r for r in tr.requests if r.engine == e]
        assert len(bars.get_segments()) == len(mine) == 24
        colors = {tuple(round(x, 3) for x in c[:3]) for c in bars.get_colors()}
        assert len(colors) == 2  # two policy versions
        marks = [c for c in lane.collections if isinstance(c, PathCollection)]
        n_abort = sum(r.reason == "abort" for r in mine)
        n_resumed = sum(r.carried > 0 for r in mine)
        assert n_abort > 0 and n_resumed > 0
        assert sorted(len(m.get_offsets()) for m in marks) == sorted([n_abort, 2, n_resumed])
        # training and weight-sync bands are shaded on every lane
        assert len(lane.patches) == 4
    curve_axes = [ax for ax in fig.axes if ax.get_ylabel().startswith("running")]
    kv_axes = [ax for ax in fig.axes if ax.get_ylabel() == "KV (k tokens)"]
    assert len(curve_axes) == len(kv_axes) == 2
    assert len(curve_axes[0].get_lines()[0].get_xdata()) == 2 * 13
    assert fig.axes[-1].get_xlabel() == "simulated time (s)" or any(
        ax.get_xlabel() == "simulated time (s)" for ax in fig.axes)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    for want in ("version 0", "version 1", "abort", "retraction", "resumed partial",
                 "training", "weight sync"):
        assert want in labels
    out = write_timeline(tr, tmp_path / "t.png")
    assert out.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError):
        write_timeline(tr, tmp_path / "t.txt")


def test_html_is_self_contained_and_carries_every_request(tmp_path):
    pytest.importorskip("plotly")
    from aprilsim.report.timeline import timeline_plotly, write_timeline

    tr = synthetic_trace()
    fig = timeline_plotly(tr)
    bars = [t for t in fig.data if t.mode == "lines" and str(t.name).startswith("version")]
    assert sum(sum(1 for x in t.x if x is None) for t in bars) == len(tr.requests)
    assert {t.line.color for t in bars} == {version_color(0), version_color(1)}
    assert len(fig.layout.shapes) == 2 * 2  # train + sync bands of two steps
    html = write_timeline(tr, tmp_path / "t.html").read_text()
    assert "<script src=" not in html  # nothing fetched: the page works offline
    assert len(html) > 1_000_000  # plotly.js itself is embedded


def test_cli_plot_timeline(tmp_path):
    path = synthetic_trace(n_engines=1, steps=1).write(tmp_path / "trace.jsonl")
    out = tmp_path / "t.png"
    r = CliRunner().invoke(main, ["plot", "timeline", str(path), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert out.stat().st_size > 10_000
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind": "request"}\n')
    r = CliRunner().invoke(main, ["plot", "timeline", str(bad), "-o", str(out)])
    assert r.exit_code == 2 and "meta" in r.stderr


def test_a_simulated_trace_without_engine_samples(tmp_path):
    """What the simulator records today: requests and phases; the curve rows are left out."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.collections import LineCollection

    from aprilsim.config import load_scenario
    from aprilsim.report.timeline import timeline_figure
    from aprilsim.sim.run import simulate

    sc = load_scenario()
    tr = Trace(scheduler="april", n_engines=sc.cluster.engines)
    simulate(sc, "april", steps=2, trace=tr)
    tr.engine_samples.clear()
    fig = timeline_figure(tr)
    assert len(fig.axes) == 1 + sc.cluster.engines  # the phase strip and one lane per engine
    n_bars = sum(len(c.get_segments()) for ax in fig.axes[1:] for c in ax.collections
                 if isinstance(c, LineCollection))
    assert n_bars == len(tr.requests) > 0
    if importlib.util.find_spec("plotly") is not None:
        from aprilsim.report.timeline import timeline_plotly

        assert len(timeline_plotly(tr).layout.annotations) == sc.cluster.engines  # subplot titles
