"""The engines' next event times, earliest first: which engine the simulated loop serves next.

Order: by time, then by engine index (ties are common: identical engines given identical batches
at one instant end their prefills together). Two implementations of one interface, each the
faster where it runs, serving engines in the same order (`tests/test_engine_clock.py`):

* `TupleClock`, for pure Python: a heap of (time, engine) tuples, invalidated lazily (an engine
  that re-plans is pushed again; its old entry is skipped when it comes up). `heapq` sifts in C.
* `IndexedClock`, for the compiled build: a heap of per-engine records keyed by (armed time,
  index), each engine in it at most once, sifted in compiled code with native float comparisons.
  The tuple heap's comparisons (an equality and an order test per element, through the object
  protocol) were 6 % of a compiled 64-engine run, twice that at 4,096 engines; a heap of floats
  with a dict for ties cost more than it saved (dicts keyed by boxed floats); a heap of engine
  indices over lists of times and places boxed a float or an int at each store (~300
  instructions a level, 7 % of a compiled 64-engine run), which records with native attributes
  do not.

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

    __slots__ = ("armed", "heap")

    def __init__(self, n_engines: int) -> None:
        self.armed: list[float] = [INF] * n_engines
        # (time, engine), lazily invalidated; the simulator's engine loop runs `first`, `time`
        # and `served` inline on it and on `armed` (a Python call per event is dear)
        self.heap: list[tuple[float, int]] = []

    def time(self, i: int) -> float:
        """Engine i's next event time (INF: none)."""
        return self.armed[i]

    def __bool__(self) -> bool:
        """True while any entry is left (live or not yet found stale)."""
        return bool(self.heap)

    def arm(self, i: int, t: float) -> None:
        """Engine i's next event is at t now (INF: none)."""
        if t != self.armed[i]:
            self.armed[i] = t
            if t < INF:
                heappush(self.heap, (t, i))

    def first(self) -> int:
        """The engine whose event comes first (lowest index among ties), or -1 when none is
        armed; stale entries met on the way are dropped."""
        heap, armed = self.heap, self.armed
        while heap and heap[0][0] != armed[heap[0][1]]:
            heappop(heap)  # stale: that engine re-planned
        return heap[0][1] if heap else -1

    def served(self, i: int, nxt: float) -> None:
        """Engine i, named by `first()`, was served; its next event is at `nxt`."""
        self.armed[i] = nxt
        if nxt < INF:
            heapreplace(self.heap, (nxt, i))  # pop its event and push its next in one sift
        else:
            heappop(self.heap)


class _Armed:
    """One engine in `IndexedClock`: its next event time `t`, its index `i`, its place `p` in
    the heap (-1: not armed). Native attributes in the compiled build: reading and moving them
    boxes nothing, where lists of floats and ints boxed a number at every store."""

    __slots__ = ("t", "i", "p")

    def __init__(self, i: int) -> None:
        self.t: float = INF
        self.i = i
        self.p = -1


class IndexedClock:
    """`TupleClock`'s interface over an indexed heap: `_heap` holds the armed engines (their
    `_Armed` records), ordered by (armed time, index), each record knowing its place."""

    __slots__ = ("_engines", "_heap")

    def __init__(self, n_engines: int) -> None:
        self._engines = [_Armed(i) for i in range(n_engines)]
        self._heap: list[_Armed] = []

    @property
    def armed(self) -> list[float]:
        """Each engine's next event time (INF: none), as `TupleClock.armed`."""
        return [e.t for e in self._engines]

    def time(self, i: int) -> float:
        """Engine i's next event time (INF: none)."""
        return self._engines[i].t

    def __bool__(self) -> bool:
        return len(self._heap) > 0

    def arm(self, i: int, t: float) -> None:
        e = self._engines[i]
        old = e.t
        if t == old:
            return
        e.t = t
        p = e.p
        if p < 0:  # not in the heap (t < INF: it was not armed)
            self._heap.append(e)
            self._up(len(self._heap) - 1)
        elif t == INF:
            self._remove(p)
        elif t < old:
            self._up(p)
        else:
            self._down(p)

    def first(self) -> int:
        return self._heap[0].i if self._heap else -1

    def served(self, i: int, nxt: float) -> None:
        self._engines[i].t = nxt
        if nxt < INF:
            self._down(0)  # its time only grows (or stays): it sinks from the root
        else:
            self._remove(0)

    def _remove(self, p: int) -> None:
        """Take the engine at place p out of the heap."""
        heap = self._heap
        heap[p].p = -1
        last = heap.pop()
        if p < len(heap):
            heap[p] = last
            last.p = p
            self._down(p)
            self._up(last.p)

    def _up(self, p: int) -> None:
        """Move the engine at place p towards the root while it comes before its parent."""
        heap = self._heap
        e = heap[p]
        t, i = e.t, e.i
        while p > 0:
            q = (p - 1) >> 1
            f = heap[q]
            tf = f.t
            if tf < t or (tf == t and f.i < i):
                break
            heap[p] = f
            f.p = p
            p = q
        heap[p] = e
        e.p = p

    def _down(self, p: int) -> None:
        """Move the engine at place p away from the root while a child comes before it."""
        heap = self._heap
        n = len(heap)
        e = heap[p]
        t, i = e.t, e.i
        while True:
            c = 2 * p + 1
            if c >= n:
                break
            a = heap[c]
            ta = a.t
            if c + 1 < n:
                b = heap[c + 1]
                tb = b.t
                if tb < ta or (tb == ta and b.i < a.i):
                    c, a, ta = c + 1, b, tb
            if t < ta or (t == ta and i < a.i):
                break
            heap[p] = a
            a.p = p
            p = c
        heap[p] = e
        e.p = p


def engine_clock(n_engines: int) -> TupleClock | IndexedClock:
    """The clock for `n_engines` engines that is faster in the build loaded (asked as the
    workload asks it, `native.compiled_modules`)."""
    compiled = "aprilsim.sim.engine_clock" in compiled_modules()
    return IndexedClock(n_engines) if compiled else TupleClock(n_engines)
