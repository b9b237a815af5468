"""The fast == reference comparison every engine-equivalence property makes: the same
completions (request, tokens, reason, time to 1e-9), the same branch counters, and per engine the
same tokens, retractions, KV peak (within capacity), stats and busy time, both ending idle."""

from __future__ import annotations

import math
from typing import Any


def close(x: float, y: float) -> bool:
    """Equal to 1e-9, relative or absolute: the two engines sum the same times in other orders."""
    return math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9)


def assert_engines_agree(fd: Any, rd: Any, kv_capacity: int) -> tuple[list, list]:
    """Run both drivers and assert they agree; returns their completions (fast, reference)."""
    fast, ref = fd.run(), rd.run()
    assert [c[:3] for c in fast] == [c[:3] for c in ref]
    for a, b in zip(fast, ref):
        assert close(a[3], b[3]), (a, b)
    assert fd.hits == rd.hits
    for ef, er in zip(fd.engines, rd.engines):
        assert ef.tokens == er.tokens
        assert ef.retractions == er.retractions
        assert ef.kv_peak == er.kv_peak <= kv_capacity
        assert ef.stats == er.stats  # migrated, cache, chunking, abort and ratio counters included
        if getattr(ef, "cache", None) is not None:
            assert ef.cache.runs == er.cache.runs  # the same retained runs, of the same age
        assert close(ef.busy_time, er.busy_time)
        assert ef.is_idle() and er.is_idle()
    return fast, ref
