"""Routers: which engine gets the next request (sglang-router's round_robin / load-aware policies)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class Router(Protocol):
    name: str

    def pick(self, loads: Sequence[int]) -> int:
        """Index of the engine for the next request, given each engine's current load."""
        ...


@dataclass
class RoundRobin:
    """Engines in turn, whatever their load."""

    name: str = "round_robin"
    _next: int = 0

    def pick(self, loads: Sequence[int]) -> int:
        i = self._next % len(loads)
        self._next = i + 1
        return i


@dataclass
class LeastLoaded:
    """The engine with the fewest requests (running + queued); ties go to the lowest index."""

    name: str = "least_loaded"

    def pick(self, loads: Sequence[int]) -> int:
        best, best_load = 0, None
        for i, load in enumerate(loads):
            if best_load is None or load < best_load:
                best, best_load = i, load
        return best


ROUTERS = {"round_robin": RoundRobin, "least_loaded": LeastLoaded}


def make_router(name: str) -> Router:
    try:
        return ROUTERS[name]()
    except KeyError:
        raise ValueError(f"unknown router {name!r}; known: {sorted(ROUTERS)}") from None
