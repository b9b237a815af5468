"""The engines' key heaps (`aprilsim.engine.key_heap`): both implementations pop what heapq
pops, in the same order, at the sizes and key ranges the engines use.

`ListKeyHeap` (pure Python) always runs; `VecKeyHeap` runs wherever mypyc's runtime library is
importable (compiled: natively; else interpreted over `librt.vecs`, the same code), and says so
when skipped. The engines' own use of them is covered by the equivalence tests (fast ==
reference) and the retraction-heap invariants.
"""

from __future__ import annotations

import heapq
import importlib.util
import random
from collections import Counter

import pytest
from hypothesis import event, given, settings, target
from hypothesis import strategies as st

from aprilsim.engine.key_heap import VecKeyHeap, new_key_heap
from aprilsim.engine.list_heap import ListKeyHeap
from aprilsim.engine.request import RID_BITS, RID_MASK
from aprilsim.native import compiled_modules

HAS_RUNTIME = importlib.util.find_spec("librt") is not None
IMPLS = [ListKeyHeap, pytest.param(VecKeyHeap, marks=pytest.mark.skipif(
    not HAS_RUNTIME, reason="librt (mypyc's runtime, the `compiled` extra) is not installed: "
    "VecKeyHeap is the compiled build's heap"))]
_REACHED: Counter[str] = Counter()


def _keys(rng: random.Random, kind: str) -> int:
    """A key as the engines pack them: an iteration (or a signed base) above the request id."""
    rid = rng.randrange(RID_MASK + 1)
    if kind == "finish":  # iteration at which it ends: up to a long run's millions
        return (rng.randrange(0, 5_000_000) << RID_BITS) | rid
    if kind == "victim":  # base = gen - it: negative once the engine has run a while
        return (rng.randrange(-5_000_000, 40_000) << RID_BITS) | (RID_MASK - rid)
    return rng.choice([0, 1, 7, 1 << RID_BITS])  # ties: equal keys


@settings(max_examples=120, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**32 - 1), kind=st.sampled_from(["finish", "victim", "ties"]),
       size=st.sampled_from([1, 2, 3, 17, 64, 600, 4096]), impl=st.sampled_from(["list", "vec"]))
def test_key_heaps_pop_what_heapq_pops(seed, kind, size, impl):
    if impl == "vec" and not HAS_RUNTIME:
        impl = "list"
    cls = VecKeyHeap if impl == "vec" else ListKeyHeap
    rng = random.Random(seed)
    start = [_keys(rng, kind) for _ in range(rng.randrange(size + 1))]
    heap, ref = cls(start), list(start)
    heapq.heapify(ref)
    popped = 0
    for _ in range(3 * size):  # pushes and pops interleaved, as an engine's events do
        if ref and rng.random() < 0.5:
            limit = ref[0] + rng.choice([0, 1])
            assert heap.below(limit) == (ref[0] < limit)
            assert heap.top() == ref[0]
            assert heap.pop_min() == heapq.heappop(ref)
            popped += 1
        else:
            k = _keys(rng, kind)
            heap.push(k)
            heapq.heappush(ref, k)
        assert len(heap) == len(ref)
    assert sorted(heap) == sorted(ref)
    assert [heap.pop_min() for _ in range(len(ref))] == sorted(ref)
    assert len(heap) == 0 and not heap.below(1 << 62)
    _REACHED[f"{impl} {kind}"] += 1
    _REACHED["deep" if size >= 600 and popped >= 100 else "shallow"] += 1
    event(f"{impl} {kind}")
    target(float(popped), label="pops checked")


def test_key_heap_property_reached_every_kind_at_scale():
    test_key_heaps_pop_what_heapq_pops()
    impls = ["list", "vec"] if HAS_RUNTIME else ["list"]
    for impl in impls:
        for kind in ("finish", "victim", "ties"):
            assert _REACHED[f"{impl} {kind}"] >= 5, _REACHED
    assert _REACHED["deep"] >= 15, _REACHED


@pytest.mark.parametrize("cls", IMPLS)
def test_key_heap_clear_and_build_from_keys(cls):
    heap = cls([9, -4, 3, 3])
    assert (len(heap), heap.top(), sorted(heap)) == (4, -4, [-4, 3, 3, 9])
    heap.clear()
    assert len(heap) == 0 and not heap.below(10)
    heap.push(5)
    assert heap.pop_min() == 5


def test_the_build_loaded_picks_its_heap():
    heap = new_key_heap([2, 1])
    compiled = "aprilsim.engine.key_heap" in compiled_modules()
    assert isinstance(heap, VecKeyHeap if compiled else ListKeyHeap)
    assert heap.pop_min() == 1
