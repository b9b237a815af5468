"""One cell of a log to a number, or the reason it is not one.

Lengths arrive as JSON numbers, strings from CSV cells, or Arrow values. A cell becomes a float or
one of the skip reasons the readers count. Thousands separators (`"1,234"`, as spreadsheets quote
them) are accepted; values beyond 2^53 (where floats stop being exact integers, and int64 overflows
soon after) are "too large" rather than wrapping to negative lengths.
"""

from __future__ import annotations

import math
import re
from typing import Any

MAX_LENGTH = 2**53
TOO_LARGE = "too large"
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d*)?")


def parse_number(raw: Any) -> float | str:
    """A float, or the reason the raw cell is not one ("missing", "not a number", "too large",
    "zero or negative" for an overflowing negative)."""
    if raw is None:
        return "missing"
    if isinstance(raw, bool):
        return "not a number"
    if isinstance(raw, int):
        try:
            return float(raw)
        except OverflowError:  # beyond 1.8e308
            return TOO_LARGE if raw > 0 else "zero or negative"
    if isinstance(raw, float):
        return raw
    if not isinstance(raw, str):
        return "not a number"
    s = raw.strip()
    if not s:
        return "missing"
    if "," in s and _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    try:
        x = float(s)
    except ValueError:
        return "not a number"
    if math.isinf(x) and "inf" not in s.lower():  # digits beyond the float range
        return TOO_LARGE if x > 0 else "zero or negative"
    return x


def json_int(digits: str) -> int | str:
    """`parse_int` for the json module: long integers stay strings (parse_number judges them),
    so 10^400 or a 5,000-digit number is a bad row, not Python's int-conversion ValueError."""
    return int(digits) if len(digits) <= 18 else digits
