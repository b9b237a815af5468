"""vLLM 0.32's KV block pool for one full-attention group, reproduced exactly: the free-block
queue in eviction order, reference counts and the prefix cache of full blocks by block hash.

Mirrors `vllm/v1/core/block_pool.py` (`BlockPool.get_new_blocks`, `touch`, `free_blocks`,
`get_cached_block`, `cache_full_blocks`, `_maybe_evict_cached_block`; `BlockHashToBlockMap`) and
`FreeKVCacheBlockQueue` (`vllm/v1/core/kv_cache_utils.py`): block 0 is the null block and never
free; a freed block whose refcount drops to 0 goes to the FRONT of the queue if it holds no hash
(reused first) and to the BACK if it does (cached, evicted least recently freed first); a new
block is taken from the front, and if it held a hash it leaves the prefix cache then. Blocks are
ints; a block hash is an int key (the caller chains hashes over token tuples). NO_HASH (-1)
marks a block without one (Python's hash() never returns -1).
"""

from __future__ import annotations

NO_HASH = -1


class BlockPool:
    """Free queue (a doubly linked list over block ids), refcounts, block hashes, and the
    hash -> blocks map (insertion-ordered: a lookup returns the first block cached under it)."""

    __slots__ = ("caching", "num_blocks", "ref", "hash", "prev", "next", "head", "tail",
                 "num_free", "cache")

    def __init__(self, num_blocks: int, caching: bool = True) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be at least 2 (one is vLLM's null block), "
                             f"got {num_blocks}")
        self.caching = caching
        self.num_blocks = num_blocks
        self.ref = [0] * num_blocks
        self.hash = [NO_HASH] * num_blocks
        n = num_blocks
        self.head, self.tail = n, n + 1  # sentinels
        self.prev = [0] * (n + 2)
        self.next = [0] * (n + 2)
        order = [self.head, *range(1, n), self.tail]  # block 0 is the null block, never free
        for a, b in zip(order, order[1:]):
            self.next[a] = b
            self.prev[b] = a
        self.num_free = n - 1
        self.cache: dict[int, list[int]] = {}

    def _unlink(self, b: int) -> None:
        p, q = self.prev[b], self.next[b]
        self.next[p] = q
        self.prev[q] = p

    def get_new_blocks(self, k: int) -> list[int]:
        """Take `k` blocks from the front of the free queue (evicting their cached hash)."""
        if k > self.num_free:
            raise ValueError(f"cannot get {k} free blocks from {self.num_free}")
        out = []
        nxt = self.next
        b = nxt[self.head]
        for _ in range(k):
            out.append(b)
            b = nxt[b]
        nxt[self.head] = b
        self.prev[b] = self.head
        self.num_free -= k
        for b in out:
            if self.caching and self.hash[b] != NO_HASH:
                self._evict(b)
            self.ref[b] = 1
        return out

    def _evict(self, b: int) -> None:
        key = self.hash[b]
        blocks = self.cache.get(key)
        if blocks is not None and b in blocks:
            blocks.remove(b)
            if not blocks:
                del self.cache[key]
        self.hash[b] = NO_HASH

    def touch(self, blocks: list[int]) -> None:
        """A prefix hit takes a reference (a free cached block leaves the free queue)."""
        ref = self.ref
        for b in blocks:
            if ref[b] == 0:
                self._unlink(b)
                self.num_free -= 1
            ref[b] += 1

    def free_blocks(self, blocks: list[int]) -> None:
        """Drop one reference from each of `blocks`, given in eviction order (a request frees
        its blocks tail first); those reaching 0 rejoin the free queue."""
        ref, hsh = self.ref, self.hash
        first: list[int] = []
        last: list[int] = []
        for b in blocks:
            ref[b] -= 1
            if ref[b] == 0:
                (first if hsh[b] == NO_HASH or not self.caching else last).append(b)
        if first:  # prepend in order: first[0] becomes the head
            nxt, prv = self.next, self.prev
            after = nxt[self.head]
            p = self.head
            for b in first:
                prv[b] = p
                nxt[p] = b
                p = b
            nxt[p] = after
            prv[after] = p
        if last:
            nxt, prv = self.next, self.prev
            p = prv[self.tail]
            for b in last:
                prv[b] = p
                nxt[p] = b
                p = b
            nxt[p] = self.tail
            prv[self.tail] = p
        self.num_free += len(first) + len(last)

    def longest_hit(self, keys: list[int], max_blocks: int) -> list[int]:
        """The cached blocks of the longest run of `keys[:max_blocks]` from the start."""
        out = []
        get = self.cache.get
        for i in range(min(max_blocks, len(keys))):
            blocks = get(keys[i])
            if not blocks:
                break
            out.append(blocks[0])
        return out

    def cache_full(self, blocks: list[int], keys: list[int], start: int, end: int) -> None:
        """Enter blocks[start:end] into the prefix cache under keys[start:end]."""
        hsh, cache = self.hash, self.cache
        for i in range(start, end):
            b, key = blocks[i], keys[i]
            if hsh[b] == key:
                continue
            listed = cache.get(key)
            if listed is None:
                cache[key] = [b]
            elif b not in listed:
                listed.append(b)
            else:
                continue
            if hsh[b] == NO_HASH:
                hsh[b] = key

    def reset_prefix_cache(self) -> bool:
        """vLLM's `reset_prefix_cache` (a weight update): every block forgets its hash, so no
        later request hits; refused (False, nothing changes) while any block is in use."""
        if self.num_free != self.num_blocks - 1:
            return False
        self.cache.clear()
        self.hash = [NO_HASH] * self.num_blocks
        return True

    def free_order(self) -> list[int]:
        """The free queue front to back (for tests and debugging)."""
        out = []
        b = self.next[self.head]
        while b != self.tail:
            out.append(b)
            b = self.next[b]
        return out
