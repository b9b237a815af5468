"""Text from a user's file made safe for a terminal: control characters shown escaped.

Column names, cells and file names reach error messages and tables; an escape sequence or a BEL
in them must not recolour or beep the user's terminal. Printable text (any script) is kept.
"""

from __future__ import annotations


def printable(text: str) -> str:
    """`text` with every non-printable character as a Python escape (\\x1b, \\x07, \\u200b)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def printable_lines(text: str) -> str:
    """`printable` on each line, newlines kept (for multi-line tables)."""
    return "\n".join(printable(line) for line in text.split("\n"))
