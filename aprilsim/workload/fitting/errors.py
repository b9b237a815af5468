"""The one error type the fitting package raises for input it cannot use.

The CLI turns it into a one-line message and exit code 2; the Python API lets it propagate, so a
caller can tell "your file is unusable" (LengthDataError) from a bug (anything else).
"""

from __future__ import annotations


class LengthDataError(ValueError):
    """The input holds no usable lengths (empty, no numeric column, a single repeated value,
    ...)."""
