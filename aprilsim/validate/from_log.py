"""Offline validation (`aprilsim replay-validate`): replay a run's logged groups under the
scheduler it used, simulated with a preset or a calibration, and compare the predicted per-step
rollout times with the ones the run logged, in the live validation's report format.

No engine runs: the measured side is the log (its per-step rollout times and the lengths it
trained), the predicted side a simulation of the replay workload (`aprilsim.workload.replay`).
Simulated step i is paired with the log's i-th step. What the log does not measure (step time
unless logged, off-policy share, wasted tokens) reads n/a in the report.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aprilsim.config import Scenario, ScenarioError
from aprilsim.metrics.records import RunResult
from aprilsim.metrics.warmup import clamp_warmup
from aprilsim.policies.base import CloseBatch, Context, Event
from aprilsim.sim.build import build_simulation
from aprilsim.types import Group
from aprilsim.validate.compare import METRICS, SchedulerComparison
from aprilsim.validate.scaled import make_policy
from aprilsim.workload.replay.source import ReplayWorkload
from aprilsim.workload.replay.spec import notes_for


class BatchRecorder:
    """A scheduler wrapper that records the groups of every batch it closes, by step."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.mode = inner.mode
        self.sample_events = getattr(inner, "sample_events", True)
        self.turn_events = getattr(inner, "turn_events", False)
        self.batches: list[tuple[int, tuple[Group, ...]]] = []  # (step, groups) per closed batch

    def handle(self, event: Event, ctx: Context):
        actions = self.inner.handle(event, ctx)
        for a in actions:
            if isinstance(a, CloseBatch):
                self.batches.append((ctx.step, a.groups))
        return actions

    def step_stats(self) -> dict[str, float]:
        return self.inner.step_stats()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@dataclass
class OfflineRun:
    """One scheduler replayed: its simulation, what it trained, and the workload's usage."""

    label: str
    result: RunResult
    recorder: BatchRecorder
    workload: ReplayWorkload
    notes: list[str] = field(default_factory=list)


def replay_run(sc: Scenario, spec: str, *, steps: int | None = None) -> OfflineRun:
    """Simulate scheduler `spec` (NAME or NAME@knob=v,...) on the scenario's replay workload."""
    rec = BatchRecorder(make_policy(sc, spec))
    sim = build_simulation(sc, rec, steps=steps)
    if not isinstance(sim.workload, ReplayWorkload):
        raise ScenarioError("lengths: offline validation needs lengths = { replay = LOG, ... }")
    run = sim.run()
    run.warmup_steps = clamp_warmup(sc.warmup_steps, len(run.steps))
    return OfflineRun(spec, run, rec, sim.workload, [sim.workload.usage()])


def replay_scenario(sc: Scenario, log_spec: dict[str, Any], *, fit_batch: bool = True) -> Scenario:
    """`sc` with `lengths` replaced by the replay spec; with `fit_batch`, the batch size, group
    size and steps the log holds (the scheduler then closes batches as the run did)."""
    from aprilsim.config import scenario_from_dict

    data = sc.model_dump(exclude={"base_dir"})
    data["lengths"] = {k: v for k, v in log_spec.items() if v is not None}
    out = scenario_from_dict(data, sc.base_dir)
    if fit_batch:
        wl = out.workload_for()
        run = wl.run  # type: ignore[attr-defined]
        steps = len(run.steps)
        data.update(batch_size=run.batch_size, group_size=run.group_size, steps=steps,
                    warmup_steps=clamp_warmup(sc.warmup_steps, steps))
        out = scenario_from_dict(data, sc.base_dir)
    return out


def measured_summary(run_log: Any, steps: Sequence[int], warmup: int) -> dict[str, Any]:
    """The log's side of the report: what it measured after the warm-up (None: not measured)."""
    st = list(steps)[warmup:]
    times = [run_log.rollout_s.get(s) for s in st]
    known = [(s, t) for s, t in zip(st, times) if t is not None and t > 0]
    toks = {s: sum(sum(g.lengths) for g in run_log.groups_of(s)) for s, _ in known}
    total_t = sum(t for _, t in known)
    out: dict[str, Any] = dict.fromkeys(METRICS)
    out["mean_rollout_time_s"] = total_t / len(known) if known else None
    # trained
    out["rollout_throughput_tok_s"] = sum(toks.values()) / total_t if total_t > 0 else None
    out["generated_tokens"] = None  # the log holds what was trained, not all that was generated
    out["trained_tokens"] = sum(sum(sum(g.lengths) for g in run_log.groups_of(s)) for s in st)
    out["retractions"] = None
    out["steps"] = len(st)
    return out


def compare_to_log(o: OfflineRun) -> SchedulerComparison:
    """Predicted (the replayed simulation) vs measured (the log) for one scheduler."""
    run_log = o.workload.run
    steps = run_log.steps
    n = min(len(o.result.steps), len(steps))
    warm = clamp_warmup(o.result.warmup_steps, n)
    meas = [float(run_log.rollout_s.get(s) or 0.0) for s in steps[:n]]  # 0: not logged, left out
    if not any(meas):
        raise ScenarioError(f"{run_log.source}: no per-step rollout times for the replayed steps "
                            "(give --timing FILE: slime's log, verl's metrics, or a "
                            "step,rollout_s CSV)")
    if not any(meas[warm:]):
        timed = [s for s, t in zip(steps[:n], meas) if t]
        raise ScenarioError(f"{run_log.source}: only warm-up step(s) {timed} are timed; nothing "
                            f"is left to compare after the {warm} warm-up step(s) (time more "
                            "steps, or --warmup 0)")
    pred = o.result.summary(warm)
    roll = pred["mean_rollout_time_s"] * pred["steps"]
    # a log holds what was trained, not all that was generated: throughput is trained tokens per
    # rollout second on both sides (the same figure for sync; APRIL's differs step to step)
    pred["rollout_throughput_tok_s"] = pred["trained_tokens"] / roll if roll else 0.0
    return SchedulerComparison(
        label=o.label, predicted=pred,
        measured=measured_summary(run_log, steps[:n], warm),
        pred_rollout_s=[s.rollout_time_s for s in o.result.steps[:n]],
        meas_rollout_s=meas, warmup=warm)


def cost_dict(sc: Scenario, source: str) -> dict[str, Any]:
    """The calibration section of the report: the cost the simulation ran (given, not fitted)."""
    c = sc.engine_spec().cost
    coeffs = {k: getattr(c, k, None) for k in ("a", "b", "c", "p0", "p1", "p2", "pr")}
    return {**coeffs, "wall": dict(coeffs), "source": source}  # no fit figures: n/a


def report_from_log(sc: Scenario, runs: Sequence[OfflineRun], *, calibration_from: str
                    ) -> tuple[dict[str, Any], list[SchedulerComparison]]:
    """The JSON report (`aprilsim.validate.report.report_dict`) of offline runs, and the rows."""
    from aprilsim.validate.report import report_dict

    rows = [compare_to_log(o) for o in runs]
    wl = runs[0].workload
    meta = {"scenario": sc.name, "schedulers": [o.label for o in runs], "scale": 1.0,
            "seed": sc.seed, "steps": sc.steps, "limits": "the scenario's engine",
            "engines": f"offline: log {wl.run.source} ({wl.run.fmt}) replayed on "
                       f"{sc.cluster.engines} simulated engines",
            "calibration_from": calibration_from, "replay": notes_for(wl),
            "usage": {o.label: o.notes for o in runs}}
    rep = report_dict(rows, meta, cost_dict(sc, calibration_from))
    t = rep["targets"]
    for key in ("step_priced_error", "gain_priced_pp", "ranking_priced"):  # no iteration log
        t[key].update(worst=None, met=None)
    if not t["gain_vs_sync_pp"]["by_scheduler"]:  # one logged run: no measured gain
        t["gain_vs_sync_pp"].update(worst=None, met=None)
    if len(rows) < 2:
        t["ranking"]["met"] = None
    return rep, rows


def write_from_log(sc: Scenario, runs: Sequence[OfflineRun], out: Path, *, calibration_from: str,
                   figures: bool = True) -> dict[str, Any]:
    """Write ``out/report.md``, ``out/report.json`` (and the per-step figure)."""
    from aprilsim.validate.report import write_figures, write_report

    rep, rows = report_from_log(sc, runs, calibration_from=calibration_from)
    out.mkdir(parents=True, exist_ok=True)
    figs = write_figures(rows, out) if figures else []
    write_report(rep, out, figs)
    return rep
