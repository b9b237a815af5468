"""Min-heaps of the engines' packed int keys (`request.heap_key`: major << RID_BITS | minor).

Two implementations of one interface, each the faster where it runs, popping the same keys in
the same order (a min-heap pops its minimum, whatever its layout; `tests/test_key_heap.py`):

* `VecKeyHeap`, for the compiled build: a `librt.vecs.vec[i64]` (mypyc's unboxed vector of
  64-bit ints) sifted in compiled code with native comparisons; called natively from the
  compiled engine. heapq over a list of ints compares boxed ints through the object protocol
  (~1,000 instructions a pop, ~9 % of a compiled cluster run); this sifts in tens.
* `ListKeyHeap` (`aprilsim.engine.list_heap`), for pure Python: heapq on a list, in C.

`new_key_heap(keys)` picks the one for the build loaded. Keys must fit in 64 signed bits (an
iteration count or a signed base below 2**31 above RID_BITS = 32: `check_requests` bounds ids).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from aprilsim.native import compiled_modules

try:  # the compiled build's runtime (mypyc's librt); a pure install never reaches VecKeyHeap
    from librt.vecs import append, vec
    from librt.vecs import pop as vec_pop
    from mypy_extensions import i64
except ImportError:  # pragma: no cover - a pure install without mypy
    if not TYPE_CHECKING:
        i64 = int

if TYPE_CHECKING:
    from aprilsim.engine.list_heap import ListKeyHeap


class VecKeyHeap:
    """A min-heap of int keys in an unboxed vector: `push`, `pop_min`, `top`, `below(limit)`
    (non-empty and its minimum below `limit`: the engines' "what ends by now" test)."""

    __slots__ = ("_v",)

    def __init__(self, keys: Sequence[int] = ()) -> None:
        v = vec[i64]()
        for k in keys:
            v = append(v, k)
        self._v = v
        n: i64 = len(v)
        p: i64 = n // 2 - 1
        while p >= 0:  # heapify: sift every parent down, last first
            self._sift_down(p, v[p])
            p -= 1

    def __len__(self) -> int:
        return len(self._v)

    def __iter__(self) -> Iterator[int]:
        """The keys in heap order (the tests' view; no order promised)."""
        return iter([int(k) for k in self._v])

    def clear(self) -> None:
        self._v = vec[i64]()

    def top(self) -> int:
        """The minimum (the heap must not be empty)."""
        return self._v[0]

    def below(self, limit: int) -> bool:
        """True when the heap is not empty and its minimum is below `limit`."""
        v = self._v
        return len(v) > 0 and v[0] < limit

    def push(self, key: int) -> None:
        x: i64 = key
        v = append(self._v, x)
        self._v = v
        p: i64 = len(v) - 1
        while p > 0:
            q = (p - 1) >> 1
            y = v[q]
            if y <= x:
                break
            v[p] = y
            p = q
        v[p] = x

    def pop_min(self) -> int:
        """Remove and return the minimum (the heap must not be empty)."""
        v, last = vec_pop(self._v)
        self._v = v
        if len(v) == 0:
            return last
        out = v[0]
        self._sift_down(0, last)
        return out

    def _sift_down(self, p: i64, x: i64) -> None:
        """Put `x` at place p and move it away from the root while a child is smaller."""
        v = self._v
        n: i64 = len(v)
        while True:
            c = 2 * p + 1
            if c >= n:
                break
            a = v[c]
            if c + 1 < n:
                b = v[c + 1]
                if b < a:
                    c += 1
                    a = b
            if x <= a:
                break
            v[p] = a
            p = c
        v[p] = x


def new_key_heap(keys: Sequence[int] = ()) -> VecKeyHeap:
    """A key heap holding `keys`, of the implementation that is faster in the build loaded
    (a `ListKeyHeap` in pure Python: typed as the compiled one, which it mirrors)."""
    if not _BUILD:
        _BUILD.append("aprilsim.engine.key_heap" in compiled_modules())
    if _BUILD[0]:
        return VecKeyHeap(keys)
    from aprilsim.engine.list_heap import ListKeyHeap

    heap: ListKeyHeap = ListKeyHeap(keys)
    return heap  # type: ignore[return-value]


_BUILD: list[bool] = []  # [True] once known that this module is compiled, [False] if not
