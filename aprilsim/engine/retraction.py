"""The fast engine's preemption bookkeeping: its victims in the family's order, kept in O(log n).

A KV-bound engine with a long queue retracts about once per three requests, so from its first
retraction on `FastEngine` keeps its running requests in a heap by the family's preemption order
(`Rules.fewest_first`: `base`, or `-base`; among equals the longest prompt, then the latest to
join: `protocol.victim_order`; stale entries skipped when popped, the heap rebuilt when they
outnumber the live ones), the running sums of `base` and
`max_new` that SGLang's ratio re-estimate reads, and the count of finish-heap entries that
retracted requests left behind (`stale`: the engine skips them on a separate path, and keeps the
finish heap's head a running request). A running request's generated tokens are `base + it`
(`it` the engine's decode counter), so ordering by `base` orders them by `gen`.
"""

from __future__ import annotations

from aprilsim.engine.families.protocol import Rules
from aprilsim.engine.key_heap import VecKeyHeap, new_key_heap
from aprilsim.engine.request import RID_BITS, RID_MASK, Request


class RetractionIndex:
    """`victims` (None until the first retraction), `base_sum`, `max_new_sum` over the running
    requests, and `stale` finish-heap entries, for one engine preempting in `rules`' order.
    `running` is the engine's own dict (typed so: the compiled build reads it natively)."""

    __slots__ = ("sign", "victims", "base_sum", "max_new_sum", "stale")

    def __init__(self, rules: Rules) -> None:
        self.sign = 1 if rules.fewest_first else -1  # the heap's order: sign * base, then -rid
        self.victims: VecKeyHeap | None = None  # (sign * base, RID_MASK - rid), lazily pruned
        self.base_sum = 0  # sum of `base` over the running requests (SGLang's re-estimate)
        self.max_new_sum = 0  # sum of `max_new` over them
        self.stale = 0  # entries of retracted requests left in the finish heap (never its head)

    def key(self, r: Request) -> int:
        """The heap entry of running request `r` (what `FastEngine._end_prefill` pushes, inline)."""
        return ((self.sign * r.base) << RID_BITS) | (RID_MASK - r.rid)

    def build(self, running: dict[int, Request]) -> None:
        """(Re)build the victim heap over the running requests (the first retraction, or more
        stale entries than live ones)."""
        self.victims = new_key_heap([self.key(r) for r in running.values()])

    def pop_victim(self, running: dict[int, Request]) -> Request:
        """The running request to preempt next (`protocol.victim_order`: `sign` * generated
        tokens, then the longest prompt, then the latest to join the running batch). The heap
        orders by (sign * base, -rid) only, so the live entries of its lowest base are popped
        together (stale ones dropped), the victim chosen among them and the rest pushed back."""
        heap = self.victims
        assert heap is not None
        tied: list[Request] = []
        lead = 0
        while len(heap):
            key = heap.top()
            if tied and key >> RID_BITS != lead:
                break
            heap.pop_min()
            r = running.get(RID_MASK - (key & RID_MASK))
            if r is not None and self.key(r) == key:  # else it finished or was retracted since
                tied.append(r)
                lead = key >> RID_BITS
        best = tied[0]
        if len(tied) > 1:
            best = _longest_then_latest(tied, running)
            for r in tied:
                if r is not best:
                    heap.push(self.key(r))
        return best

    def drop_stale_head(self, finish: VecKeyHeap, running: dict[int, Request]) -> None:
        """Pop the entries of retracted requests off the top of the finish heap (keys
        (end iteration, rid)), so that its head is the first running request to finish."""
        while self.stale and len(finish):
            key = finish.top()
            r = running.get(key & RID_MASK)
            if r is not None and r.target_new - r.base == key >> RID_BITS:
                return
            finish.pop_min()
            self.stale -= 1

    def clear(self) -> None:
        """After an abort: nothing runs."""
        self.victims = None
        self.base_sum = self.max_new_sum = self.stale = 0


def _longest_then_latest(tied: list[Request], running: dict[int, Request]) -> Request:
    """Of running requests with equal generated tokens: the longest prompt, then the latest to
    join the running batch (`running` keeps joining order)."""
    longest = max(r.input_len + r.shared for r in tied)
    top = [r for r in tied if r.input_len + r.shared == longest]
    if len(top) == 1:
        return top[0]
    pos = {rid: i for i, rid in enumerate(running)}
    return max(top, key=lambda r: pos[r.rid])
