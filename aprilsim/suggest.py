"""`did you mean ...?` for a mistyped name: the closest known names by edit similarity."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """` (did you mean 'x'?)` (or `'x' or 'y'`) when a known name is close to `word`, else ''."""
    close = difflib.get_close_matches(str(word), [str(k) for k in known], n=2, cutoff=0.6)
    if not close:
        return ""
    return " (did you mean " + " or ".join(repr(c) for c in close) + "?)"
