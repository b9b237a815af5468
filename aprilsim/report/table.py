"""A plain-text comparison table: one row per scheduler."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

COLUMNS: list[tuple[str, str, str]] = [
    ("scheduler", "scheduler", "{}"),
    ("rollout_throughput_tok_s", "rollout tok/s", "{:,.0f}"),
    ("mean_rollout_time_s", "rollout s", "{:.1f}"),
    ("mean_step_time_s", "step s", "{:.1f}"),
    ("engine_busy_fraction", "busy", "{:.0%}"),
    ("efficiency_vs_ideal", "eff.", "{:.0%}"),
    ("offpolicy_token_fraction", "off-policy", "{:.0%}"),
    ("mean_trained_length", "trained len", "{:,.0f}"),
    ("length_bias", "len bias", "{:+.1%}"),
    ("wasted_tokens", "wasted tok", "{:,}"),
    ("retractions", "retract", "{:,}"),
]


def format_table(rows: Sequence[dict[str, Any]], baseline: str | None = "sync") -> str:
    """Align the summary rows; add a speed-up column against `baseline` when it is present."""
    cols = list(COLUMNS)
    base = next((r for r in rows if r["scheduler"] == baseline), None)
    cells = []
    for r in rows:
        line = [fmt.format(r[key]) for key, _, fmt in cols]
        if base is not None:
            b = base["rollout_throughput_tok_s"]
            line.append(f"{r['rollout_throughput_tok_s'] / b:.2f}x" if b else "-")
        cells.append(line)
    heads = [h for _, h, _ in cols] + (["vs " + baseline] if base is not None else [])
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]
    out = ["  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(heads, widths)))]
    out.append("  ".join("-" * w for w in widths))
    for c in cells:
        out.append("  ".join(x.rjust(w) if i else x.ljust(w) for i, (x, w) in enumerate(zip(c, widths))))
    return "\n".join(out)
