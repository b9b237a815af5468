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


def price(cost: CostModel | TabulatedCost, prev: dict[str, Any] | None, r: dict[str, Any],
          computed: float | None = None) -> float:
    """Seconds the cost model gives one logged step; a prefill's tokens scaled by `computed`
    (the share of prompt tokens the engine computed, `computed_share`) when given."""
    if r["phase"] == "decode":
        return cost.decode_time(int(r["batch_size"]), kv_at_start(prev, r))
    n, b = int(r["prefill_tokens"]), max(1, int(r["batch_size"]))
    if computed is not None:
        n = round(n * computed)
    return cost.prefill_time(n, n * n // b, requests=b)


def computed_rows(rows: Rows, share: float | None) -> list[dict[str, Any]]:
    """One engine's rows with each prefill counting the prompt tokens the engine computed (its
    `computed_share` of those sent; at least one), as `price` counts them: the rows a cost is
    fitted on, since a fit on sent tokens prices each computed token too cheap where the prefix
    cache served some."""
    if share is None:
        return list(rows)
    return [{**r, "prefill_tokens": max(1, round(int(r["prefill_tokens"]) * share))}
            if r["phase"] == "prefill" and int(r.get("prefill_tokens", 0)) >= 1 else r
            for r in rows]


def computed_share(counters: dict[str, float] | None) -> float | None:
    """Of the prompt tokens an engine was sent in a run, the share it computed (its prefix cache
    served the rest), from its own counters' deltas over the run: vLLM's
    ``prefix_cache_hits`` / ``prefix_cache_queries`` (tokens), SGLang's ``cached_tokens`` /
    ``prompt_tokens`` (its ``#cached-token``, per finished request). None where it reports
    neither (the bundled engine, which has no cache; SGLang without ``--enable-metrics``)."""
    if not counters:
        return None
    for sent, hit in (("prefix_queries", "prefix_hits"), ("prompt_tokens", "cached_tokens")):
        q = counters.get(sent)
        if q and hit in counters:
            return min(1.0, max(0.0, 1.0 - counters[hit] / q))
    return None


def per_step(result: RunResult, engines: Sequence[Rows],
             cost: CostModel | TabulatedCost | None = None,
             computed: Sequence[float | None] | None = None) -> list[float]:
    """For each step, the busiest engine's time inside the step's rollout window: the sum of its
    logged step intervals, or (``cost`` given) of the cost model's price of each logged step.
    ``computed``: per engine, the share of the prompt tokens its rows count that it computed
    (`computed_share`; None: all), for rows rebuilt from token streams, which count every
    prompt token sent; one share per run, spread evenly over its prefills."""
    out = []
    for s in result.steps:
        lo, hi = s.rollout_start_s, s.rollout_start_s + s.rollout_time_s
        best = 0.0
        for i, rows in enumerate(engines):
            share = computed[i] if computed is not None else None
            tot, prev = 0.0, None
            for r in rows:
                if r["phase"] in ("decode", "prefill") and lo < r["t_run"] <= hi:
                    tot += price(cost, prev, r, share) if cost is not None else interval(prev, r)
                prev = r
            best = max(best, tot)
        out.append(best)
    return out
