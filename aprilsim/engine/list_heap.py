"""`key_heap.VecKeyHeap`'s interface for pure Python: heapq on a list (sifted in C there)."""

from __future__ import annotations

from collections.abc import Iterable
from heapq import heapify, heappop, heappush


class ListKeyHeap(list):  # type: ignore[type-arg]
    """A min-heap of int keys: `push`, `pop_min`, `top`, `below(limit)`; a list underneath."""

    __slots__ = ()

    def __init__(self, keys: Iterable[int] = ()) -> None:
        super().__init__(keys)
        heapify(self)

    def top(self) -> int:
        return self[0]

    def below(self, limit: int) -> bool:
        return bool(self) and self[0] < limit

    def push(self, key: int) -> None:
        heappush(self, key)

    def pop_min(self) -> int:
        return heappop(self)
