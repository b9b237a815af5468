"""The simulation that matches a live replay run: same groups, same scale, same engine limits.

``aprilsim run`` (replay) scales every length by ``scale`` (``real.runner.source.ReplaySource``)
and the trainer's fixed times too; :class:`ScaledWorkload` applies the same rule to the simulated
workload so both sides see identical groups (common random numbers), and
:func:`simulate_matched` builds the simulation with the calibrated cost and the engines' own
limits (max running requests, KV budget) as reported by their server info.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from aprilsim.config import Scenario
from aprilsim.engine.cost import CostModel, EngineSpec, TabulatedCost
from aprilsim.metrics.records import RunResult
from aprilsim.metrics.trace import Trace
from aprilsim.policies.base import Scheduler
from aprilsim.policies.registry import make_scheduler
from aprilsim.scheduler_spec import parse_scheduler_spec  # noqa: F401 - re-exported
from aprilsim.sim.runtime import Simulation
from aprilsim.types import Group
from aprilsim.workload.generator import Workload


def _scaled(x: int, f: float) -> int:
    return max(1, int(round(x * f)))


class _ScaledMean:
    """A length model seen only through ``mean()`` (what the simulation's peak-rate figure asks)."""

    def __init__(self, model: Any, scale: float) -> None:
        self._m, self._f = model, scale

    def mean(self) -> float:
        return float(self._m.mean()) * self._f


class ScaledWorkload:
    """A :class:`Workload` whose lengths are multiplied by ``scale`` exactly as replay does.

    A sample at the cap stays at the cap; one below stays below (a stop never turns into a
    truncation). Everything else is delegated to the wrapped workload.
    """

    def __init__(self, workload: Workload, scale: float) -> None:
        if not 0 < scale <= 1:
            raise ValueError(f"scale must lie in (0, 1], got {scale}")
        self._w, self.scale = workload, scale
        self.max_len = _scaled(workload.max_len, scale)
        self.group_size = workload.group_size
        self.prompt_lengths = _ScaledMean(workload.prompt_lengths, scale)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._w, name)

    def _scale(self, groups: list[Group]) -> list[Group]:
        f = self.scale
        if f == 1:
            return groups
        below = max(1, self.max_len - 1)
        for g in groups:
            g.prompt_len = _scaled(g.prompt_len, f)
            for s in g.samples:
                at_cap = s._target_len >= s.max_len
                s.prompt_len = g.prompt_len
                s.max_len = self.max_len
                s._target_len = self.max_len if at_cap else min(below, _scaled(s._target_len, f))
        return groups

    def generate(self, n: int, step: int, group_size: int | None = None) -> list[Group]:
        return self._scale(self._w.generate(n, step, group_size))

    def regenerate(self, groups: list[Group], step: int, group_size: int) -> list[Group]:
        return self._w.regenerate(groups, step, group_size)  # copies the (scaled) lengths given

    def expected_length(self, step: int) -> float:
        return self._w.expected_length(step) * self.scale


def make_policy(scenario: Scenario, spec: str) -> Scheduler:
    """A fresh scheduler for ``spec`` with the scenario's knobs, overridden by the spec's."""
    name, knobs = parse_scheduler_spec(spec)
    return make_scheduler(name, {**scenario.settings_for(name), **knobs})


def matched_engine(cost: CostModel | TabulatedCost, *, max_running: int, kv_capacity: int,
                   max_prefill_tokens: int = 8192, new_token_ratio: float = 1.0,
                   abort_steps: int | None = None, retract_to: str = "head") -> EngineSpec:
    """The simulated engine of a live replay run: replay requests ignore EOS, so the engine
    reserves their whole remaining length (ratio 1); aborts land and retracted requests
    re-enter the queue as on the live engine (see EngineSpec)."""
    return EngineSpec(cost=cost, kv_capacity=kv_capacity, max_running=max_running,
                      new_token_ratio=new_token_ratio, max_prefill_tokens=max_prefill_tokens,
                      tp=1, label="calibrated", source="aprilsim validate", abort_steps=abort_steps,
                      retract_to=retract_to)


def simulate_matched(scenario: Scenario, spec: str, engine: EngineSpec, *, n_engines: int,
                     scale: float, seed: int | None, steps: int,
                     trace: Trace | None = None) -> RunResult:
    """Simulate ``spec`` as the live replay run does it: scaled lengths and trainer fixed times."""
    tm = scenario.trainer_model()
    tm = replace(tm, base_s=tm.base_s * scale, sync_s=tm.sync_s * scale)
    sim = Simulation(
        workload=ScaledWorkload(scenario.workload_for(seed), scale),  # type: ignore[arg-type]
        engine=engine, n_engines=n_engines, scheduler=make_policy(scenario, spec),
        batch_size=scenario.batch_size, steps=steps, trainer=tm, router=scenario.cluster.router,
        trace=trace,
    )
    run = sim.run()
    run.warmup_steps = min(scenario.warmup_steps, max(0, len(run.steps) - 1))
    return run
