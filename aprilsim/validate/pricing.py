"""Per-step engine time of a live run, read from its iteration log, logged or priced.

The wall-clock rollout time of a live run on a shared CPU mixes three things: which iterations
the engines ran (the scheduler and the engine rules: admission, batching, retraction), what each
iteration cost, and time the engines were not computing (runner work, other processes). Pricing
the *logged* iterations with the *calibrated* cost separates the first from the rest: the
simulated busiest-engine time and the priced live one use the same cost, so their difference is
the simulation's model of the engine rules and the scheduler alone, whatever the machine's load.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aprilsim.engine.cost import CostModel, TabulatedCost
from aprilsim.metrics.records import RunResult

from .costfit import interval, kv_at_start

Rows = Sequence[dict[str, Any]]  # one engine's iteration records, each with ``t_run``


def price(cost: CostModel | TabulatedCost, prev: dict[str, Any] | None, r: dict[str, Any]) -> float:
    """Seconds the cost model gives one logged step."""
    if r["phase"] == "decode":
        return cost.decode_time(int(r["batch_size"]), kv_at_start(prev, r))
    n, b = int(r["prefill_tokens"]), max(1, int(r["batch_size"]))
    return cost.prefill_time(n, n * n // b, requests=b)


def per_step(result: RunResult, engines: Sequence[Rows],
             cost: CostModel | TabulatedCost | None = None) -> list[float]:
    """For each step, the busiest engine's time inside the step's rollout window: the sum of its
    logged step intervals, or (``cost`` given) of the cost model's price of each logged step."""
    out = []
    for s in result.steps:
        lo, hi = s.rollout_start_s, s.rollout_start_s + s.rollout_time_s
        best = 0.0
        for rows in engines:
            tot, prev = 0.0, None
            for r in rows:
                if r["phase"] in ("decode", "prefill") and lo < r["t_run"] <= hi:
                    tot += price(cost, prev, r) if cost is not None else interval(prev, r)
                prev = r
            best = max(best, tot)
        out.append(best)
    return out
