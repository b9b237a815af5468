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
"""

from __future__ import annotations

import heapq


class ClippedReserve:
    """Sum of min(remaining, clip) over the requests added and not dropped, as iterations pass.

    `add(rid, remaining)` files a request whose remaining max_new is `remaining` now; `advance(m)`
    lets m decode iterations pass (every request's remainder falls by m); `drop(rid)` removes one;
    `sum_after(m)` is the clipped sum m iterations from now (m >= 0, nothing added or dropped
    meanwhile). Remainders are not floored at zero: a request is dropped when it finishes.
    """

    __slots__ = ("clip", "it", "_far", "_far_k", "_near_e", "_sum_e")

    def __init__(self, clip: int, it: int = 0) -> None:
        if clip <= 0:
            raise ValueError(f"clip must be positive, got {clip}")
        self.clip = clip
        self.it = it  # iterations passed (the engine's decode counter)
        self._far: list[tuple[int, int]] = []  # (iteration at which it crosses, rid), lazy
        self._far_k: dict[int, int] = {}  # rid -> its current crossing iteration
        self._near_e: dict[int, int] = {}  # rid -> E (remaining + it when added)
        self._sum_e = 0  # sum of E over the near ones

    def __len__(self) -> int:
        return len(self._far_k) + len(self._near_e)

    def __contains__(self, rid: int) -> bool:
        return rid in self._far_k or rid in self._near_e

    @property
    def any_far(self) -> bool:
        """True when some request may still be above the clip (else the sum is closed form)."""
        return bool(self._far_k)

    def add(self, rid: int, remaining: int) -> None:
        """File request `rid` with `remaining` max_new tokens left now."""
        if rid in self._far_k or rid in self._near_e:
            raise ValueError(f"request {rid} is already in the reserve")
        e = remaining + self.it
        k = e - self.clip  # the last iteration at which it still counts `clip`
        if k >= self.it:
            heapq.heappush(self._far, (k, rid))
            self._far_k[rid] = k
        else:
            self._near_e[rid] = e
            self._sum_e += e

    def drop(self, rid: int) -> None:
        """Remove request `rid` (finished, retracted or aborted)."""
        if self._far_k.pop(rid, None) is not None:
            if not self._far_k:
                self._far.clear()  # only stale entries are left
            return
        self._sum_e -= self._near_e.pop(rid)

    def advance(self, m: int) -> None:
        """m decode iterations pass."""
        self.it += m

    def clear(self, it: int | None = None) -> None:
        """Forget every request (an abort); optionally set the iteration counter."""
        self._far.clear()
        self._far_k.clear()
        self._near_e.clear()
        self._sum_e = 0
        if it is not None:
            self.it = it

    def sum_after(self, m: int = 0) -> int:
        """The clipped sum m iterations from now: O(1) amortised for m = 0; a look-ahead moves
        the far requests that cross by then to the near side and back (O(k log n))."""
        it, c = self.it, self.clip
        far, far_k = self._far, self._far_k
        pop = heapq.heappop
        while far and far[0][0] < it:  # crossed for good: far -> near
            k, rid = pop(far)
            if far_k.get(rid) == k:
                del far_k[rid]
                self._near_e[rid] = k + c
                self._sum_e += k + c
        g = it + m
        n_far, n_near, sum_e = len(far_k), len(self._near_e), self._sum_e
        if m > 0 and far and far[0][0] < g:
            crossed = []
            while far and far[0][0] < g:
                k, rid = pop(far)
                if far_k.get(rid) == k:
                    crossed.append((k, rid))
                    n_far -= 1
                    n_near += 1
                    sum_e += k + c
            for item in crossed:
                heapq.heappush(far, item)
        return c * n_far + sum_e - g * n_near
