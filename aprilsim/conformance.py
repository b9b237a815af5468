"""A conformance check any scheduler can be put through, like scikit-learn's `check_estimator`.

`check_scheduler("april")` or `check_scheduler(MyScheduler, {"knob": 1})` runs the scheduler on
small simulated scenarios (ordinary rewards, and U-shaped pass rates where most groups have
all-equal rewards) and checks the invariants every scheduler must keep, whatever it promises on top:

* ledger: every sample created is in exactly one state at the end, the engines' token count equals
  the samples', trained tokens in the step records are the trained samples' tokens;
* batches: one per step, of N finished groups of full size (fewer only when the step record says
  `short_batch`), each sample trained once and finished exactly where the workload ends it;
* max length: no sample exceeds max_response_len, its segments add up to what it generated;
* episodes (agentic scenarios): an episode is at one of its planned turns with exactly the tool
  tokens of the calls before it appended, never past its plan nor its response budget; a
  trained one ran every turn and tool call of its plan;
* determinism: the same seed gives the same run, bit for bit; another seed gives another run;
* honest opt-out: a scheduler that sets `sample_events = False` gives the same run when it is sent
  SampleFinished events anyway (it claimed to ignore them).

By default the checks run the simulator; `run=` takes another driver of the same rollout core,
e.g. `real.runner.live_conformance.run_under_live` (the live asyncio driver on simulated engines
in virtual time), so a user's scheduler is checked on both drivers. It lives above
`aprilsim.policies` (it runs the simulator), so schedulers never import the runtime.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from aprilsim.config import Scenario, scenario_from_dict
from aprilsim.metrics.records import RunResult
from aprilsim.policies.base import Action, CloseBatch, Context, Event, Scheduler
from aprilsim.policies.registry import make_scheduler
from aprilsim.sim.build import build_simulation
from aprilsim.types import Group, SampleStatus

__all__ = [
    "BatchRecorder", "ConformanceError", "ConformanceRun", "Driver", "RunUnderCheck",
    "agentic_scenario", "check_scheduler", "conformance_scenario", "recorder_for",
    "run_under_check", "small_scenario",
]


class ConformanceError(AssertionError):
    """A scheduler broke an invariant; the message names the check and the scenario."""


@dataclass
class BatchRecorder:
    """Wraps a scheduler, records every batch it closes, and forwards its `sample_events` opt-out
    (or forces SampleFinished events on, to test that the opt-out is honest)."""

    inner: Any
    force_sample_events: bool = False
    batches: list[tuple[Group, ...]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.name = self.inner.name
        self.mode = self.inner.mode
        self.sample_events = self.force_sample_events or getattr(self.inner, "sample_events", True)
        self.turn_events = getattr(self.inner, "turn_events", False)  # a per-turn barrier

    def handle(self, event: Event, ctx: Context) -> Sequence[Action]:
        actions = list(self.inner.handle(event, ctx))
        self.batches += [a.groups for a in actions if isinstance(a, CloseBatch)]
        return actions

    def step_stats(self) -> dict[str, float]:
        return self.inner.step_stats()


MIXTURE = {"family": "lognormal_mixture", "weights": [0.7, 0.3], "mus": [5.7, 7.3],
           "sigmas": [0.6, 0.7]}  # ~300 and ~1,500 tokens
PROMPTS = {"family": "lognormal", "mu": 4.5, "sigma": 0.5, "max_len": 512}
TRAINER = {"base_s": 1.0, "per_token_s": 1e-5, "sync_s": 0.5}


def small_scenario(*, name: str = "small", seed: int = 0, steps: int = 5, warmup: int | None = None,
                   batch: int = 6, group: int = 4, max_len: int = 3072, engines: int = 2,
                   cluster: dict[str, Any] | None = None,
                   rewards: tuple[float, float] | None = None,
                   lengths: dict[str, Any] | None = None, prompts: dict[str, Any] | None = None,
                   trainer: dict[str, Any] | None = None,
                   schedulers: dict[str, dict[str, Any]] | None = None) -> Scenario:
    """A few seconds of simulated cluster (the one small-scenario builder of the checks and the
    tests): long-tailed lengths, Beta(`rewards`) pass rates linked to length when given."""
    data: dict[str, Any] = {
        "name": name, "seed": seed, "steps": steps, "batch_size": batch, "group_size": group,
        "max_response_len": max_len, "cluster": {"engines": engines, **(cluster or {})},
        "trainer": trainer or TRAINER, "lengths": lengths or MIXTURE, "prompts": prompts or PROMPTS,
        "schedulers": schedulers or {},
    }
    if warmup is not None:
        data["warmup_steps"] = warmup
    if rewards is not None:
        a, b = rewards
        data["workload"] = {"rewards": {"alpha": a, "beta": b, "difficulty_length_corr": 0.5}}
    return scenario_from_dict(data)


def agentic_scenario(*, seed: int = 0, steps: int = 4, max_turns: int = 4,
                     tool_s: tuple[float, float] = (0.05, 1.5), **cluster: Any) -> Scenario:
    """A few seconds of simulated cluster running agentic episodes (1 to `max_turns` turns,
    tool calls of `tool_s` seconds), a retained prefix cache and group-affinity routing."""
    sc = small_scenario(name="agentic", seed=seed, steps=steps, warmup=0, batch=4, group=3,
                        max_len=2048, rewards=(1.0, 1.0),
                        lengths={"family": "lognormal", "mu": 5.0, "sigma": 0.8},
                        cluster={"prefix_cache": "lru", "router": "group_affinity", **cluster})
    data = sc.model_dump()
    data.pop("base_dir")
    data["workload"]["episodes"] = {"max_turns": max_turns, "min_turns": 1,
                                    "tool_s": {"low": tool_s[0], "high": tool_s[1]}}
    data["workload"] = {k: v for k, v in data["workload"].items() if v is not None}
    return scenario_from_dict(data)


def conformance_scenario(*, seed: int = 0, rewards: tuple[float, float] = (1.0, 1.0),
                         steps: int = 5, **cluster: Any) -> Scenario:
    """A few seconds of simulated cluster with long-tailed lengths (the checks' default
    scenario)."""
    return small_scenario(name="conformance", seed=seed, steps=steps, warmup=0, rewards=rewards,
                          cluster=cluster)


class Driver(Protocol):
    """What the checks read of a finished run's driver (a Simulation, a LiveRuntime)."""

    @property
    def groups(self) -> dict[int, Group]: ...


@dataclass
class ConformanceRun:
    """One finished run under the checks: the driver (`sim`: the Simulation by default, or the
    live runtime), its result, the batches closed."""

    sim: Driver
    recorder: BatchRecorder
    scenario: Scenario
    result: RunResult


class RunUnderCheck(Protocol):
    """A driver's way to run a scheduler for the checks (`run_under_check` is the simulator's)."""

    def __call__(self, scheduler: str | type, settings: dict[str, Any] | None, scenario: Scenario,
                 *, force_sample_events: bool = False) -> ConformanceRun: ...


def recorder_for(scheduler: str | type, settings: dict[str, Any] | None, *,
                 force_sample_events: bool = False) -> BatchRecorder:
    """A fresh scheduler (a name, `module:Class`, or a class) wrapped in a BatchRecorder."""
    return BatchRecorder(_make(scheduler, settings), force_sample_events=force_sample_events)


def run_under_check(scheduler: str | type, settings: dict[str, Any] | None, scenario: Scenario,
                    *, force_sample_events: bool = False, **build: Any) -> ConformanceRun:
    """Build a fresh scheduler, wrap it in a BatchRecorder, run it on `scenario` (simulated)."""
    rec = recorder_for(scheduler, settings, force_sample_events=force_sample_events)
    sim = build_simulation(scenario, rec, **build)  # type: ignore[arg-type]
    return ConformanceRun(sim, rec, scenario, sim.run())


def _make(scheduler: str | type, settings: dict[str, Any] | None) -> Scheduler:
    if isinstance(scheduler, str):
        return make_scheduler(scheduler, settings or {})
    return scheduler(**(settings or {}))


def _fail(check: str, where: str, msg: str) -> None:
    raise ConformanceError(f"{check} [{where}]: {msg}")


def check_ledger(r: ConformanceRun, where: str = "") -> None:
    end = r.result.end_state
    states = [st.value for st in SampleStatus]
    handed_out = sum(g.size for g in r.sim.groups.values())
    if sum(end[f"samples_{s}"] for s in states) != handed_out:
        _fail("ledger", where, f"samples by state {end} do not add up to the {handed_out} created")
    if end["engine_tokens"] != sum(end[f"tokens_{s}"] for s in states):
        _fail("ledger", where, "tokens generated by the engines != tokens held by samples")
    if sum(s.trained_tokens for s in r.result.steps) != end["tokens_trained"]:
        _fail("ledger", where, "trained tokens in step records != tokens of trained samples")
    wasted = sum(s.wasted_tokens for s in r.result.steps)
    if r.recorder.mode == "colocated" and wasted != end["tokens_discarded"]:
        _fail("ledger", where,
              f"wasted tokens {wasted} != discarded tokens {end['tokens_discarded']}")
    if wasted > end["tokens_discarded"]:
        _fail("ledger", where, "more tokens counted as waste than were discarded")


def check_batches(r: ConformanceRun, where: str = "") -> None:
    steps, n, gsize = r.scenario.steps, r.scenario.batch_size, r.scenario.group_size
    batches = r.recorder.batches
    if not len(r.result.steps) == steps == len(batches):
        _fail("batches", where, f"{len(batches)} batches closed, {len(r.result.steps)} records, "
              f"{steps} steps")
    seen: set[int] = set()
    for rec, batch in zip(r.result.steps, batches):
        short = rec.scheduler_stats.get("short_batch") == 1.0
        if len(batch) != n and not (short and len(batch) < n):
            _fail("batches", where, f"step {rec.step}: {len(batch)} groups, N = {n}")
        if rec.trained_groups != len(batch):
            _fail("batches", where, f"step {rec.step}: record says {rec.trained_groups} groups")
        for g in batch:
            if g.size != gsize:
                _fail("batches", where, f"group {g.gid} trained with {g.size} of {gsize} samples")
            for s in g.samples:
                if s.status is not SampleStatus.TRAINED or not s.complete:
                    _fail("batches", where, f"sample {s.uid} trained while {s.status.value}")
                if s.generated != s._target_len:
                    _fail("batches", where, f"sample {s.uid} trained at {s.generated} tokens, "
                          f"its response has {s._target_len}")
                if s.uid in seen:
                    _fail("batches", where, f"sample {s.uid} trained twice")
                seen.add(s.uid)


def check_max_length(r: ConformanceRun, where: str = "") -> None:
    max_len = r.scenario.max_response_len
    for g in r.sim.groups.values():
        for s in g.samples:
            if not 0 <= s.generated <= min(max_len, s._target_len):
                _fail("max length", where, f"sample {s.uid} generated {s.generated} tokens")
            if sum(seg.tokens for seg in s.segments) != s.generated:
                _fail("max length", where, f"sample {s.uid}: segments do not add up")


def check_episodes(r: ConformanceRun, where: str = "") -> None:
    for g in r.sim.groups.values():
        for s in g.samples:
            ep = s.episode
            if ep is None:
                continue
            if not 0 <= ep.turn < len(ep._ends) or s.generated > ep._ends[ep.turn]:
                _fail("episodes", where, f"sample {s.uid} at turn {ep.turn} with {s.generated} "
                      f"tokens, past its plan {ep._ends}")
            if ep.appended != sum(ep._tool_tokens[: ep.turn]):
                _fail("episodes", where, f"sample {s.uid}: {ep.appended} tool tokens appended "
                      f"at turn {ep.turn}, its plan's calls before it hold "
                      f"{sum(ep._tool_tokens[: ep.turn])}")
            if s.generated + ep.appended > s.max_len:
                _fail("episodes", where, f"sample {s.uid}: response past max_response_len")
            if s.status is SampleStatus.TRAINED and (ep.turn != len(ep._ends) - 1 or ep.calling):
                _fail("episodes", where, f"sample {s.uid} trained at turn {ep.turn} of "
                      f"{len(ep._ends)}")


def _fingerprint(r: ConformanceRun) -> tuple:
    return (r.result.summary(), [s.to_dict() for s in r.result.steps], r.result.end_state)


def check_scheduler(
    scheduler: str | type,
    settings: dict[str, Any] | None = None,
    *,
    scenarios: dict[str, Scenario] | None = None,
    run: RunUnderCheck = run_under_check,
) -> list[str]:
    """Run every shared check on `scheduler` (a registered name, `module:Class`, or a class);
    raise ConformanceError at the first broken invariant; return the names of the checks passed.
    `run` is the driver the runs go through (default: the simulator; see the module docstring)."""
    scenarios = scenarios or {
        "plain": conformance_scenario(rewards=(1.0, 1.0)),
        "u_shaped": conformance_scenario(rewards=(0.3, 0.3)),
    }
    passed: list[str] = []
    policy = _make(scheduler, settings)
    opts_out = not getattr(policy, "sample_events", True)
    for label, sc in scenarios.items():
        r = run(scheduler, settings, sc)
        for check in (check_ledger, check_batches, check_max_length, check_episodes):
            check(r, label)
            passed.append(f"{check.__name__}[{label}]")
        again = run(scheduler, settings, sc)
        if _fingerprint(again) != _fingerprint(r):
            _fail("determinism", label, "the same seed gave a different run")
        passed.append(f"determinism[{label}]")
        if opts_out:
            try:
                forced = run(scheduler, settings, sc, force_sample_events=True)
            except Exception as e:  # noqa: BLE001 - any failure here is the finding
                _fail("sample_events opt-out", label, f"sending SampleFinished events broke the "
                      f"run of a scheduler that opts out: {type(e).__name__}: {e}")
            if _fingerprint(forced) != _fingerprint(r):
                _fail("sample_events opt-out", label,
                      "sending SampleFinished events changed the run of a scheduler that opts out")
            passed.append(f"sample_events_opt_out[{label}]")
    first = next(iter(scenarios.values()))
    other = first.model_copy(update={"seed": first.seed + 1})
    a = run(scheduler, settings, first)
    b = run(scheduler, settings, other)
    if a.result.summary()["generated_tokens"] == b.result.summary()["generated_tokens"]:
        _fail("seed", "", "another seed gave the same generated tokens")
    passed.append("another_seed")
    return passed
