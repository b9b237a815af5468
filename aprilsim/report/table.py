"""A plain-text comparison table: one row per scheduler."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

COLUMNS: list[tuple[str, str, str]] = [
    ("scheduler", "scheduler", "{}"),
    ("rollout_throughput_tok_s", "rollout tok/s", "{:,.0f}"),
    ("mean_rollout_time_s", "rollout s", "{:.1f}"),
    ("mean_step_time_s", "step s", "{:.1f}"),
    ("samples_per_s", "samples/s", "{:,.2f}"),
    ("engine_busy_fraction", "busy", "{:.0%}"),
    ("efficiency_vs_ideal", "eff.", "{:.0%}"),
    ("offpolicy_token_fraction", "off-policy", "{:.0%}"),
    ("mean_trained_length", "trained len", "{:,.0f}"),
    ("length_bias", "len bias", "{:+.1%}"),
    ("wasted_tokens", "wasted tok", "{:,}"),
    ("retractions", "retract", "{:,}"),
    ("latency_p50_s", "lat p50 s", "{:.0f}"),  # response completion time (docs/metrics.md)
    ("latency_p99_s", "lat p99 s", "{:.0f}"),
]


def _cell(value: Any, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def format_table(rows: Sequence[dict[str, Any]], baseline: str | None = "sync") -> str:
    """Align the summary rows; with `baseline` present, add its ratios: rollout tok/s (the
    rollout phase alone) and trained samples/s (end to end, training and weight sync included:
    the figure that ranks disaggregated schedulers, whose rollout overlaps training)."""
    if not rows:
        return "(no scheduler ran)"
    cols = list(COLUMNS)
    base = next((r for r in rows if r["scheduler"] == baseline), None)
    ratios = [("rollout_throughput_tok_s", "tok/s"), ("samples_per_s", "samples/s")]
    cells = []
    for r in rows:
        line = [_cell(r.get(key), fmt) for key, _, fmt in cols]
        if base is not None:
            for key, _ in ratios:
                b = base[key]
                line.append(f"{r[key] / b:.2f}x" if b else "-")
        cells.append(line)
    heads = [h for _, h, _ in cols] + (
        [f"{what} vs {baseline}" for _, what in ratios] if base is not None else [])
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]
    out = ["  ".join(h.rjust(w) if i else h.ljust(w)
                     for i, (h, w) in enumerate(zip(heads, widths)))]
    out.append("  ".join("-" * w for w in widths))
    for c in cells:
        out.append("  ".join(x.rjust(w) if i else x.ljust(w)
                             for i, (x, w) in enumerate(zip(c, widths))))
    return "\n".join(out)
