"""The timeline figure: what every engine did, request by request, from a `Trace`.

Per engine, a lane of horizontal bars, one per request submission (submit to end), coloured by the
policy version its tokens were generated under, with aborts (x), retractions (down triangle) and
resumed partial samples (right triangle, at submit) marked in black (no marker shares a version's
colour); where the trace knows each request's first token (live runs), its queued time (submit to
first token) is drawn faint and thin apart from its running time; under each lane the running
batch size and the KV tokens held (left out when the trace has no engine samples). Trainer and
weight-sync phases are shaded across all lanes and drawn on a strip at the top. One glance shows
the long-tail bubble of a synchronous rollout and how APRIL fills it.

Two renderers share the layout: `timeline_figure` / `write_png` (matplotlib, `aprilsim[plot]`) and
`timeline_html` / `write_html` (plotly, `aprilsim[interactive]`): a self-contained HTML file with
the plotly library embedded, so it opens offline; zoom and hover make long runs readable where a
PNG is too dense.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aprilsim.metrics.trace import EngineSample, RequestSpan, Trace

# tab10: distinct neighbours; versions cycle through it
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
           "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
PHASE_COLORS = {"rollout": "#9ecae1", "train": "#636363", "sync": "#fd8d3c", "abort": "#cb181d"}
PHASE_LABELS = {"rollout": "rollout", "train": "training", "sync": "weight sync",
                "abort": "abort on its way"}
# event markers: black, told apart by shape, so that no marker reads as a policy version
MARKERS = {"abort": ("x", "x", "#000000"),
           "retraction": ("v", "triangle-down", "#000000"),
           "resumed partial": (">", "triangle-right", "#000000")}
QUEUED_ALPHA = 0.3  # live traces: submit -> first token (queued, prefill) drawn faint and thin


def queued_running(r: RequestSpan) -> tuple[tuple[float, float] | None, tuple[float, float]]:
    """(queued span or None, running span): apart when the trace knows the first token's time."""
    ft = r.first_token_s
    if ft is None or not r.submit_s < ft <= r.end_s:
        return None, (r.submit_s, r.end_s)
    return (r.submit_s, ft), (ft, r.end_s)


def select(trace: Trace, engines: Sequence[int] | None = None,
           steps: tuple[int, int] | None = None) -> tuple[Trace, list[int]]:
    """The part of `trace` to draw: some engines (renumbered 0..; the labels returned) and the
    time window of training steps lo..hi (inclusive). ValueError for an engine not in the trace."""
    keep = list(range(trace.n_engines)) if engines is None else list(dict.fromkeys(engines))
    bad = [e for e in keep if not 0 <= e < trace.n_engines]
    if bad:
        raise ValueError(f"--engines: no engine {bad[0]} (the trace has engines 0.."
                         f"{trace.n_engines - 1})")
    index = {e: i for i, e in enumerate(keep)}
    lo_t, hi_t = float("-inf"), float("inf")
    phases = trace.phases
    if steps is not None:
        lo, hi = steps
        phases = [p for p in trace.phases if lo <= p.step <= hi]
        if not phases:
            have = sorted({p.step for p in trace.phases})
            raise ValueError(f"--steps {lo}:{hi}: no such step in the trace (it has steps "
                             f"{have[0] if have else '-'}..{have[-1] if have else '-'})")
        lo_t, hi_t = min(p.start_s for p in phases), max(p.end_s for p in phases)
    out = Trace(trace.scheduler, len(keep), trace.source)
    out.phases = list(phases)
    for r in trace.requests:
        if r.engine in index and r.end_s >= lo_t and r.submit_s <= hi_t:
            out.requests.append(RequestSpan(**{**_fields(r), "engine": index[r.engine]}))
    for x in trace.engine_samples:
        if x.engine in index and lo_t <= x.t <= hi_t:
            out.engine_samples.append(EngineSample(index[x.engine], x.t, x.running, x.kv_tokens))
    return out, keep


def _fields(obj: Any) -> dict[str, Any]:
    return {k: getattr(obj, k) for k in obj.__slots__}


def version_color(version: int) -> str:
    """The colour of a policy version (cycles every 10 versions)."""
    return PALETTE[version % len(PALETTE)]


def pack_rows(spans: Sequence[tuple[float, float]]) -> list[int]:
    """A row for each (start, end) interval so that intervals on one row never overlap.

    Greedy in start order, reusing the lowest free row: the number of rows is the largest number
    of intervals open at once, i.e. the engine's peak concurrency.
    """
    order = sorted(range(len(spans)), key=lambda i: (spans[i][0], spans[i][1]))
    busy: list[tuple[float, int]] = []  # (end, row)
    free: list[int] = []
    rows = [0] * len(spans)
    n_rows = 0
    for i in order:
        start, end = spans[i]
        while busy and busy[0][0] <= start:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            row = heapq.heappop(free)
        else:
            row, n_rows = n_rows, n_rows + 1
        rows[i] = row
        heapq.heappush(busy, (end, row))
    return rows


def engine_lanes(trace: Trace) -> list[tuple[list[RequestSpan], list[int]]]:
    """For each engine: its request spans and the row of each (see `pack_rows`)."""
    lanes: list[tuple[list[RequestSpan], list[int]]] = []
    for e in range(trace.n_engines):
        reqs = [r for r in trace.requests if r.engine == e]
        lanes.append((reqs, pack_rows([(r.submit_s, r.end_s) for r in reqs])))
    return lanes


def engine_curves(trace: Trace) -> list[list[EngineSample]]:
    """For each engine: its samples in time order."""
    out: list[list[EngineSample]] = [[] for _ in range(trace.n_engines)]
    for s in trace.engine_samples:
        if 0 <= s.engine < trace.n_engines:
            out[s.engine].append(s)
    for samples in out:
        samples.sort(key=lambda s: s.t)
    return out


def _time_label(trace: Trace) -> str:
    return "simulated time (s)" if trace.source == "sim" else "wall time (s)"


def _title(trace: Trace) -> str:
    versions = {r.version for r in trace.requests}
    return (f"{trace.scheduler}: {trace.n_engines} engines, {len(trace.requests):,} request "
            f"submissions, {len(versions)} policy versions ({trace.source})")


# ------------------------------------------------------------------------------ matplotlib
def timeline_figure(trace: Trace, labels: Sequence[int] | None = None):
    """The timeline as a matplotlib Figure (see the module docstring for what it shows);
    `labels`: the original engine numbers of a `select`ed trace."""
    import matplotlib.pyplot as plt
    from matplotlib.collections import LineCollection

    n = trace.n_engines
    k = 2 if trace.engine_samples else 1  # axes per engine: the lane, and the curves if any
    heights = [0.35] + ([2.4, 1.0] if k == 2 else [2.4]) * n
    fig, axes = plt.subplots(1 + k * n, 1, sharex=True,
                             figsize=(12, 1.6 + (3.1 if k == 2 else 2.2) * n),
                             gridspec_kw={"height_ratios": heights}, layout="constrained")
    strip = axes[0]
    bands = [p for p in trace.phases if p.phase in ("train", "sync")]
    for p in trace.phases:
        strip.broken_barh([(p.start_s, p.end_s - p.start_s)], (0, 1),
                          facecolors=PHASE_COLORS[p.phase])
    strip.set_yticks([])
    strip.set_ylabel("phase", rotation=0, ha="right", va="center")
    for ax in axes[1:]:
        for p in bands:
            ax.axvspan(p.start_s, p.end_s, color=PHASE_COLORS[p.phase], alpha=0.12, lw=0)

    curves = engine_curves(trace)
    for e, (reqs, rows) in enumerate(engine_lanes(trace)):
        lane = axes[1 + k * e]
        n_rows = max(rows, default=0) + 1
        spans = [queued_running(r) for r in reqs]
        segs = [[(run[0], row), (run[1], row)] for (_, run), row in zip(spans, rows)]
        lw = max(0.4, min(4.0, 160.0 / n_rows))
        lane.add_collection(LineCollection(segs, colors=[version_color(r.version) for r in reqs],
                                           linewidths=lw, capstyle="butt"))
        queued = [([(q[0], row), (q[1], row)], version_color(r.version))
                  for r, (q, _), row in zip(reqs, spans, rows) if q is not None]
        if queued:
            lane.add_collection(LineCollection([q for q, _ in queued],
                                               colors=[c for _, c in queued],
                                               linewidths=max(0.3, lw / 3), alpha=QUEUED_ALPHA,
                                               capstyle="butt"))
        for pick, where, marker, color in (
            (lambda r: r.reason == "abort", "end", *MARKERS["abort"][::2]),
            (lambda r: r.retractions > 0, "end", *MARKERS["retraction"][::2]),
            (lambda r: r.carried > 0, "start", *MARKERS["resumed partial"][::2]),
        ):
            pts = [((r.end_s if where == "end" else r.submit_s), row)
                   for r, row in zip(reqs, rows) if pick(r)]
            if pts:
                lane.scatter(*zip(*pts), marker=marker, s=14, color=color, zorder=3, linewidths=1)
        lane.set_ylim(-1, n_rows)
        lane.set_ylabel(f"engine {labels[e] if labels else e}\nrequest slot")
        if k == 1:
            continue
        under, s = axes[2 + 2 * e], curves[e]
        if s:
            ts = [x.t for x in s]
            under.step(ts, [x.running for x in s], where="post", color="#08519c", lw=2.4)
            kv = under.twinx()
            kv.step(ts, [x.kv_tokens / 1000 for x in s], where="post", color="#a63603", lw=1.2)
            kv.set_ylabel("KV (k tokens)", color="#a63603")
            kv.set_ylim(bottom=0)
        under.set_ylabel("running\n(requests)", color="#08519c")
        under.set_ylim(bottom=0)
    axes[-1].set_xlabel(_time_label(trace))
    if trace.requests or trace.phases:
        axes[-1].set_xlim(left=min([r.submit_s for r in trace.requests]
                                   + [p.start_s for p in trace.phases]))
    handles = _legend_handles(trace)
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 7),
               frameon=False, fontsize=9)
    fig.suptitle(_title(trace), fontsize=11)
    return fig


def _legend_handles(trace: Trace) -> list[Any]:
    """The figure's legend: versions (first 10), markers, queued spans and the phases shown."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    versions = sorted({r.version for r in trace.requests})
    handles: list[Any] = [Line2D([], [], color=version_color(v), lw=4, label=f"version {v}")
                          for v in versions[:10]]
    if len(versions) > 10:
        handles.append(Line2D([], [], lw=0, label="(colours repeat every 10)"))
    handles += [Line2D([], [], marker=m, color=c, lw=0, label=name)
                for name, (m, _, c) in MARKERS.items()]
    if any(queued_running(r)[0] is not None for r in trace.requests):
        handles.append(Line2D([], [], color="0.5", lw=1, alpha=QUEUED_ALPHA * 2,
                              label="queued (submit to first token)"))
    handles += [Patch(color=PHASE_COLORS[k], label=PHASE_LABELS[k])
                for k in PHASE_COLORS if any(p.phase == k for p in trace.phases)]
    return handles


def write_png(trace: Trace, path: str | Path, labels: Sequence[int] | None = None) -> Path:
    """Render `trace` with matplotlib to `path` (PNG, PDF or SVG by suffix)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = timeline_figure(trace, labels)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return Path(path)


# ---------------------------------------------------------------------------------- plotly
def timeline_plotly(trace: Trace, labels: Sequence[int] | None = None):
    """The timeline as a plotly Figure: the same lanes and curves, zoomable, with hover."""
    from plotly.subplots import make_subplots

    n = trace.n_engines
    k = 2 if trace.engine_samples else 1  # rows per engine: the lane, and the curves if any
    heights = ([2.4, 1.0] if k == 2 else [2.4]) * n
    names = list(labels) if labels else list(range(n))
    titles = [t for e in names
              for t in (f"engine {e}: requests", f"engine {e}: batch and KV")[:k]]
    fig = make_subplots(rows=k * n, cols=1, shared_xaxes=True, vertical_spacing=0.02,
                        row_heights=heights, subplot_titles=titles,
                        specs=[[{"secondary_y": k == 2 and i % 2 == 1}] for i in range(k * n)])
    seen: set[int] = set()
    curves = engine_curves(trace)
    for e, (reqs, rows) in enumerate(engine_lanes(trace)):
        by_version: dict[int, list[tuple[RequestSpan, int]]] = {}
        for r, row in zip(reqs, rows):
            by_version.setdefault(r.version, []).append((r, row))
        for v, items in sorted(by_version.items()):
            xs: list[float | None] = []
            ys: list[int | None] = []
            text: list[str | None] = []
            qx: list[float | None] = []
            qy: list[int | None] = []
            for r, row in items:
                info = (f"rid {r.rid}, sample {r.sample_uid}, group {r.group_id}<br>version {v}, "
                        f"{r.tokens} tokens (+{r.carried} carried), {r.reason}")
                queued, run = queued_running(r)
                xs += [run[0], run[1], None]
                ys += [row, row, None]
                text += [info, info, None]
                if queued is not None:
                    qx += [queued[0], queued[1], None]
                    qy += [row, row, None]
            if qx:
                fig.add_scattergl(x=qx, y=qy, hoverinfo="skip", mode="lines", opacity=QUEUED_ALPHA,
                                  line={"color": version_color(v), "width": 1},
                                  name="queued", legendgroup="queued", showlegend=False,
                                  row=k * e + 1, col=1)
            fig.add_scattergl(x=xs, y=ys, text=text, hoverinfo="text+x", mode="lines",
                              line={"color": version_color(v), "width": 3},
                              name=f"version {v}", legendgroup=f"v{v}",
                              showlegend=v not in seen, row=k * e + 1, col=1)
            seen.add(v)
        for pick, where, symbol, color, label in (
            (lambda r: r.reason == "abort", "end", *MARKERS["abort"][1:], "abort"),
            (lambda r: r.retractions > 0, "end", *MARKERS["retraction"][1:], "retraction"),
            (lambda r: r.carried > 0, "start", *MARKERS["resumed partial"][1:], "resumed partial"),
        ):
            pts = [((r.end_s if where == "end" else r.submit_s), row)
                   for r, row in zip(reqs, rows) if pick(r)]
            if pts:
                fig.add_scattergl(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="markers",
                                  marker={"symbol": symbol, "color": color, "size": 7},
                                  name=label, legendgroup=label, showlegend=e == 0,
                                  row=k * e + 1, col=1)
        fig.update_yaxes(title_text="request slot", row=k * e + 1, col=1)
        s = curves[e] if k == 2 else []
        if s:
            ts = [x.t for x in s]
            fig.add_scatter(x=ts, y=[x.running for x in s], line_shape="hv", name="running",
                            line={"color": "#08519c"}, legendgroup="running",
                            showlegend=e == 0, row=2 * e + 2, col=1)
            fig.add_scatter(x=ts, y=[x.kv_tokens for x in s], line_shape="hv", name="KV tokens",
                            line={"color": "#a63603"}, legendgroup="kv", showlegend=e == 0,
                            row=2 * e + 2, col=1, secondary_y=True)
            fig.update_yaxes(title_text="running (req)", row=2 * e + 2, col=1, secondary_y=False)
            fig.update_yaxes(title_text="KV (tokens)", row=2 * e + 2, col=1, secondary_y=True)
    for p in trace.phases:
        if p.phase in ("train", "sync"):
            # one shape across all lanes (x axes are shared), not one per subplot
            fig.add_shape(type="rect", xref="x", yref="paper", x0=p.start_s, x1=p.end_s, y0=0,
                          y1=1, fillcolor=PHASE_COLORS[p.phase], opacity=0.15, line_width=0,
                          layer="below")
    fig.update_xaxes(title_text=_time_label(trace), row=k * n, col=1)
    fig.update_layout(title=_title(trace) + " - shaded: grey training, orange weight sync",
                      height=(320 if k == 2 else 230) * n + 150, template="plotly_white",
                      legend={"orientation": "h", "y": 1.02, "yanchor": "bottom"})
    return fig


def timeline_html(trace: Trace, labels: Sequence[int] | None = None) -> str:
    """A self-contained HTML page (plotly.js embedded: opens offline)."""
    return timeline_plotly(trace, labels).to_html(include_plotlyjs=True, full_html=True)


def write_html(trace: Trace, path: str | Path, labels: Sequence[int] | None = None) -> Path:
    """Write `timeline_html(trace)` to `path`."""
    p = Path(path)
    p.write_text(timeline_html(trace, labels), encoding="utf-8")
    return p


def write_timeline(trace: Trace, path: str | Path, labels: Sequence[int] | None = None) -> Path:
    """PNG/PDF/SVG through matplotlib, or HTML through plotly, chosen by the suffix of `path`."""
    suffix = Path(path).suffix.lower()
    if suffix in (".html", ".htm"):
        return write_html(trace, path, labels)
    if suffix in (".png", ".pdf", ".svg"):
        return write_png(trace, path, labels)
    raise ValueError(f"{path}: timeline output must end in .png, .pdf, .svg or .html")
