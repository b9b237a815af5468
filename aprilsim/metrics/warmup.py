"""The warm-up steps a summary leaves out, clamped to a run's length (one rule for every
command)."""

from __future__ import annotations


def clamp_warmup(warmup: int, steps_run: int) -> int:
    """`warmup` steps, but always at least one step left to summarise (none left out of a run of
    one step; a run cut short keeps its last step)."""
    return min(warmup, max(0, steps_run - 1))


def scaled_warmup(warmup: int, planned: int, steps: int) -> int:
    """The warm-up of a run asked for `steps` of a scenario planned for `planned` with `warmup`
    left out: the same share of a shorter run (at least one step when the scenario leaves any
    out), clamped; a longer run keeps `warmup`. The default's 8 of 40 steps become 2 of 10."""
    if steps >= planned or warmup == 0:
        return clamp_warmup(warmup, steps)
    return clamp_warmup(max(1, round(warmup * steps / planned)), steps)
