"""The warm-up steps a summary leaves out, clamped to a run's length (one rule for every command)."""

from __future__ import annotations


def clamp_warmup(warmup: int, steps_run: int) -> int:
    """`warmup` steps, but always at least one step left to summarise (none left out of a run of
    one step; a run cut short keeps its last step)."""
    return min(warmup, max(0, steps_run - 1))
