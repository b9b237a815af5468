"""The engines' next event times, earliest first: which engine the simulated loop serves next.

Order: by time, then by engine index (ties are common: identical engines given identical batches
at one instant end their prefills together). Two implementations of one interface, each the
faster where it runs, serving engines in the same order (`tests/test_engine_clock.py`):

* `TupleClock`, for pure Python: a heap of (time, engine) tuples, invalidated lazily (an engine
  that re-plans is pushed again; its old entry is skipped when it comes up). `heapq` sifts in C.
* `IndexedClock`, for the compiled build: a heap of engine indices keyed by (armed time, index),
  each engine in it at most once, sifted in compiled code with native float comparisons. The
  tuple heap's comparisons (an equality and an order test per element, through the object
  protocol) were 6 % of a compiled 64-engine run, twice that at 4,096 engines; a heap of floats
  with a dict for ties cost more than it saved (dicts keyed by boxed floats).

`engine_clock(n)` picks the one for the build that is loaded.
"""

from __future__ import annotations

import math
from heapq import heappop, heappush, heapreplace
from typing import Final

from aprilsim.native import compiled_modules

INF: Final = math.inf  # Final: a C static in the compiled build, not a dict lookup per use


class TupleClock:
    """Engine i's next event time is `armed[i]` (INF: none); `first()` names the engine due first.

    `arm(i, t)` files engine i at t (after a re-plan); `served(i, nxt)` says that engine i, the
    one `first()` named, was served and its next event is at `nxt` (INF: none, or armed later).
    """

    __slots__ = ("armed", "_heap")

    def __init__(self, n_engines: int) -> None:
        self.armed: list[float] = [INF] * n_engines
        self._heap: list[tuple[float, int]] = []  # (time, engine), lazily invalidated

    def __bool__(self) -> bool:
        """True while any entry is left (live or not yet found stale)."""
        return bool(self._heap)

    def arm(self, i: int, t: float) -> None:
        """Engine i's next event is at t now (INF: none)."""
        if t != self.armed[i]:
            self.armed[i] = t
            if t < INF:
                heappush(self._heap, (t, i))

    def first(self) -> int:
        """The engine whose event comes first (lowest index among ties), or -1 when none is
        armed; stale entries met on the way are dropped."""
        heap, armed = self._heap, self.armed
        while heap and heap[0][0] != armed[heap[0][1]]:
            heappop(heap)  # stale: that engine re-planned
        return heap[0][1] if heap else -1

    def served(self, i: int, nxt: float) -> None:
        """Engine i, named by `first()`, was served; its next event is at `nxt`."""
        self.armed[i] = nxt
        if nxt < INF:
            heapreplace(self._heap, (nxt, i))  # pop its event and push its next in one sift
        else:
            heappop(self._heap)


class IndexedClock:
    """`TupleClock`'s interface over an indexed heap: `_heap` holds the armed engines, ordered
    by (armed time, index), and `_pos[i]` is engine i's place in it (-1: not armed)."""

    __slots__ = ("armed", "_heap", "_pos")

    def __init__(self, n_engines: int) -> None:
        self.armed: list[float] = [INF] * n_engines
        self._heap: list[int] = []
        self._pos: list[int] = [-1] * n_engines

    def __bool__(self) -> bool:
        return len(self._heap) > 0

    def arm(self, i: int, t: float) -> None:
        old = self.armed[i]
        if t == old:
            return
        self.armed[i] = t
        p = self._pos[i]
        if p < 0:  # not in the heap (t < INF: it was not armed)
            self._heap.append(i)
            self._up(len(self._heap) - 1)
        elif t == INF:
            self._remove(p)
        elif t < old:
            self._up(p)
        else:
            self._down(p)

    def first(self) -> int:
        return self._heap[0] if self._heap else -1

    def served(self, i: int, nxt: float) -> None:
        self.armed[i] = nxt
        if nxt < INF:
            self._down(0)  # its time only grows (or stays): it sinks from the root
        else:
            self._remove(0)

    def _remove(self, p: int) -> None:
        """Take the engine at place p out of the heap."""
        heap, pos = self._heap, self._pos
        pos[heap[p]] = -1
        last = heap.pop()
        if p < len(heap):
            heap[p] = last
            pos[last] = p
            self._down(p)
            self._up(pos[last])

    def _up(self, p: int) -> None:
        """Move the engine at place p towards the root while it comes before its parent."""
        heap, pos, armed = self._heap, self._pos, self.armed
        i = heap[p]
        t = armed[i]
        while p > 0:
            q = (p - 1) >> 1
            j = heap[q]
            tj = armed[j]
            if tj < t or (tj == t and j < i):
                break
            heap[p] = j
            pos[j] = p
            p = q
        heap[p] = i
        pos[i] = p

    def _down(self, p: int) -> None:
        """Move the engine at place p away from the root while a child comes before it."""
        heap, pos, armed = self._heap, self._pos, self.armed
        n = len(heap)
        i = heap[p]
        t = armed[i]
        while True:
            c = 2 * p + 1
            if c >= n:
                break
            j = heap[c]
            tj = armed[j]
            if c + 1 < n:
                k = heap[c + 1]
                tk = armed[k]
                if tk < tj or (tk == tj and k < j):
                    c, j, tj = c + 1, k, tk
            if t < tj or (t == tj and i < j):
                break
            heap[p] = j
            pos[j] = p
            p = c
        heap[p] = i
        pos[i] = p


def engine_clock(n_engines: int) -> TupleClock | IndexedClock:
    """The clock for `n_engines` engines that is faster in the build loaded (asked as the
    workload asks it, `native.compiled_modules`)."""
    compiled = "aprilsim.sim.engine_clock" in compiled_modules()
    return IndexedClock(n_engines) if compiled else TupleClock(n_engines)
