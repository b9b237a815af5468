"""The data of ``aprilsim validate``: its options, one live run, a whole validation, and the
per-scheduler comparisons of a round (shared by :mod:`real.validate`, :mod:`real.validate_live`
and :mod:`real.validate_report`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from real.runner.options import EngineTarget

if TYPE_CHECKING:
    from aprilsim.config import Scenario
    from aprilsim.metrics.records import RunResult
    from aprilsim.metrics.trace import Trace
    from aprilsim.validate.costfit import CostFit


@dataclass(frozen=True)
class ValidateOptions:
    """``aprilsim validate``'s options: the engines, the length scale (and the trainer's fixed
    times), the workload seed, the steps per run (default: the scenario's), a cost calibration
    file (default: fitted on the live runs), interleaved rounds of every scheduler, and the
    concurrency of engines that do not report it. ``cross_fit`` (R >= 2 rounds, no calibration
    file): every round is judged with the cost fitted on the other R - 1 rounds (leave one round
    out), instead of one extra round run for the fit alone. ``pin``: the client and the engines
    on separate cores. ``keep``: the folder (``--out``) whose ``runs/`` keeps every finished
    live run as it finishes, and whose runs a resumed validate skips."""

    target: EngineTarget
    scale: float = 1.0
    seed: int | None = None
    steps: int | None = None
    calibration: Path | None = None
    repeats: int = 1
    max_running: int | None = None
    cross_fit: bool = False
    pin: bool = False
    keep: Path | None = None  # --out: every finished live run kept there (real.validate_store)

    @property
    def holdout_round(self) -> bool:
        """Whether one more round runs first, for the fit alone (R >= 2, no file, no cross-fit)."""
        return self.repeats > 1 and not self.calibration and not self.cross_fit

    @property
    def cross_fitted(self) -> bool:
        """Whether each round is judged with the cost fitted on the other rounds."""
        return self.cross_fit and self.repeats > 1 and not self.calibration

    @property
    def live_rounds(self) -> int:
        """Rounds run live: the judged ones, and the held-out one where there is one."""
        return max(1, self.repeats) + (1 if self.holdout_round else 0)


@dataclass
class LiveOutcome:
    """One scheduler's live run, the engines' iteration rows in its time (runtime clock), traces,
    the machine check, and the engines' running-request samples (vLLM /metrics)."""

    label: str
    result: RunResult
    rows: list[list[dict[str, Any]]]  # per engine; ``t_run``: end of step on the run's clock
    trace: Trace
    wall_s: float
    overhead_per_request_s: float
    round: int = 0
    timing: list[str] = field(default_factory=list)  # per engine: "iteration log" | "token stream"
    # vs the log, per engine
    recon_error: list[dict[str, float] | None] = field(default_factory=list)
    counters: list[dict[str, float] | None] = field(default_factory=list)  # vLLM /metrics deltas
    machine: dict[str, Any] = field(default_factory=dict)  # real.machine + starvation, this run
    # (t, running, waiting)
    running: list[list[tuple[float, int, int]]] = field(default_factory=list)

    def __setstate__(self, state: dict[str, Any]) -> None:  # runs pickled before these fields
        self.__dict__.update({"machine": {}, "running": [], **state})


@dataclass
class Validation:
    """Everything the report needs."""

    scenario: Scenario
    specs: list[str]
    scale: float
    seed: int | None
    steps: int
    engines: str
    limits: dict[str, Any]  # the engines' limits and rules the simulation takes
    fit: CostFit
    live: list[LiveOutcome] = field(default_factory=list)  # the judged rounds' runs
    sim: dict[str, RunResult] = field(default_factory=dict)
    sim_traces: dict[str, Trace] = field(default_factory=dict)
    calibration_from: str = "iteration logs of the live runs"
    timings: dict[str, float] = field(default_factory=dict)
    held_out: bool = False  # the cost was fitted on runs the comparison does not use
    checks: list[str] = field(default_factory=list)  # what was checked before the first run
    calibration_runs: list[LiveOutcome] = field(default_factory=list)
    # cross-fitting: per judged round, its own cost (fitted on the other rounds) and simulations
    round_fits: dict[int, CostFit] = field(default_factory=dict)
    round_sims: dict[tuple[str, int], RunResult] = field(default_factory=dict)
    round_traces: dict[tuple[str, int], Trace] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)  # engine family, where limits came from

    def fit_for(self, round_: int) -> CostFit:
        """The cost that judges ``round_`` (its own under cross-fitting, else the one fit)."""
        return self.round_fits.get(round_, self.fit)

    def sim_for(self, label: str, round_: int) -> RunResult:
        """The simulation ``round_``'s run of ``label`` is compared with."""
        return self.round_sims.get((label, round_), self.sim[label])

    def sim_trace_for(self, label: str, round_: int) -> Trace | None:
        return self.round_traces.get((label, round_), self.sim_traces.get(label))

    @property
    def rounds(self) -> list[list[LiveOutcome]]:
        """The judged runs by round, in the order they ran."""
        out: dict[int, list[LiveOutcome]] = {}
        for o in self.live:
            out.setdefault(o.round, []).append(o)
        return [out[k] for k in sorted(out)]


def steady_rows(o: LiveOutcome) -> list[list[dict[str, Any]]]:
    """Iteration rows after the run's warm-up steps (engine warm-up left out of the fit)."""
    warm = o.result.warmup_steps
    t_min = o.result.steps[warm].rollout_start_s if warm < len(o.result.steps) else 0.0
    return [[r for r in eng if r["t_run"] >= t_min] for eng in o.rows]


def fit_rows(o: LiveOutcome) -> list[list[dict[str, Any]]]:
    """The steady rows a cost is fitted on, each rebuilt prefill counting the prompt tokens the
    engine computed (`pricing.computed_rows`), as the pricing counts them."""
    from aprilsim.validate.pricing import computed_rows

    return [computed_rows(rows, share)
            for rows, share in zip(steady_rows(o), computed_shares(o), strict=True)]


def comparisons(v: Validation, round_: int | None = 0):
    """The per-scheduler comparisons of one round of a validation (all rounds: ``None``)."""
    from aprilsim.validate.compare import compare_runs
    from aprilsim.validate.pricing import per_step

    return [compare_runs(o.label, v.sim_for(o.label, o.round), o.result, per_step(o.result, o.rows),
                         per_step(o.result, o.rows, v.fit_for(o.round).effective,
                                  computed_shares(o)))
            for o in v.live if round_ is None or o.round == round_]


def computed_shares(o: LiveOutcome) -> list[float | None]:
    """Per engine of a live run, the share of the prompt tokens its rows count that it computed
    (`pricing.computed_share` of its counters), for rows rebuilt from token streams (they count
    every prompt token sent); None (all computed) for an engine's own iteration log, whose
    prefill rows count computed tokens, and where the engine reports no cache hits."""
    from aprilsim.validate.pricing import computed_share

    out: list[float | None] = []
    for i in range(len(o.rows)):
        rebuilt = i < len(o.timing) and o.timing[i].startswith("token stream")
        c = o.counters[i] if i < len(o.counters) else None
        out.append(computed_share(c) if rebuilt else None)
    return out
