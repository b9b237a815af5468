"""The clipped reserve: sum over running requests of min(remaining max_new, clip), kept up to date.

SGLang's admission reserves room for what the running batch may still generate, counting each
request's remaining max_new_tokens clipped at `clip` (`CLIP_MAX_NEW_TOKENS`, 4,096). A request's
remainder falls by one per decode iteration, so its clipped value is `clip` until it crosses the
clip and `E - it` after, where `E` = remaining + the iteration counter when it was added. This
structure answers `sum_after(m)` (the sum m iterations from now) without a scan of the batch: the
requests still above the clip ("far") sit in a heap by the iteration at which they cross it,
the others ("near") in a running sum of their `E`. Each entry carries the crossing iteration it was
filed with, so a request that left and came back (a retraction, then re-admission) is never moved
by the stale heap entry of its earlier stay.

What the reserve knows of a request it keeps on the request (`Request.clip_k`, `clip_e`), not in
dicts keyed by request id: filing and dropping touch two fields instead of two or three dicts (the
dicts were 7 % of a compiled cluster run). Its heap names requests by id, so it reads them back
through `members` (rid -> request: the engine's running requests, which it always holds).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from aprilsim.engine.key_heap import VecKeyHeap, new_key_heap
from aprilsim.engine.request import RID_BITS, RID_MASK, Request

ABSENT: Final = -2  # `Request.clip_k` of a request in no reserve
NEAR: Final = -1  # ... of one in it and at or below the clip (its `clip_e` then counts)


class ClippedReserve:
    """Sum of min(remaining, clip) over the requests added and not dropped, as iterations pass.

    `add(r, remaining)` files request `r` whose remaining max_new is `remaining` now; `advance(m)`
    lets m decode iterations pass (every request's remainder falls by m); `drop(r)` removes one;
    `sum_after(m)` is the clipped sum m iterations from now (m >= 0, nothing added or dropped
    meanwhile). Remainders are not floored at zero: a request is dropped when it finishes.
    `members` must map the id of every request in the reserve to it (it may hold others).
    """

    __slots__ = ("clip", "it", "members", "_far", "_n_far", "_n_near", "_sum_e")

    def __init__(self, clip: int, members: Mapping[int, Request], it: int = 0) -> None:
        if clip <= 0:
            raise ValueError(f"clip must be positive, got {clip}")
        self.clip = clip
        self.it = it  # iterations passed (the engine's decode counter)
        self.members = members
        self._far: VecKeyHeap = new_key_heap()  # heap_key(iteration it crosses at, rid), lazy
        self._n_far = 0  # requests above the clip (`clip_k` >= 0: the iteration it crosses at)
        self._n_near = 0  # requests at or below it (`clip_k` == NEAR)
        self._sum_e = 0  # sum of E (`clip_e`: remaining + it when added) over the near ones

    def __len__(self) -> int:
        return self._n_far + self._n_near

    @property
    def any_far(self) -> bool:
        """True when some request may still be above the clip (else the sum is closed form)."""
        return self._n_far > 0

    def add(self, r: Request, remaining: int) -> None:
        """File request `r` with `remaining` max_new tokens left now."""
        if r.clip_k != ABSENT:
            raise ValueError(f"request {r.rid} is already in the reserve")
        e = remaining + self.it
        k = e - self.clip  # the last iteration at which it still counts `clip`
        if k >= self.it:
            self._far.push((k << RID_BITS) | r.rid)
            r.clip_k = k
            self._n_far += 1
        else:
            r.clip_k = NEAR
            r.clip_e = e
            self._n_near += 1
            self._sum_e += e

    def drop(self, r: Request) -> None:
        """Remove request `r` (finished, retracted or aborted)."""
        k = r.clip_k
        if k >= 0:
            r.clip_k = ABSENT
            self._n_far -= 1
            if not self._n_far:
                self._far.clear()  # only stale entries are left
            return
        if k == ABSENT:
            raise KeyError(r.rid)
        r.clip_k = ABSENT
        self._n_near -= 1
        self._sum_e -= r.clip_e

    def advance(self, m: int) -> None:
        """m decode iterations pass."""
        self.it += m

    def clear(self, it: int | None = None) -> None:
        """Forget every request (an abort: its requests are not filed again); optionally set the
        iteration counter."""
        self._far.clear()
        self._n_far = self._n_near = self._sum_e = 0
        if it is not None:
            self.it = it

    def sum_after(self, m: int = 0) -> int:
        """The clipped sum m iterations from now: O(1) amortised for m = 0; a look-ahead moves
        the far requests that cross by then to the near side and back (O(k log n))."""
        it, c = self.it, self.clip
        far, members = self._far, self.members
        limit = it << RID_BITS  # entries below it crossed before iteration `it`
        while far.below(limit):  # crossed for good: far -> near
            key = far.pop_min()
            k = key >> RID_BITS
            r = members.get(key & RID_MASK)
            if r is not None and r.clip_k == k:
                r.clip_k = NEAR
                r.clip_e = k + c
                self._n_far -= 1
                self._n_near += 1
                self._sum_e += k + c
        g = it + m
        n_far, n_near, sum_e = self._n_far, self._n_near, self._sum_e
        limit = g << RID_BITS
        if m > 0 and far.below(limit):
            crossed = []
            while far.below(limit):
                key = far.pop_min()
                k = key >> RID_BITS
                r = members.get(key & RID_MASK)
                if r is not None and r.clip_k == k:
                    crossed.append(key)
                    n_far -= 1
                    n_near += 1
                    sum_e += k + c
            for key in crossed:
                far.push(key)
        return c * n_far + sum_e - g * n_near
