"""The simulation that matches a live replay run: same groups, same scale, same engine limits.

``aprilsim run`` (replay) scales every length by ``scale`` and the trainer's fixed times too; both
sides use one :class:`~aprilsim.workload.truth.ScaledWorkload` (``aprilsim.workload.truth``), so
they see identical groups (common random numbers), and
:func:`simulate_matched` builds the simulation with the calibrated cost and the engines' own
limits (max running requests, KV budget) as reported by their server info.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from aprilsim.config import Scenario
from aprilsim.engine.cost import CostModel, EngineSpec, TabulatedCost
from aprilsim.engine.families import SIMPLE, make_family
from aprilsim.metrics.records import RunResult
from aprilsim.metrics.trace import Trace
from aprilsim.metrics.warmup import clamp_warmup
from aprilsim.policies.base import Scheduler
from aprilsim.scheduler_spec import (
    build_scheduler,
    parse_scheduler_spec,  # noqa: F401 - re-exported
)
from aprilsim.sim.runtime import Simulation
from aprilsim.workload.truth import ScaledWorkload


def make_policy(scenario: Scenario, spec: str) -> Scheduler:
    """A fresh scheduler for ``spec`` with the scenario's knobs, overridden by the spec's."""
    return build_scheduler(scenario, spec)


def matched_engine(cost: CostModel | TabulatedCost, *, max_running: int, kv_capacity: int,
                   max_prefill_tokens: int = 8192, new_token_ratio: float = 1.0,
                   family: str | None = None, abort_steps: int | None = None,
                   retract_to: str | None = None, prefix_cache: str = "none",
                   prefix_cache_flush: bool = True, prefix_cache_block: int | None = None,
                   client_overhead_s: float = 0.0, client_send_s: float = 0.0,
                   abort_latency_s: float = 0.0, abort_delivery_s: float = 0.0,
                   **params: Any) -> EngineSpec:
    """The simulated engine of a live replay run: replay requests ignore EOS, so the engine
    reserves their whole remaining length (ratio 1); aborts land, retracted requests re-enter
    the queue and prefixes stay cached as the live engine's `family` does (`validate`'s
    `engine_rules`; None: the simple rules, `families.SIMPLE`), its parameters overridden where
    given (`params`: the family's others, e.g. vLLM's `max_num_batched_tokens`); each request
    reaches its engine `client_overhead_s` after it is sent (the k-th of a send `client_send_s`
    x k later still), and an abort lands
    `abort_latency_s` after it is sent at the earliest (the client's confirmation), the
    engines stepping on until it reaches them `abort_delivery_s` after it is sent."""
    given = {"abort_steps": abort_steps, "retract_to": retract_to,
             "cache_block": prefix_cache_block, **params}
    base = {} if family else {f: getattr(SIMPLE, f) for f in ("abort_steps", "retract_to",
                                                               "cache_block")}
    fam = make_family(family or SIMPLE.name,
                      **(base | {k: v for k, v in given.items() if v is not None}))
    return EngineSpec(cost=cost, kv_capacity=kv_capacity, max_running=max_running,
                      new_token_ratio=new_token_ratio, max_prefill_tokens=max_prefill_tokens,
                      tp=1, label="calibrated", source="aprilsim validate",
                      prefix_cache=prefix_cache, prefix_cache_flush=prefix_cache_flush,
                      client_overhead_s=client_overhead_s, client_send_s=client_send_s,
                      abort_latency_s=abort_latency_s, abort_delivery_s=abort_delivery_s,
                      family=fam)


def simulate_matched(scenario: Scenario, spec: str, engine: EngineSpec, *, n_engines: int,
                     scale: float, seed: int | None, steps: int,
                     trace: Trace | None = None,
                     slowdown: Sequence[float] | None = None) -> RunResult:
    """Simulate ``spec`` as the live replay run does it: scaled lengths and trainer fixed times
    (``slowdown``: per engine, how many times as long its steps take; default the scenario's)."""
    tm = scenario.trainer_model()
    tm = replace(tm, base_s=tm.base_s * scale, sync_s=tm.sync_s * scale)
    sim = Simulation(
        workload=ScaledWorkload(scenario.workload_for(seed), scale),  # type: ignore[arg-type]
        engine=engine, n_engines=n_engines, scheduler=make_policy(scenario, spec),
        batch_size=scenario.batch_size, steps=steps, trainer=tm, router=scenario.cluster.router,
        trace=trace,
        slowdown=slowdown if slowdown is not None else scenario.cluster.engine_slowdown,
    )
    run = sim.run()
    run.warmup_steps = clamp_warmup(scenario.warmup_steps, len(run.steps))
    return run
