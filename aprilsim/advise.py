"""`aprilsim advise`: from a user's own material to a ranked recommendation, in one call.

It composes what exists, in order: the launch config imported (`aprilsim.interop`: a slime script
or a verl config; else a scenario file or the default), the response lengths fitted from a
generation log (`aprilsim.workload.fitting.fit_log`, written as a length model the scenario reads),
the engine cost from a calibration file (`[cluster] preset = FILE`) or the preset the import
picked, then each candidate scheduler tuned under the user's limits (`aprilsim.sweep.tune`:
paired seeds, constraints held over the whole 95 % interval, figures from fresh seeds). Options
are ranked by their gain in trained samples per second over sync on those fresh seeds (end to
end: training and weight sync included, discarded tokens not counted as progress); a candidate no setting of which meets the
limits is listed as infeasible with the reason. See docs/advise.md.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["CANDIDATES", "Advice", "Limits", "Option", "advise"]

# candidate -> (knob key, lo, hi, integer) searched by `tune`, or None: nothing to tune
CANDIDATES: dict[str, tuple[str, float, float, bool] | None] = {
    "april": ("schedulers.april.ratio", 1.25, 2.5, False),
    "async_one_step": None,
    "fully_async": ("schedulers.fully_async.eta", 0, 4, True),
    "tail_batching": ("schedulers.tail_batching.prompt_ratio", 1.0, 2.0, False),
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
    gain: float = math.nan  # trained samples/s / sync's, mean over the fresh seeds
    gain_lo: float = math.nan
    gain_hi: float = math.nan
    tok_gain: float = math.nan  # rollout tok/s / sync's (counts discarded tokens too)
    offpolicy: float = math.nan
    staleness: float = math.nan
    length_bias_vs_sync: float = math.nan
    infeasible: str = ""  # why no setting meets the limits ("" when feasible)
    mode: str = "colocated"  # disaggregated: the trainer runs on GPUs of its own besides

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
    scenario: dict[str, Any]  # the advised scenario: compare = [sync, winner], its knob set
    sources: list[str]  # what was read, one line each
    limits: Limits
    seeds: int
    steps: int
    warmup: int

    @property
    def winner(self) -> Option | None:
        return self.options[0] if self.options and not self.options[0].infeasible else None

    def to_dict(self) -> dict[str, Any]:
        return {"options": [{**asdict(o), "label": o.label} for o in self.options],
                "winner": self.winner.label if self.winner else None, "sources": self.sources,
                "limits": asdict(self.limits), "seeds": self.seeds, "steps": self.steps,
                "warmup": self.warmup, "scenario": self.scenario}


def _num(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def build_scenario(*, scenario: Path | None = None, slime: str | None = None,
                   verl: Path | None = None, log: Path | None = None,
                   calibration: Path | None = None, sets: tuple[str, ...] = (),
                   out_dir: Path, log_column: str | None = None) -> tuple[Any, list[str]]:
    """The scenario to advise on (validated) and a line per source read. Raises ValueError or
    ScenarioError (one line) on bad input."""
    from aprilsim.config import load_scenario, scenario_from_dict
    from aprilsim.simulate_cli import apply_sets
    from aprilsim.sweep.keys import scenario_dict

    if sum(x is not None for x in (scenario, slime, verl)) > 1:
        raise ValueError("give at most one of SCENARIO, --slime, --verl")
    sources: list[str] = []
    base_dir = str(out_dir.resolve())
    if slime is not None or verl is not None:
        from aprilsim import interop

        if slime is not None:
            from aprilsim.interop.slime import read_source

            res = interop.from_slime(read_source(slime))
            origin = slime if len(slime) < 60 else slime[:57] + "..."
            sources.append(f"launch config: slime {origin}")
        else:
            res = interop.from_verl(verl.read_text())
            sources.append(f"launch config: verl {verl}")
        data = res.data
        sources += [f"  import note: {n}" for n in res.notes
                    if log is None or not n.startswith("lengths:")]  # the log's fit replaces it
    else:
        sc0 = load_scenario(scenario)
        data = scenario_dict(sc0)
        base_dir = sc0.base_dir
        sources.append(f"scenario: {scenario or 'the default (APRIL paper)'}")
    if log is not None:
        from aprilsim.workload.fitting.api import fit_log

        report = fit_log(log, column=log_column, max_len=int(data.get("max_response_len", 16384)),
                         n_bootstrap=0)
        model = out_dir / "lengths.toml"
        report.write_model(model)
        data["lengths"] = {"from": str(model.resolve())}
        f = report.fitter
        sources.append(f"lengths: fitted from {log} ({f.best_.family}, {f.n_samples_:,} responses)"
                       f" -> {model}")
    if calibration is not None:
        data.setdefault("cluster", {})["preset"] = str(calibration.resolve())
        sources.append(f"engine cost: calibration {calibration}")
    else:
        preset = data.get("cluster", {}).get("preset", "the default")
        sources.append(f"engine cost: preset {preset}")
    sc = apply_sets(scenario_from_dict(data, base_dir), sets)
    return sc, sources


def advise(sc: Any, limits: Limits, *, candidates: list[str] | None = None, seeds: int = 3,
           rounds: int = 2, grid: int | None = None, jobs: int | None = None,
           log=None) -> Advice:
    """Tune every candidate under `limits` on `sc` and rank them (module docstring)."""
    from aprilsim.config import ScenarioError
    from aprilsim.sweep.keys import apply, scenario_dict
    from aprilsim.sweep.tune import Constraint, Knob, tune

    names = candidates or list(CANDIDATES)
    unknown = [n for n in names if n not in CANDIDATES]
    if unknown:
        raise ScenarioError(f"--candidates: {', '.join(unknown)} not advised on; choose from "
                            f"{', '.join(CANDIDATES)}")
    cons = [Constraint.parse(c) for c in limits.constraints()]
    options: list[Option] = []
    for name in names:
        spec = CANDIDATES[name]
        if log:
            log(f"advise: {name} ...")
        if spec is None:
            options.append(_fresh(sc, name, {}, seeds, jobs, cons))
            continue
        key, lo, hi, integer = spec
        if name == "fully_async" and limits.max_staleness is not None:
            hi = min(hi, limits.max_staleness)  # eta bounds its staleness: search what may pass
        knob = Knob((key,), lo, hi, integer)
        try:
            res = tune(sc, [knob], "samples_per_s", cons, scheduler=name, seeds=seeds,
                       rounds=rounds, grid=grid, jobs=jobs)
        except ValueError as e:
            options.append(Option(name, infeasible=str(e)))
            continue
        options.append(_fresh(sc, name, dict(res.setting), seeds, jobs))
    options.append(Option("sync", {}, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0))  # the baseline
    options.sort(key=lambda o: (bool(o.infeasible), -(o.gain if not math.isnan(o.gain) else -1e9)))
    data = scenario_dict(sc)
    best = options[0] if options and not options[0].infeasible else None
    if best is not None:
        data = apply(data, list(best.setting.items()))
        data["compare"] = ["sync", best.scheduler]
        data["name"] = f"{sc.name}-advised"
    return Advice(options, data, [], limits, seeds, sc.steps, sc.warmup_steps)


def _fresh_rows(sc: Any, name: str, overrides: dict[str, Any], seeds: int, jobs: int | None):
    """`name` and sync on the fresh seeds tune checks on, paired: one row per seed."""
    from aprilsim.sweep.api import run_plan, to_frame
    from aprilsim.sweep.plan import Plan, Point
    from aprilsim.sweep.tune import FRESH_SEED_OFFSET, with_paired

    fresh = [sc.seed + i + FRESH_SEED_OFFSET for i in range(seeds)]
    base = Plan.build(sc, [], [name, "sync"], fresh)
    point = Point(tuple(overrides.items()))
    plan = Plan(base.base, base.base_dir, [], [name, "sync"], fresh, [point])
    plan.check_points([point])
    rows, _ = run_plan(plan, jobs=jobs)
    return with_paired(to_frame(rows, [], plan), name, ["sync"])


def _fresh(sc, name: str, setting: dict[str, Any], seeds: int, jobs: int | None,
           cons: list | None = None) -> Option:
    """The option's figures on the fresh seeds: gains over sync (paired) and costs; with `cons`,
    the limits checked there too (a candidate with nothing to tune is checked only here)."""
    from aprilsim.sweep.stats import t_interval

    df = _fresh_rows(sc, name, setting, seeds, jobs)
    sync = df["samples_per_s"].to_numpy(dtype=float) - df["samples_per_s_vs_sync"].to_numpy(dtype=float)
    mean, _, lo, hi = t_interval(df["samples_per_s"].to_numpy(dtype=float) / sync)
    opt = Option(name, setting, mean, lo, hi, float(df["gain_vs_sync"].mean()),
                 float(df["offpolicy_token_fraction"].mean()), float(df["max_staleness"].max()),
                 float(df["length_bias_vs_sync"].mean()))
    missed = [str(c) for c in cons or []
              if c.margin(df[c.metric].to_numpy(dtype=float), True)[0] < 0]
    if missed:
        opt.infeasible = f"misses {', '.join(missed)} (nothing to tune)"
    return opt


def try_lines(advice: Advice, scenario_file: Path, out_dir: Path) -> list[str]:
    """How to try the winner: the `aprilsim validate` command, slime flags, verl keys."""
    win = advice.winner
    if win is None:
        return ["no option meets the limits: loosen them (--max-offpolicy, --max-staleness, "
                "--max-length-bias) or advise on more --candidates"]
    if win.scheduler == "sync":
        lines = ["no scheduler beats sync under the limits (loosen them to see what would):"]
        pick = "-s sync"
    else:
        lines = ["try the winner:"]
        pick = f"-s sync -s {win.label}"
    lines += [f"  aprilsim validate {scenario_file} --local 2 {pick} --out {out_dir / 'validate'}",
             "    (bundled CPU engines, lengths scaled down; --engines URL,... for your own)"]
    from aprilsim.config import load_scenario
    from aprilsim.interop import to_slime

    try:
        argv, notes = to_slime(load_scenario(scenario_file), win.scheduler)
        lines.append("  slime: " + " ".join(argv))
        lines += [f"    note: {n}" for n in notes]
    except ValueError as e:
        lines.append(f"  slime: {e}")
    lines.append("  verl: " + VERL_HINTS.get(win.scheduler, "no verl counterpart; use slime"))
    return lines


VERL_HINTS = {
    # sync is verl's own default (the PPO trainer generates the batch, then trains): no recipe
    "sync": "the default trainer (verl.trainer.main_ppo): a synchronous rollout, nothing to change",
    "fully_async": "the fully-async recipe (recipe/fully_async_policy), async_training.partial_rollout"
                   "=True; staleness bounded by eta policy versions",
    "async_one_step": "the one-step-off-policy recipe (recipe/one_step_off_policy)",
    "april": "verl has no APRIL-style partial rollout: use the slime flags",
    "tail_batching": "no verl counterpart (RollPacker's tail batching): use the slime flags",
}


def format_options(advice: Advice) -> list[str]:
    """The ranked table: gain over sync [95 % CI] on fresh seeds, and the costs."""
    heads = ["rank", "option", "samples/s vs sync [95% CI]", "tok/s vs sync", "off-policy",
             "staleness", "len bias vs sync", "GPUs"]
    cells = []
    rank = 0
    for o in advice.options:
        if o.infeasible:
            cells.append(["-", o.scheduler, f"infeasible: {o.infeasible}", "", "", "", "", ""])
            continue
        rank += 1
        if o.scheduler == "sync":
            ci = "1.00x (the baseline)"
        elif math.isnan(o.gain_lo):
            ci = f"{o.gain:.2f}x"
        else:
            ci = f"{o.gain:.2f}x [{o.gain_lo:.2f}, {o.gain_hi:.2f}]"
        cells.append([str(rank), o.label, ci, f"{o.tok_gain:.2f}x", f"{o.offpolicy:.0%}",
                      f"{o.staleness:.0f}", f"{o.length_bias_vs_sync:+.1%}",
                      "+ trainer's" if o.mode == "disaggregated" else "the same"])
    widths = [max(len(h), *(len(c[i]) for c in cells if not c[2].startswith("infeasible")))
              if any(not c[2].startswith("infeasible") for c in cells) else len(h)
              for i, h in enumerate(heads)]

    def row(xs: list[str]) -> str:
        if xs[2].startswith("infeasible"):
            return f"{xs[0].ljust(widths[0])}  {xs[1].ljust(widths[1])}  {xs[2]}"
        return "  ".join(x.ljust(w) if i < 2 else x.rjust(w)
                         for i, (x, w) in enumerate(zip(xs, widths)))

    out = [row(heads), "  ".join("-" * w for w in widths), *map(row, cells)]
    if any(o.mode == "disaggregated" and not o.infeasible for o in advice.options):
        out.append("GPUs \"+ trainer's\": a disaggregated scheduler trains on GPUs of its own besides "
                   "the rollout GPUs sync shares with training: its samples/s gain buys hardware too")
    return out
