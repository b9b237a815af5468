"""The engines' next event times, earliest first: which engine the simulated loop serves next.

Order: by time, then by engine index (ties are common: identical engines given identical batches
at one instant end their prefills together). Entries are invalidated lazily: an engine that
re-plans is filed again and its old entry is skipped once it comes up.

A heap of (time, engine) tuples did this in one structure, but every sift step compared two tuples
(an equality and an order test per element): 6 % of a compiled 64-engine run and twice that at
4,096 engines. Here the heap holds the distinct times as floats, and a dict maps each to the
engines filed at it, so a sift step is one float comparison and ties are resolved in the dict.
"""

from __future__ import annotations

import math
from heapq import heappop, heappush, heapreplace

INF = math.inf


class EngineClock:
    """Engine i's next event time is `armed[i]` (INF: none); `first()` names the engine due first.

    `arm(i, t)` files engine i at t (after a re-plan); `served(i, nxt)` says the first engine's
    event was carried out and its next is at `nxt` (INF: none, or to be armed later). Each engine
    filed at a time is listed there once per filing; a filing is live while `armed` still says so.
    """

    __slots__ = ("armed", "_times", "_at")

    def __init__(self, n_engines: int) -> None:
        self.armed: list[float] = [INF] * n_engines
        self._times: list[float] = []  # heap of the distinct times with a filing (maybe stale)
        self._at: dict[float, list[int]] = {}  # time -> the engines filed at it, in filing order

    def __bool__(self) -> bool:
        """True while any filing is left (live or not yet found stale)."""
        return bool(self._times)

    def arm(self, i: int, t: float) -> None:
        """Engine i's next event is at t now (INF: none)."""
        if t == self.armed[i]:
            return
        self.armed[i] = t
        if t < INF:
            self._file(i, t)

    def _file(self, i: int, t: float) -> None:
        listed = self._at.get(t)
        if listed is None:
            self._at[t] = [i]
            heappush(self._times, t)
        else:
            listed.append(i)

    def first(self) -> int:
        """The engine whose event comes first (lowest index among ties), or -1 when none is
        armed; stale filings met on the way are dropped."""
        times, at, armed = self._times, self._at, self.armed
        while times:
            t = times[0]
            best = -1
            for j in at[t]:
                if armed[j] == t and (best < 0 or j < best):
                    best = j
            if best >= 0:
                return best
            heappop(times)  # every filing at t is stale
            del at[t]
        return -1

    def served(self, i: int, nxt: float) -> None:
        """Engine i, returned by `first()`, was served; its next event is at `nxt`."""
        t = self.armed[i]
        listed = self._at[t]
        listed.remove(i)  # its live filing (an earlier stale one of it at t goes just as well)
        self.armed[i] = nxt
        if listed:
            if nxt < INF:
                self._file(i, nxt)
            return
        del self._at[t]
        if nxt < INF and nxt not in self._at:  # pop t and push nxt in one sift
            self._at[nxt] = [i]
            heapreplace(self._times, nxt)
            return
        heappop(self._times)
        if nxt < INF:
            self._file(i, nxt)
