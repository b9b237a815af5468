"""How many rows a reader dropped, said so that a user notices: a line, a warning, or a refusal.

A few bad rows in a large log are normal and get an information line. When more than
`WARN_SHARE` of the rows are dropped the line becomes a warning with the share, the main reason and
an example of a rejected cell (a semicolon file or a thousands separator shows up there at once).
Above `max_skipped` (default `MAX_SKIPPED`) the fit is refused: a model fitted to the surviving
minority of a file is more likely wrong than useful.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aprilsim.workload.fitting.errors import LengthDataError

if TYPE_CHECKING:  # numpy: not for `fit --help`
    from aprilsim.workload.fitting.data import LengthData

WARN_SHARE = 0.01
MAX_SKIPPED = 0.2


def share_skipped(data: LengthData) -> float:
    return data.n_skipped / data.rows_read if data.rows_read else 0.0


def main_reason(data: LengthData) -> str:
    """'mostly <reason>, e.g. <first such cell>' for the most frequent reason."""
    reason = max(data.skipped, key=lambda r: data.skipped[r])
    example = data.skip_examples.get(reason)
    return f"mostly {reason}" + (f", e.g. {example!r}" if example is not None else "")


def skipped_line(data: LengthData) -> str | None:
    """The stderr line reporting dropped rows (None when none were dropped)."""
    if not data.skipped:
        return None
    counts = ", ".join(f"{v:,} {k}" for k, v in data.skipped.items())
    base = f"skipped {data.n_skipped:,} of {data.rows_read:,} rows: {counts}"
    share = share_skipped(data)
    if share <= WARN_SHARE:
        return base
    return f"warning: {base} ({100 * share:.1f} % of rows; {main_reason(data)})"


def check_skipped(data: LengthData, max_skipped: float | None = MAX_SKIPPED) -> None:
    """Raise LengthDataError when more than `max_skipped` of the rows were dropped."""
    if max_skipped is None or not data.skipped:
        return
    share = share_skipped(data)
    if share > max_skipped:
        raise LengthDataError(
            f"{data.source}: {100 * share:.1f} % of rows unusable ({data.n_skipped:,} of "
            f"{data.rows_read:,}; {main_reason(data)}), above --max-skipped "
            f"{max_skipped:g}: fix the input, name the column, or raise --max-skipped"
        )
