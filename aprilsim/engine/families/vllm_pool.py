"""vLLM's KV block pool (`vllm_blocks.BlockPool`, vLLM 0.32's) in runs: the same free counts,
the same prefix-cache hits and the same eviction order, without an object per block.

What the pool's behaviour depends on, and what this keeps:

* A free block either holds a hash (cached) or not. Freed blocks without one go to the FRONT of
  vLLM's free queue and cached ones to its BACK, allocation takes from the front: so the queue is
  always [blocks without a hash][cached blocks, in the order they were freed], and blocks of the
  first kind are interchangeable: a count, `unhashed`. Cached free blocks form the C-list below.
* A cached block is block i of a key: a prompt's (its full blocks, which every request of the
  prompt shares) or a sample's (every block from the first past the prompt's full ones: only
  that sample's requests hold them, one at a time). Blocks are kept as runs (`Run`): blocks
  [lo, hi) of one key, one physical copy, with one reference count and the running requests
  that hold it (a hit that takes part of a held run splits it, so every block of a run always
  has the same holders). A free run is one C-list node: freed tail first, its highest index at
  the front. Among copies of one index, the oldest present one is served (`stamp`: a run's
  blocks enter vLLM's hash map after those of every older run; a piece split off keeps its
  run's stamp).

`take(k)` allocates k blocks (from `unhashed`, then evicting from the C-list's front), `hit`
finds a prefix hit, `hold` takes one of its pieces (off the C-list when free), `release` gives
a run back; a request's own sample run grows without a call while it decodes (the fast
engine's stepper counts its blocks, `vllm_fast`) and enters the pool when it leaves
(`free_run`).
"""

from __future__ import annotations

from typing import Any


class Node:
    """A C-list entry (its links; None when the entry is not in the list)."""

    __slots__ = ("next", "prev")

    def __init__(self) -> None:
        self.prev: Node | None = None
        self.next: Node | None = None


class Run(Node):
    """Blocks [lo, hi) of key `key`'s token sequence, one physical copy: held by the running
    requests in `holders` (`ref` of them), or free (ref 0: in the C-list, highest index first)."""

    __slots__ = ("holders", "hi", "key", "lo", "ref", "stamp")

    def __init__(self, key: int, lo: int, hi: int, stamp: int, holders: list[Any]) -> None:
        self.prev = self.next = None  # Node's, written here (the hot path: no super() call)
        self.key = key
        self.lo = lo
        self.hi = hi
        self.stamp = stamp
        self.holders = holders
        self.ref = len(holders)


Piece = tuple[Run, int, int]  # blocks [a, z) of a run, which serve a hit


class Pool:
    """The block pool (module docstring): `free` blocks in all (`unhashed` plus the C-list's)
    and the runs present of each key (`runs`)."""

    __slots__ = ("caching", "clock", "evictions", "free", "head", "runs", "tail", "total",
                 "unhashed")

    def __init__(self, num_blocks: int, caching: bool) -> None:
        self.caching = caching
        self.total = num_blocks - 1  # vLLM's null block holds no KV
        self.free = self.unhashed = self.total
        self.head, self.tail = Node(), Node()  # sentinels of the C-list
        self.head.next, self.tail.prev = self.tail, self.head
        self.runs: dict[int, list[Run]] = {}
        self.clock = 0  # stamps of new runs
        self.evictions = 0  # cached blocks evicted to be reused

    @property
    def used(self) -> int:
        """Blocks held by requests."""
        return self.total - self.free

    # ------------------------------------------------------------------ the C-list
    def _append(self, node: Node) -> None:
        last = self.tail.prev
        assert last is not None
        node.prev, node.next = last, self.tail
        last.next = node
        self.tail.prev = node

    @staticmethod
    def _unlink(node: Node) -> None:
        p, q = node.prev, node.next
        assert p is not None and q is not None
        p.next, q.prev = q, p
        node.prev = node.next = None

    def take(self, k: int) -> None:
        """Allocate `k` blocks (k <= free): blocks without a hash first, then the C-list's
        front, whose hashes are evicted (vLLM's `get_new_blocks`)."""
        self.free -= k
        u = self.unhashed
        if k <= u:
            self.unhashed = u - k
            return
        self.unhashed = 0
        k -= u
        self.evictions += k
        head = self.head
        while k:
            node = head.next
            assert isinstance(node, Run)
            t = node.hi - node.lo
            if t > k:
                node.hi -= k
                return
            node.hi = node.lo
            k -= t
            self._unlink(node)
            self._forget(node)

    def _forget(self, run: Run) -> None:
        """An empty run leaves its key's list."""
        runs = self.runs[run.key]
        runs.remove(run)
        if not runs:
            del self.runs[run.key]

    # ------------------------------------------------------------------ runs
    def new_run(self, key: int, lo: int, hi: int, holder: Any) -> Run:
        """Blocks [lo, hi) of `key` a request just allocated, held by it: cached after every
        copy present."""
        self.clock += 1
        run = Run(key, lo, hi, self.clock, [holder])
        runs = self.runs.get(key)
        if runs is None:
            self.runs[key] = [run]
        else:
            runs.append(run)
        return run

    def free_run(self, key: int, lo: int, hi: int) -> None:
        """A request releases blocks [lo, hi) of `key` that it alone held and no request looked
        up while it did (its sample's run): cached after every copy present, to the back of
        the free queue."""
        self.clock += 1
        run = Run(key, lo, hi, self.clock, [])
        runs = self.runs.get(key)
        if runs is None:
            self.runs[key] = [run]
        else:
            runs.append(run)
        self._append(run)
        self.free += hi - lo

    def hit(self, key: int, lo: int, cap: int, cut: dict[Run, int] | None = None) -> list[Piece]:
        """The longest run of blocks lo, lo + 1, ... (below `cap`) of `key` that is cached, as
        the pieces of the runs that serve it (the oldest copy of each block); `cut`: runs as
        an allocation yet to come will leave them (`front_cut`)."""
        runs = self.runs.get(key)
        out: list[Piece] = []
        if not runs:
            return out
        if len(runs) == 1 and not cut:  # the common case: one copy
            g = runs[0]
            if g.lo <= lo < g.hi and lo < cap:
                out.append((g, lo, min(g.hi, cap)))
            return out
        tops = {g: g.hi if not cut else cut.get(g, g.hi) for g in runs}
        i = lo
        while i < cap:
            best: Run | None = None
            for g, hi in tops.items():
                if g.lo <= i < hi and (best is None or g.stamp < best.stamp):
                    best = g
            if best is None:
                break
            end = min(tops[best], cap)
            for g, hi in tops.items():  # an older copy that starts further on serves from there
                if g.stamp < best.stamp and i < g.lo < end and hi > g.lo:
                    end = g.lo
            out.append((best, i, end))
            i = end
        return out

    def front_cut(self, k: int) -> dict[Run, int]:
        """The runs that allocating `k` blocks would cut (evicting from the C-list's front once
        the blocks without a hash are used), each with the top it would keep."""
        cut: dict[Run, int] = {}
        k -= self.unhashed
        node = self.head.next
        while k > 0 and isinstance(node, Run):
            t = node.hi - node.lo
            if t > k:
                cut[node] = node.hi - k
                break
            cut[node] = node.lo
            k -= t
            node = node.next
        return cut

    def hold(self, run: Run, a: int, b: int, holder: Any) -> Run:
        """`holder` takes blocks [a, b) of `run` (a prefix hit, vLLM's `touch`): off the free
        queue if free; split off as a run of its own where it is part of `run`."""
        assert run.lo <= a < b <= run.hi  # a hit's pieces are taken in block order
        if run.ref == 0:
            return self._hold_free(run, a, b, holder)
        if a > run.lo or b < run.hi:
            run = self._split(run, a, b)
        run.holders.append(holder)
        run.ref += 1
        return run

    def _hold_free(self, run: Run, a: int, b: int, holder: Any) -> Run:
        """A hit takes blocks [a, b) of the free run `run`: they leave the free queue as a
        held run of the same age; what is left of `run` keeps its place."""
        held = Run(run.key, a, b, run.stamp, [holder])
        runs = self.runs[run.key]
        runs.append(held)
        self.free -= b - a
        if b < run.hi and a > run.lo:  # the run splits: [b, hi) at its place, [lo, a) after
            rest = Run(run.key, run.lo, a, run.stamp, [])
            nxt = run.next
            assert nxt is not None
            rest.prev, rest.next = run, nxt
            run.next = rest
            nxt.prev = rest
            runs.append(rest)
            run.lo = b
        elif b < run.hi:
            run.lo = b
        elif a > run.lo:
            run.hi = a
        else:
            self._unlink(run)
            runs.remove(run)
        return held

    def _split(self, run: Run, a: int, b: int) -> Run:
        """Cut the held run `run` so that [a, b) is a run of its own (the same copy, age and
        holders; each holder's list of runs gets the pieces in its place) and return it; `run`
        keeps the highest piece, so that a hit's later pieces (higher) still find it."""
        key, stamp, holders = run.key, run.stamp, run.holders
        fresh = []
        if run.lo < a:
            fresh.append(Run(key, run.lo, a, stamp, list(holders)))
        if b < run.hi:
            mid = Run(key, a, b, stamp, list(holders))
            fresh.append(mid)
            run.lo = b
        else:
            mid = run
            run.lo = a
        pieces = [*fresh, run]  # in block order
        self.runs[key].extend(fresh)
        for h in holders:
            held = h.held
            i = held.index(run)
            held[i:i + 1] = pieces
        return mid

    def release(self, run: Run, holder: Any) -> None:
        """`holder` releases `run`; with its last holder it joins the back of the free queue
        (or is gone, if it holds no block)."""
        run.holders.remove(holder)
        run.ref -= 1
        if run.ref:
            return
        if run.hi == run.lo:
            self._forget(run)
            return
        self._append(run)
        self.free += run.hi - run.lo

    # ------------------------------------------------------------------ a weight update
    def reset(self) -> bool:
        """vLLM's `reset_prefix_cache`: with no block in use, every hash is forgotten (all free
        blocks become interchangeable); refused (False) otherwise."""
        if self.free != self.total:
            return False
        self.head.next, self.tail.prev = self.tail, self.head
        self.runs.clear()
        self.unhashed = self.total
        return True

    def cached(self) -> bool:
        """Whether any free block holds a hash."""
        return self.unhashed != self.free
