"""`aprilsim advise`: from a user's own material to a ranked recommendation, in one call.

It composes what exists, in order: the launch config imported (`aprilsim.interop`: a slime script
or a verl config; else a scenario file or the default), the response lengths fitted from a
generation log (`aprilsim.workload.fitting.fit_log`, written as a length model the scenario reads),
the engine cost from a calibration file (`[cluster] preset = FILE`) or the preset the import
picked, then each candidate scheduler (every registered one by default) tuned under the user's
limits (`aprilsim.sweep.tune`: paired seeds, constraints held over the whole 95 % interval,
figures from fresh seeds). Options are ranked by their gain in trained samples per second over
the scheduler the user runs today (the imported config's; `--baseline`), on those fresh seeds
(end to end: training and weight sync included, discarded tokens not counted as progress). An
option no setting of which meets the limits is listed as infeasible with the constraint it
missed and by how much; each option says whether the user's framework can launch it
(`advise_launch`). See docs/advise.md.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from aprilsim.advise_launch import launch

__all__ = ["CANDIDATES", "Advice", "Limits", "Option", "Search", "advise", "build_scenario"]


@dataclass(frozen=True)
class Search:
    """The knob `tune` searches for a candidate: `schedulers.NAME.knob` over [lo, hi]
    (`per_batch`: the bounds are multiples of the batch size N)."""

    knob: str
    lo: float
    hi: float
    integer: bool = False
    per_batch: bool = False


# every registered scheduler but sync (always measured, the reference of every figure): what is
# searched, or None (measured with its defaults). `test_advise` checks the registry is covered.
CANDIDATES: dict[str, Search | None] = {
    "april": Search("ratio", 1.25, 2.5),
    "april_ds": Search("ratio", 1.25, 2.5),
    "slime_dapo": Search("ratio", 1.0, 2.0),
    "async_april": Search("ratio", 1.25, 2.5),
    "async_one_step": None,
    "fully_async": Search("eta", 0, 4, integer=True),
    "env_async": Search("eta", 0, 4, integer=True),
    "sync_turns": None,  # sync's per-turn barrier: sync itself on single-turn workloads
    "dynamic_sampling": Search("gen_batch_size", 1, 3, integer=True, per_batch=True),
    "tail_batching": Search("prompt_ratio", 1.0, 2.0),
    "seer": None,
    "seer_history": None,
}


@dataclass(frozen=True)
class Limits:
    """What the user accepts: each None is no limit. Checked over each 95 % interval."""

    max_offpolicy: float | None = None  # offpolicy_token_fraction
    max_staleness: int | None = None  # max_staleness (policy versions)
    max_length_bias: float | None = None  # |length_bias - sync's on the same seed|

    def constraints(self) -> list[str]:
        """As `aprilsim tune --subject-to` expressions."""
        out = []
        if self.max_offpolicy is not None:
            out.append(f"offpolicy_token_fraction<={self.max_offpolicy}")
        if self.max_staleness is not None:
            out.append(f"max_staleness<={self.max_staleness}")
        if self.max_length_bias is not None:
            out.append(f"|length_bias_vs_sync|<={self.max_length_bias}")
        return out


@dataclass
class Option:
    """One candidate's outcome: its setting and figures on fresh seeds, or why it is out."""

    scheduler: str
    setting: dict[str, Any] = field(default_factory=dict)
    gain: float = math.nan  # trained samples/s / the baseline's, mean over the fresh seeds
    gain_lo: float = math.nan
    gain_hi: float = math.nan
    tok_gain: float = math.nan  # rollout tok/s / the baseline's (counts discarded tokens too)
    offpolicy: float = math.nan
    staleness: float = math.nan
    length_bias_vs_sync: float = math.nan
    sync_gain: float = math.nan  # trained samples/s / sync's
    infeasible: str = ""  # why no setting meets the limits ("" when feasible)
    misses: list[dict[str, Any]] = field(default_factory=list)  # the constraints missed
    mode: str = "colocated"  # disaggregated: the trainer runs on GPUs of its own besides
    launch: str = "?"  # the user's framework launches it: "yes", "no", "?" (unknown)
    launch_how: str = ""  # how, or what it would take
    baseline: bool = False  # the scheduler the user runs today

    def __post_init__(self) -> None:
        from aprilsim.policies.registry import resolve

        self.mode = resolve(self.scheduler).mode

    @property
    def label(self) -> str:
        """`april@ratio=1.5`: the spelling `simulate -s` and `validate -s` take."""
        if not self.setting:
            return self.scheduler
        knobs = ",".join(f"{k.rsplit('.', 1)[-1]}={_num(v)}" for k, v in self.setting.items())
        return f"{self.scheduler}@{knobs}"


@dataclass
class Advice:
    """The ranked options (feasible first, best gain first), and what they were computed on."""

    options: list[Option]
    scenario: dict[str, Any]  # the advised scenario: compare = [baseline, winner], its knob set
    sources: list[str]  # what was read, one line each
    limits: Limits
    seeds: int
    steps: int
    warmup: int
    baseline: str = "sync"  # the scheduler the gains are over (what the user runs today)
    framework: str | None = None  # slime, verl, or None (a scenario file)
    warnings: list[str] = field(default_factory=list)  # what makes the advice less trustworthy

    @property
    def best(self) -> Option | None:
        """The best feasible option, launchable or not."""
        return self.options[0] if self.options and not self.options[0].infeasible else None

    @property
    def winner(self) -> Option | None:
        """The best feasible option the user's framework can launch (any, without one)."""
        for o in self.options:
            if not o.infeasible and o.launch != "no":
                return o
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"options": [{**asdict(o), "label": o.label} for o in self.options],
                "winner": self.winner.label if self.winner else None,
                "best": self.best.label if self.best else None, "baseline": self.baseline,
                "framework": self.framework, "warnings": self.warnings, "sources": self.sources,
                "limits": asdict(self.limits), "seeds": self.seeds, "steps": self.steps,
                "warmup": self.warmup, "scenario": self.scenario}


def _num(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


@dataclass
class Setup:
    """What `build_scenario` read: the scenario, a line per source, the framework the config is
    for, the scheduler it runs, and warnings about the workload."""

    scenario: Any
    sources: list[str]
    framework: str | None = None
    runs: str = "sync"
    warnings: list[str] = field(default_factory=list)


def build_scenario(*, scenario: Path | None = None, slime: str | None = None,
                   verl: Path | None = None, log: Path | None = None,
                   calibration: Path | None = None, sets: tuple[str, ...] = (),
                   out_dir: Path, log_column: str | None = None) -> Setup:
    """The scenario to advise on (validated), with what was read. Raises ValueError or
    ScenarioError (one line) on bad input."""
    from aprilsim.config import load_scenario, scenario_from_dict
    from aprilsim.simulate_cli import apply_sets
    from aprilsim.sweep.keys import scenario_dict

    if sum(x is not None for x in (scenario, slime, verl)) > 1:
        raise ValueError("give at most one of SCENARIO, --slime, --verl")
    setup = Setup(None, [])
    base_dir = str(out_dir.resolve())
    if slime is not None or verl is not None:
        data = _imported(setup, slime, verl, log)
    else:
        sc0 = load_scenario(scenario)
        data = scenario_dict(sc0)
        base_dir = sc0.base_dir
        setup.sources.append(f"scenario: {scenario or 'the default (APRIL paper)'}")
    if log is not None:
        _fit_lengths(setup, data, log, log_column, out_dir)
    if calibration is not None:
        data.setdefault("cluster", {})["preset"] = str(calibration.resolve())
        setup.sources.append(f"engine cost: calibration {calibration}")
    else:
        preset = data.get("cluster", {}).get("preset", "the default")
        setup.sources.append(f"engine cost: preset {preset}")
    setup.scenario = apply_sets(scenario_from_dict(data, base_dir), sets)
    return setup


def _imported(setup: Setup, slime: str | None, verl: Path | None, log: Path | None) -> dict:
    """The scenario data of a slime or verl launch config; `setup` learns the framework and
    the scheduler the config runs (the import's last `compare` entry)."""
    from aprilsim import interop

    if slime is not None:
        from aprilsim.interop.slime import read_source

        res = interop.from_slime(read_source(slime))
        origin = slime if len(slime) < 60 else slime[:57] + "..."
        setup.sources.append(f"launch config: slime {origin}")
        setup.framework = "slime"
    else:
        assert verl is not None
        res = interop.from_verl(verl.read_text())
        setup.sources.append(f"launch config: verl {verl}")
        setup.framework = "verl"
    data = res.data
    setup.runs = str((data.get("compare") or ["sync"])[-1])
    setup.sources += [f"  import note: {n}" for n in res.notes
                      if log is None or not n.startswith("lengths:")]  # the log's fit replaces it
    return data


def _fit_lengths(setup: Setup, data: dict, log: Path, column: str | None, out_dir: Path) -> None:
    """Fit the log's lengths into `data` (a model file); warn when the log holds responses
    longer than the scenario's cap: the simulation truncates them, and the advice is for that
    truncated workload, not the logged one (issue 36 item 3)."""
    import numpy as np

    from aprilsim.workload.fitting.api import fit_log

    cap = int(data.get("max_response_len", 16384))
    report = fit_log(log, column=column, max_len=cap, n_bootstrap=0)
    model = out_dir / "lengths.toml"
    report.write_model(model)
    data["lengths"] = {"from": str(model.resolve())}
    f = report.fitter
    setup.sources.append(f"lengths: fitted from {log} ({f.best_.family}, {f.n_samples_:,} "
                         f"responses) -> {model}")
    hist = report.data.histogram
    values, counts = np.asarray(hist.values), np.asarray(hist.counts)
    over = float(counts[values > cap].sum() / max(1, counts.sum()))
    if over > 0:
        median = float(hist.quantile(0.5))
        setup.warnings.append(
            f"{over:.0%} of the log's responses are longer than max_response_len {cap:,} (its "
            f"median: {median:,.0f} tokens): the simulation cuts them at {cap:,}, so this "
            f"advice is for a truncated workload, not the logged one; pass --set "
            f"max_response_len=N with the cap the log was generated under (its longest "
            f"response: {int(values.max()):,})")


def advise(sc: Any, limits: Limits, *, candidates: list[str] | None = None, seeds: int = 3,
           rounds: int = 2, grid: int | None = None, jobs: int | None = None,
           baseline: str = "sync", framework: str | None = None, log=None) -> Advice:
    """Tune every candidate under `limits` on `sc` and rank them against `baseline`."""
    from aprilsim.config import ScenarioError
    from aprilsim.policies.registry import REGISTRY
    from aprilsim.sweep.tune import Constraint

    names = candidates or list(CANDIDATES)
    unknown = [n for n in names if n not in CANDIDATES]
    if unknown:
        raise ScenarioError(f"--candidates: {', '.join(unknown)} not advised on; choose from "
                            f"{', '.join(CANDIDATES)} (or sync, always measured)")
    if baseline not in REGISTRY:
        raise ScenarioError(f"--baseline {baseline!r}: not a registered scheduler ("
                            f"{', '.join(REGISTRY)})")
    ref = _Reference(sc, baseline, seeds, jobs)
    # the baseline as it runs today (the scenario's knobs), checked against the limits too
    cons = [Constraint.parse(c) for c in limits.constraints()]
    today = ref.option(baseline, {}, sc, cons)
    today.baseline = True
    options = [today]
    if baseline != "sync":
        options.append(ref.option("sync", {}, sc))
    options += [_candidate(sc, name, limits, ref, seeds, rounds, grid, jobs, log)
                for name in names
                if name != "sync" and not (name == baseline and CANDIDATES[name] is None)]
    for o in options:
        got = launch(framework, o.scheduler)
        if got is not None:
            o.launch, o.launch_how = ("yes" if got.ok else "no"), got.how
    options.sort(key=lambda o: (bool(o.infeasible), -(o.gain if not math.isnan(o.gain) else -1e9)))
    advice = Advice(options, {}, [], limits, seeds, sc.steps, sc.warmup_steps, baseline,
                    framework)
    advice.scenario = _advised_scenario(sc, advice)
    return advice


def _candidate(sc: Any, name: str, limits: Limits, ref: _Reference, seeds: int, rounds: int,
               grid: int | None, jobs: int | None, log) -> Option:
    """One candidate tuned under the limits and measured on the fresh seeds (or why not)."""
    from aprilsim.sweep.tune import Constraint, Infeasible, Knob, tune

    cons = [Constraint.parse(c) for c in limits.constraints()]
    spec = CANDIDATES[name]
    if log:
        log(f"advise: {name} ...")
    if spec is None:
        return ref.option(name, {}, sc, cons)
    lo, hi = spec.lo, spec.hi
    if spec.per_batch:
        lo, hi = lo * sc.batch_size, hi * sc.batch_size
    if spec.knob == "eta" and limits.max_staleness is not None:
        hi = min(hi, limits.max_staleness)  # eta bounds its staleness: search what may pass
    knob = Knob((f"schedulers.{name}.{spec.knob}",), lo, hi, spec.integer)
    try:
        res = tune(sc, [knob], "samples_per_s", cons, scheduler=name, seeds=seeds,
                   rounds=rounds, grid=grid, jobs=jobs)
    except Infeasible as e:
        if not e.misses:
            return Option(name, infeasible=str(e))
        where = ("the search's closest setting" if e.misses[0]["seeds"] == "tuning" else
                 "the search's best setting, on fresh seeds (the limit sits inside the seed "
                 "noise: more --seeds may tell)")
        return Option(name, infeasible=explain(e.setting, e.misses, where), misses=e.misses)
    except ValueError as e:
        return Option(name, infeasible=str(e))
    return ref.option(name, dict(res.setting), sc)


def explain(setting: dict[str, Any], misses: list[dict[str, Any]], where: str) -> str:
    """Why an option is out, naming each constraint it missed and by how much: `max_staleness
    <= 1 missed by 1 (2 [2, 2] at ratio=1.25, tuning seeds)`, then `where` (which setting)."""
    at = ",".join(f"{k.rsplit('.', 1)[-1]}={_num(v)}" for k, v in setting.items())
    parts = []
    for m in misses:
        by = -float(m["margin_at_interval"])
        interval = ("" if math.isnan(m["lo"]) or m["lo"] == m["hi"]
                    else f" [{_fig(m['lo'])}, {_fig(m['hi'])}]")
        parts.append(f"{m['constraint']} missed by {_fig(by)} ({_fig(m['mean'])}{interval}"
                     f"{' at ' + at if at else ''}, {m['seeds']} seeds)")
    return f"{'; '.join(parts)}: {where}"


def _fig(x: float) -> str:
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}"


class _Reference:
    """The baseline's and sync's runs on the fresh seeds, once; each option is paired with them
    seed by seed (common random numbers)."""

    def __init__(self, sc: Any, baseline: str, seeds: int, jobs: int | None) -> None:
        from aprilsim.sweep.tune import FRESH_SEED_OFFSET

        self.fresh = [sc.seed + i + FRESH_SEED_OFFSET for i in range(seeds)]
        self.jobs, self.baseline = jobs, baseline
        self.base = _rows(sc, baseline, {}, self.fresh, jobs).set_index("seed")

    def option(self, name: str, setting: dict[str, Any], sc: Any,
               cons: list | None = None) -> Option:
        """`name` at `setting` on the fresh seeds: gains over the baseline (paired), its costs,
        and with `cons` the limits checked there (a candidate with nothing to tune)."""
        from aprilsim.sweep.stats import t_interval
        from aprilsim.sweep.tune import _misses

        df = _rows(sc, name, setting, self.fresh, self.jobs)
        base = self.base.loc[df["seed"]]
        ratio = df["samples_per_s"].to_numpy(dtype=float) / base["samples_per_s"].to_numpy(float)
        mean, _, lo, hi = t_interval(ratio)
        tok = df["rollout_throughput_tok_s"].to_numpy(float) / base[
            "rollout_throughput_tok_s"].to_numpy(float)
        sync = df["samples_per_s"].to_numpy(float) - df["samples_per_s_vs_sync"].to_numpy(float)
        opt = Option(name, setting, mean, lo, hi, float(tok.mean()),
                     float(df["offpolicy_token_fraction"].mean()),
                     float(df["max_staleness"].max()), float(df["length_bias_vs_sync"].mean()),
                     float((df["samples_per_s"].to_numpy(float) / sync).mean()))
        misses = _misses(cons or [], df, True, "fresh")
        if misses:
            opt.misses = misses
            opt.infeasible = explain({}, misses, "as it runs today" if name == self.baseline
                                     and not setting else "nothing to tune")
        return opt


def _rows(sc: Any, name: str, overrides: dict[str, Any], fresh: list[int], jobs: int | None):
    """`name` (and sync, for the metrics paired with it) on the fresh seeds: one row per seed."""
    from aprilsim.sweep.api import run_plan, to_frame
    from aprilsim.sweep.plan import Plan, Point
    from aprilsim.sweep.tune import with_paired

    names = [name] if name == "sync" else [name, "sync"]
    base = Plan.build(sc, [], names, fresh)
    point = Point(tuple(overrides.items()))
    plan = Plan(base.base, base.base_dir, [], names, fresh, [point])
    plan.check_points([point])
    rows, _ = run_plan(plan, jobs=jobs)
    return with_paired(to_frame(rows, [], plan), name, ["sync"])


def _advised_scenario(sc: Any, advice: Advice) -> dict[str, Any]:
    """The scenario to rerun the comparison: the winner's knob set, compare = [baseline,
    winner] (the winner's knob is left out when it would change the baseline's too)."""
    from aprilsim.sweep.keys import apply, scenario_dict

    data = scenario_dict(sc)
    win = advice.winner
    if win is None or win.scheduler == advice.baseline and not win.setting:
        data["compare"] = [advice.baseline]
        return data
    if win.scheduler != advice.baseline:
        data = apply(data, list(win.setting.items()))
    data["compare"] = [advice.baseline, win.scheduler]
    data["name"] = f"{sc.name}-advised"
    return data
