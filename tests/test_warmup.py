"""One warm-up clamp for every command: what a summary leaves out, never all of a run."""

from __future__ import annotations

from hypothesis import event, given
from hypothesis import strategies as st

from aprilsim.metrics.warmup import clamp_warmup


@given(warmup=st.integers(0, 50), steps=st.integers(1, 50))
def test_clamp_leaves_at_least_one_step_and_keeps_what_fits(warmup, steps):
    w = clamp_warmup(warmup, steps)
    event("clamped" if w < warmup else "kept")
    assert 0 <= w <= warmup and w < steps
    assert (w == warmup) == (warmup < steps)


def test_clamp_examples():
    assert [clamp_warmup(1, n) for n in (0, 1, 2, 5)] == [0, 0, 1, 1]
    assert clamp_warmup(3, 2) == 1
