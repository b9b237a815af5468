"""Both engine clocks against the runtime's former heap of (time, engine) tuples: the same engine is
served first after every filing and serving, ties (several engines at one time, an engine filed
again at its time) and re-filings included. The property counts the ties and re-filings it
reached."""

from __future__ import annotations

import heapq
import math
from collections import Counter

import pytest
from hypothesis import event, given, settings, target
from hypothesis import strategies as st

from aprilsim.sim.engine_clock import IndexedClock, TupleClock

INF = math.inf
REACHED: Counter[str] = Counter()


class TupleHeap:
    """The runtime's former structure: a heap of (time, engine), lazily invalidated."""

    def __init__(self, n: int) -> None:
        self.armed = [INF] * n
        self.heap: list[tuple[float, int]] = []

    def arm(self, i: int, t: float) -> None:
        if t != self.armed[i]:
            self.armed[i] = t
            if t < INF:
                heapq.heappush(self.heap, (t, i))

    def first(self) -> int:
        while self.heap and self.heap[0][0] != self.armed[self.heap[0][1]]:
            heapq.heappop(self.heap)
        return self.heap[0][1] if self.heap else -1

    def served(self, i: int, nxt: float) -> None:
        self.armed[i] = nxt
        if nxt < INF:
            heapq.heapreplace(self.heap, (nxt, i))
        else:
            heapq.heappop(self.heap)


# few distinct times, so that engines tie often; INF: the engine goes idle
TIMES = st.sampled_from([0.0, 0.5, 1.0, 1.0, 2.5, 3.0, INF])
STEP = st.tuples(st.sampled_from(["arm", "serve", "serve"]), st.integers(0, 7), TIMES)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(n=st.integers(1, 8), steps=st.lists(STEP, max_size=80),
       kind=st.sampled_from([TupleClock, IndexedClock]))
def test_engine_clock_serves_engines_in_the_tuple_heaps_order(n, steps, kind):
    clock, ref = kind(n), TupleHeap(n)
    ties = stale = 0
    for op, i, t in steps:
        i %= n
        first = ref.first()
        assert clock.first() == first
        assert bool(clock) == bool(ref.heap)
        if first >= 0:
            at = ref.armed[first]
            ties += sum(1 for j in range(n) if j != first and ref.armed[j] == at)
        if op == "arm":
            if t != ref.armed[i] and ref.armed[i] < INF:
                stale += 1  # its earlier filing is left behind
            clock.arm(i, t)
            ref.arm(i, t)
        elif first >= 0:
            nxt = t if t == INF else ref.armed[first] + t  # served: its next event is later
            clock.served(first, nxt)
            ref.served(first, nxt)
        assert clock.armed == ref.armed
    assert clock.first() == ref.first()
    if ties:
        event("engines tied at the first time")
        REACHED["ties"] += 1
    if stale:
        event("stale filings skipped")
        REACHED["stale"] += 1
    target(float(ties), label="ties")


def test_the_property_reached_ties_and_stale_filings():
    REACHED.clear()
    test_engine_clock_serves_engines_in_the_tuple_heaps_order()
    assert REACHED["ties"] >= 50, dict(REACHED)
    assert REACHED["stale"] >= 50, dict(REACHED)


@pytest.mark.parametrize("kind", [TupleClock, IndexedClock])
def test_an_engine_served_at_the_same_time_again_comes_first_again(kind):
    clock = kind(3)
    for i in (2, 0, 1):
        clock.arm(i, 1.0)
    assert clock.first() == 0
    clock.served(0, 1.0)  # another event at the same instant: still before engines 1 and 2
    assert clock.first() == 0
    clock.served(0, 2.0)
    assert [clock.first()] == [1]
    clock.served(1, INF)
    assert clock.first() == 2
    clock.served(2, INF)
    assert clock.first() == 0 and clock.armed == [2.0, INF, INF]
