"""Routers: which engine gets the next request (sglang-router's round_robin / load-aware policies,
a group-affinity policy that keeps a group's samples on one engine so that its radix cache
shares their prompt, and a group hash whose placement does not depend on the order of sends)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol


class Router(Protocol):
    name: str

    def pick(self, loads: Sequence[int], key: int | None = None) -> int:
        """Index of the engine for the next request, given each engine's current load and the
        request's group (`key`; None when unknown)."""
        ...


@dataclass
class RoundRobin:
    """Engines in turn, whatever their load."""

    name: str = "round_robin"
    _next: int = 0

    def pick(self, loads: Sequence[int], key: int | None = None) -> int:
        i = self._next % len(loads)
        self._next = i + 1
        return i

    def take(self, count: int, engines: int) -> int:
        """`count` picks at once among `engines`: the first one's engine (the j-th request goes
        to engine (first + j) % engines), as `count` calls of `pick` would place them."""
        i = self._next % engines
        self._next = (i + count - 1) % engines + 1
        return i


@dataclass
class LeastLoaded:
    """The engine with the fewest requests (running + queued); ties go to the lowest index."""

    name: str = "least_loaded"

    def pick(self, loads: Sequence[int], key: int | None = None) -> int:
        return _least(loads)


@dataclass
class GroupAffinity:
    """A group's first request goes to the least-loaded engine, and the group's later requests
    (its other samples, resumed partials) to the same one: with prefix sharing, a group's prompt
    is prefilled and held once per engine (sglang-router's cache-aware policy does this by
    matching prompt prefixes). Requests without a group are balanced by load."""

    name: str = "group_affinity"
    _home: dict[int, int] = field(default_factory=dict)

    def pick(self, loads: Sequence[int], key: int | None = None) -> int:
        if key is None:
            return _least(loads)
        i = self._home.get(key)
        if i is None or i >= len(loads):
            i = self._home[key] = _least(loads)
        return i


@dataclass
class GroupHash:
    """A group's requests go to engine ``group mod engines``, whatever the order they come in:
    placement that live timing cannot change (round robin and load-aware routers follow the
    order of sends, which a live run reorders; validation on several engines uses this to keep
    the split of work between engines the simulation's). Requests without a group: in turn."""

    name: str = "group_hash"
    _next: int = 0

    def pick(self, loads: Sequence[int], key: int | None = None) -> int:
        if key is None:
            i = self._next % len(loads)
            self._next = i + 1
            return i
        return key % len(loads)


def _least(loads: Sequence[int]) -> int:
    """The engine with the fewest requests; ties go to the lowest index."""
    best, best_load = 0, None
    for i, load in enumerate(loads):
        if best_load is None or load < best_load:
            best, best_load = i, load
    return best


ROUTERS = {"round_robin": RoundRobin, "least_loaded": LeastLoaded, "group_affinity": GroupAffinity,
           "group_hash": GroupHash}


def make_router(name: str) -> Router:
    try:
        return ROUTERS[name]()
    except KeyError:
        raise ValueError(f"unknown router {name!r}; known: {sorted(ROUTERS)}") from None
