"""`ClippedReserve` addressed by request id, as the reserve's own tests drive it.

The engine's reserve keeps its bookkeeping on the requests (`Request.clip_k`, `clip_e`) and reads
them back through the engine's running map; this adapter plays the engine's part: it makes a
request per id, keeps the map, and hands a retracted request back when its id is added again.
(A separate module, so that the derandomized state machine's source, and so its examples, stay
as they were.)
"""

from __future__ import annotations

from aprilsim.engine import clipped_reserve
from aprilsim.engine.request import Request


class ClippedReserve:
    """The reserve with `add(rid, remaining)` / `drop(rid)`; the rest passes through."""

    def __init__(self, clip: int, it: int = 0) -> None:
        self.members: dict[int, Request] = {}  # the requests in the reserve (the engine's running)
        self.known: dict[int, Request] = {}  # every request made, to re-add one by its id
        self.inner = clipped_reserve.ClippedReserve(clip, self.members, it)

    def add(self, rid: int, remaining: int) -> None:
        r = self.known.setdefault(rid, Request(rid, 1, 1, 1))
        self.inner.add(r, remaining)  # raises for a request already in it, as the engine's
        self.members[rid] = r

    def drop(self, rid: int) -> None:
        r = self.members.pop(rid, None)
        self.inner.drop(r if r is not None else Request(rid, 1, 1, 1))  # absent: KeyError

    def advance(self, m: int) -> None:
        self.inner.advance(m)

    def clear(self, it: int | None = None) -> None:
        """An abort: every request ends (the engine submits new ones afterwards)."""
        self.inner.clear(it)
        self.members.clear()
        self.known.clear()

    def sum_after(self, m: int = 0) -> int:
        return self.inner.sum_after(m)

    def __len__(self) -> int:
        return len(self.inner)

    @property
    def any_far(self) -> bool:
        return self.inner.any_far
