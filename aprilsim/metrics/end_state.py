"""The end-of-run ledger as users read it: in flight, buffered, trained, wasted (samples and
tokens).

`RunResult.end_state` counts every sample by status; this view groups it the way a run is
reasoned about and is written at the end of every `simulate` and `run` (JSON key `end_state`, and
one line per scheduler under the table).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def end_view(end_state: Mapping[str, int]) -> dict[str, int]:
    """In flight when the run ended, buffered (partial or done, not trained), trained, wasted,
    never submitted: samples and tokens of each (every sample is in exactly one bucket but the
    first, which the buffered count includes)."""
    e = end_state
    return {
        "in_flight_samples": e.get("in_flight_at_end", 0),
        "in_flight_tokens": e.get("in_flight_tokens_at_end", 0),
        "buffered_samples": e.get("samples_partial", 0) + e.get("samples_done", 0),
        "buffered_tokens": e.get("tokens_partial", 0) + e.get("tokens_done", 0),
        "trained_samples": e.get("samples_trained", 0),
        "trained_tokens": e.get("tokens_trained", 0),
        "wasted_samples": e.get("samples_discarded", 0),
        "wasted_tokens": e.get("tokens_discarded", 0),
        "pending_samples": e.get("samples_pending", 0),
        "samples_created": e.get("samples_created", 0),
        "engine_tokens": e.get("engine_tokens", 0),
    }


def with_end_state(row: dict[str, Any], end_state: Mapping[str, int]) -> dict[str, Any]:
    """`row` (a summary) with the end-of-run ledger under `end_state`."""
    row["end_state"] = end_view(end_state)
    return row


def end_state_lines(rows: Sequence[Mapping[str, Any]]) -> str:
    """One line per scheduler: where its samples were when the run ended."""
    out = ["end of run (samples / tokens):"]
    for r in rows:
        v = r.get("end_state")
        if not v:
            continue
        out.append(
            f"  {r['scheduler']}: {v['in_flight_samples']} in flight (stopped), "
            f"{v['buffered_samples']} buffered / {v['buffered_tokens']:,}, "
            f"{v['trained_samples']} trained / {v['trained_tokens']:,}, "
            f"{v['wasted_samples']} wasted / {v['wasted_tokens']:,}, "
            f"{v['pending_samples']} never submitted")
    return "\n".join(out) if len(out) > 1 else ""
