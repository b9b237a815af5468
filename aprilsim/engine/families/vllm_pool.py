"""vLLM's KV block pool (`vllm_blocks.BlockPool`, vLLM 0.32's) in runs: the same free counts,
the same prefix-cache hits and the same eviction order, without an object per block.

What the pool's behaviour depends on, and what this keeps:

* A free block either holds a hash (cached) or not. Freed blocks without one go to the FRONT of
  vLLM's free queue and cached ones to its BACK, allocation takes from the front: so the queue is
  always [blocks without a hash][cached blocks, in the order they were freed], and blocks of the
  first kind are interchangeable: a count, `unhashed`. Cached free blocks form the C-list below.
* A prompt's blocks (the part of a request's blocks that other requests share: the prompt's full
  blocks, `PBlock`) are kept one by one: their reference counts and their order in the hash map
  (vLLM serves the first block cached under a hash).
* A sample's blocks (every block from the first that holds its output: only that sample's
  requests ever hold them, one at a time) are kept as runs of block indices, `Seg`: a run of
  one physical copy, held by its request or free in the C-list (a free run is freed tail first:
  one node, its highest index at the front). Among copies of one index, the oldest present one
  is served (`stamp`: a run's blocks enter the hash map after those of every older run).

`take(k)` allocates k blocks (from `unhashed`, then evicting from the C-list's front), `hold_*`
takes a prefix hit (off the C-list when free), `free_*` releases; a request's own blocks grow
without a call while it decodes (the fast engine's stepper counts them, `vllm_fast`).
"""

from __future__ import annotations


class Node:
    """A C-list entry (its links; None when the entry is not in the list)."""

    __slots__ = ("prev", "next")

    def __init__(self) -> None:
        self.prev: Node | None = None
        self.next: Node | None = None


class PBlock(Node):
    """One block of a prompt's tokens: the copies of its index it is listed among (`listed`,
    in vLLM's serving order: the first is served) and how many running requests hold it."""

    __slots__ = ("listed", "ref")

    def __init__(self, listed: list[PBlock]) -> None:
        self.prev = self.next = None  # Node's, written here (the hot path: no super() call)
        self.listed = listed
        self.ref = 1


class Seg(Node):
    """Blocks [lo, hi) of sample `sample`'s token sequence, one physical copy: held (by the
    running request of that sample) or free (in the C-list, highest index first)."""

    __slots__ = ("sample", "lo", "hi", "stamp", "free")

    def __init__(self, sample: int, lo: int, hi: int, stamp: int) -> None:
        super().__init__()
        self.sample = sample
        self.lo = lo
        self.hi = hi
        self.stamp = stamp
        self.free = False


class Pool:
    """The block pool (module docstring): `free` blocks in all (`unhashed` plus the C-list's),
    the prompt blocks (`prompts`: prompt key -> per block index, its cached copies in vLLM's
    serving order; block i of a prompt is the one hash key), the runs of each sample."""

    __slots__ = ("caching", "total", "free", "unhashed", "head", "tail", "prompts", "samples",
                 "clock", "evictions")

    def __init__(self, num_blocks: int, caching: bool) -> None:
        self.caching = caching
        self.total = num_blocks - 1  # vLLM's null block holds no KV
        self.free = self.unhashed = self.total
        self.head, self.tail = Node(), Node()  # sentinels of the C-list
        self.head.next, self.tail.prev = self.tail, self.head
        self.prompts: dict[int, list[list[PBlock]]] = {}
        self.samples: dict[int, list[Seg]] = {}
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
            if isinstance(node, PBlock):
                self._unlink(node)
                node.listed.remove(node)
                k -= 1
                continue
            assert isinstance(node, Seg)
            t = node.hi - node.lo
            if t > k:
                node.hi -= k
                return
            node.hi = node.lo
            k -= t
            self._unlink(node)
            self._forget(node)

    def _forget(self, seg: Seg) -> None:
        """An empty run leaves its sample's list."""
        runs = self.samples[seg.sample]
        runs.remove(seg)
        if not runs:
            del self.samples[seg.sample]

    # ------------------------------------------------------------------ prompt blocks
    def new_pblocks(self, prompt: int, lo: int, hi: int, out: list[PBlock]) -> None:
        """Blocks lo .. hi-1 of `prompt`, just allocated (taken) and now full: each cached after
        any copy already cached under its key (vLLM's `cache_full_blocks`), appended to `out`."""
        copies = self.prompts.get(prompt)
        if copies is None:
            copies = self.prompts[prompt] = []
        while len(copies) < hi:
            copies.append([])
        for i in range(lo, hi):
            listed = copies[i]
            b = PBlock(listed)
            listed.append(b)
            out.append(b)

    def hold_p(self, blocks: list[PBlock]) -> None:
        """A prefix hit takes `blocks` (each off the free queue if no request held it: vLLM's
        `touch`)."""
        taken = 0
        for b in blocks:
            if b.ref == 0:
                p, q = b.prev, b.next
                p.next, q.prev = q, p  # type: ignore[union-attr]
                b.prev = b.next = None
                taken += 1
            b.ref += 1
        self.free -= taken

    def free_p(self, blocks: list[PBlock]) -> None:
        """A request releases `blocks`, in the order given; each with its last holder joins the
        back of the free queue."""
        tail = self.tail
        freed = 0
        for b in blocks:
            b.ref -= 1
            if b.ref == 0:
                last = tail.prev
                b.prev, b.next = last, tail
                last.next = b  # type: ignore[union-attr]
                tail.prev = b
                freed += 1
        self.free += freed

    # ------------------------------------------------------------------ sample runs
    def new_seg(self, sample: int, lo: int) -> Seg:
        """A run of a sample's blocks a request starts (empty; its `hi` grows as blocks fill)."""
        self.clock += 1
        seg = Seg(sample, lo, lo, self.clock)
        self.samples.setdefault(sample, []).append(seg)
        return seg

    def free_seg(self, seg: Seg) -> None:
        """Its request releases the run: to the back of the free queue (or gone, if empty)."""
        if seg.hi == seg.lo:
            self._forget(seg)
            return
        seg.free = True
        self._append(seg)
        self.free += seg.hi - seg.lo

    def hold_range(self, seg: Seg, a: int, b: int) -> Seg:
        """A prefix hit takes blocks [a, b) of the free run `seg`: they leave the free queue as a
        held run of the same age; what is left of `seg` keeps its place."""
        held = Seg(seg.sample, a, b, seg.stamp)
        runs = self.samples[seg.sample]
        runs.insert(runs.index(seg), held)
        self.free -= b - a
        if b < seg.hi and a > seg.lo:  # the run splits: [b, hi) at its place, [lo, a) after
            rest = Seg(seg.sample, seg.lo, a, seg.stamp)
            rest.free = True
            nxt = seg.next
            assert nxt is not None
            rest.prev, rest.next = seg, nxt
            seg.next = rest
            nxt.prev = rest
            runs.insert(runs.index(seg) + 1, rest)
            seg.lo = b
        elif b < seg.hi:
            seg.lo = b
        elif a > seg.lo:
            seg.hi = a
        else:
            self._unlink(seg)
            runs.remove(seg)
        return held

    def sample_hit(self, sample: int, lo: int, cap: int) -> list[tuple[Seg, int, int]]:
        """The longest run of blocks lo, lo + 1, ... (below `cap`) of `sample` that is cached,
        as the pieces of free runs that serve it (the oldest copy of each block)."""
        runs = self.samples.get(sample)
        out: list[tuple[Seg, int, int]] = []
        if not runs:
            return out
        i = lo
        while i < cap:
            best: Seg | None = None
            for g in runs:
                if g.free and g.lo <= i < g.hi and (best is None or g.stamp < best.stamp):
                    best = g
            if best is None:
                break
            end = min(best.hi, cap)
            for g in runs:  # an older copy that starts further on serves from there
                if g.free and g.stamp < best.stamp and i < g.lo < end:
                    end = g.lo
            out.append((best, i, end))
            i = end
        return out

    # ------------------------------------------------------------------ a weight update
    def reset(self) -> bool:
        """vLLM's `reset_prefix_cache`: with no block in use, every hash is forgotten (all free
        blocks become interchangeable); refused (False) otherwise."""
        if self.free != self.total:
            return False
        self.head.next, self.tail.prev = self.tail, self.head
        self.prompts.clear()
        self.samples.clear()
        self.unhashed = self.total
        return True

    def cached(self) -> bool:
        """Whether any free block holds a hash."""
        return self.unhashed != self.free
