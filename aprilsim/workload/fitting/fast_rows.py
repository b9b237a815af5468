"""The readers' fast path: a block of clean lines to an array of lengths without the csv module.

A block with no quote, NUL or bare carriage return splits on its delimiter exactly as the csv
module splits it, and a cell that `float()` reads as a finite number is what `parse_number` would
make of it. When every row of a block is like that (long enough, its length cell such a number),
the block's lengths come back as one array: 1.4M clean rows read in a fraction of a second.
Anything else gives None and the reader takes the row-by-row path, which counts and explains
every rejected row, so a file reads to the same result either way, only faster when clean.
"""

from __future__ import annotations

import numpy as np

BLOCK_CHARS = 1 << 20  # lines are read in blocks of about this many characters


def _floats(cells: list[str]) -> np.ndarray | None:
    try:
        x = np.fromiter(map(float, cells), float, len(cells))
    except ValueError:
        return None
    return x if np.all(np.isfinite(x)) else None


def _non_blank(rows: list[str]) -> list[str]:
    if rows and not rows[-1]:
        rows.pop()  # the block ends with a newline
    return rows if all(rows) else [r for r in rows if r]  # whitespace-only rows: see callers


def delimited_lengths(
    lines: list[str], delimiter: str, column: int, width: int
) -> np.ndarray | None:
    """The `column` cells of delimited `lines` as floats (blank lines skipped, as the csv reader
    does), or None when the block needs the csv module or holds a cell that is not a plain
    finite number. `width` is the highest column index the reader needs."""
    block = "".join(lines)
    if '"' in block or "\x00" in block:
        return None
    if "\r" in block:
        block = block.replace("\r\n", "\n")
        if "\r" in block:
            return None
    rows = _non_blank(block.split("\n"))
    if width == 0 and delimiter not in block:
        x = _floats(rows)
        if x is None:  # perhaps whitespace-only rows, which the csv reader skips
            x = _floats([r for r in rows if not r.isspace()])
        return x
    parts = [r.split(delimiter) for r in rows]
    if any(len(p) <= width for p in parts):
        return None
    return _floats([p[column] for p in parts])


def plain_lengths(lines: list[str]) -> np.ndarray | None:
    """One length per line (blank lines skipped), or None when a line is not a finite number."""
    return _floats([line for line in lines if not line.isspace()])
