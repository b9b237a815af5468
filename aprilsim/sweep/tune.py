"""`aprilsim tune`: the best knob setting under constraints, robust to seed noise.

Method: successive grid refinement on paired seeds, then a check on fresh seeds.

1. Lay a grid over the knob box (7 values for one knob, 4 per knob for two, 3 for more) and
   simulate every grid point on the same seeds. Common random numbers give every point the same
   groups on a seed, so the differences between points are differences of scheduling, not of
   luck, and a few seeds rank them reliably.
2. A point is feasible when each constraint holds for its whole 95 % interval across seeds (the
   upper end for `<=`, the lower end for `>=`, both ends for `|m| <=`): a point that only meets a
   constraint by luck of the seeds is not taken.
3. The feasible point with the best mean objective becomes the centre of a box one grid step wide
   on each side, which is gridded again (points already simulated are reused); repeat `rounds`
   times.
4. The winner is simulated on as many fresh seeds (never used for selection), and its objective,
   interval and constraint margins are reported from those: the selection's winner's curse does
   not leak into the figures. If the mean of a constraint misses on the fresh seeds, the next best
   feasible point is checked instead.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from aprilsim.config import Scenario, ScenarioError
from aprilsim.sweep.keys import apply, linspace
from aprilsim.sweep.plan import Plan, Point
from aprilsim.sweep.stats import t_interval
from aprilsim.sweep.worker import UNTRAINED

FRESH_SEED_OFFSET = 100_000
MIN_SEEDS = 3  # a t interval with 1 degree of freedom is 12.7 standard errors wide
PAIRED = "_vs_"  # `length_bias_vs_sync`: the metric minus sync's on the same seed


def with_paired(df, name: str, others: list[str]):
    """Rows of scheduler `name`, with METRIC_vs_OTHER = METRIC - OTHER's METRIC on the same seed
    and point (and `gain_vs_OTHER` = rollout throughput / OTHER's), for constraints that must
    not count what the baseline has too (e.g. a batch's length bias from sampling alone)."""
    from aprilsim.sweep.stats import metric_columns

    own = df[df["scheduler"] == name].reset_index(drop=True)
    metrics = metric_columns(df, [])
    for other in others:
        ref = df[df["scheduler"] == other].set_index(["point_id", "seed"])
        idx = list(zip(own["point_id"], own["seed"]))
        for m in metrics:
            own[f"{m}{PAIRED}{other}"] = (own[m].to_numpy(dtype=float)
                                          - ref.loc[idx, m].to_numpy(dtype=float))
        base_t = ref.loc[idx, "rollout_throughput_tok_s"].to_numpy(dtype=float)
        own[f"gain{PAIRED}{other}"] = own["rollout_throughput_tok_s"].to_numpy(dtype=float) / base_t
    return own


@dataclass(frozen=True)
class Knob:
    keys: tuple[str, ...]  # linked keys take the same value
    lo: float
    hi: float
    integer: bool = False

    @property
    def name(self) -> str:
        return "+".join(self.keys)


@dataclass(frozen=True)
class Constraint:
    """`metric <= bound`, `metric >= bound`, or `|metric| <= bound` on the mean across seeds."""

    metric: str
    op: str
    bound: float
    absolute: bool = False

    _RE = re.compile(r"^\s*(\|?)\s*(abs\()?\s*([A-Za-z_][\w.]*)\s*\)?\s*(\|?)\s*"
                     r"(<=|>=)\s*(\S+)\s*$")

    @classmethod
    def parse(cls, text: str) -> Constraint:
        m = cls._RE.match(text)
        if not m:
            raise ScenarioError(f"--subject-to {text!r}: expected METRIC<=X, METRIC>=X or "
                                "|METRIC|<=X")
        bar1, abs_fn, metric, bar2, op, bound = m.groups()
        absolute = bool(abs_fn) or (bar1 == bar2 == "|")
        if bool(bar1) != bool(bar2):
            raise ScenarioError(f"--subject-to {text!r}: unbalanced |")
        try:
            pct = bound.endswith("%")
            value = float(bound[:-1] if pct else bound) / (100 if pct else 1)
        except ValueError:
            raise ScenarioError(f"--subject-to {text!r}: {bound!r} is not a number") from None
        if absolute and op != "<=":
            raise ScenarioError(f"--subject-to {text!r}: |METRIC| takes <= only")
        return cls(metric, op, value, absolute)

    def __str__(self) -> str:
        m = f"|{self.metric}|" if self.absolute else self.metric
        return f"{m} {self.op} {self.bound:g}"

    def margin(self, values: np.ndarray, conservative: bool) -> tuple[float, float, float, float]:
        """(margin, mean, lo, hi): margin >= 0 means satisfied; conservative uses the interval."""
        mean, _, lo, hi = t_interval(values)
        if not conservative or math.isnan(lo):
            lo = hi = mean
        if self.absolute:
            return self.bound - max(abs(lo), abs(hi), abs(mean)), mean, lo, hi
        if self.op == "<=":
            return self.bound - hi, mean, lo, hi
        return lo - self.bound, mean, lo, hi


class Infeasible(ValueError):
    """No setting meets the constraints: `setting` is the closest one tried and `misses` what it
    misses there, one dict per failed constraint (constraint, mean, lo, hi, margin_at_interval
    < 0, seeds: "tuning" or "fresh")."""

    def __init__(self, message: str, setting: dict[str, Any],
                 misses: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.setting, self.misses = setting, misses


def _misses(constraints: list[Constraint], rows: Any, conservative: bool,
            seeds: str) -> list[dict[str, Any]]:
    """The constraints `rows` (one setting's runs) fail, each with its figures."""
    out = []
    for con in constraints:
        margin, mean, lo, hi = con.margin(rows[con.metric].to_numpy(dtype=float), conservative)
        if margin < 0:
            out.append({"constraint": str(con), "metric": con.metric, "bound": con.bound,
                        "mean": mean, "lo": lo, "hi": hi, "margin_at_interval": margin,
                        "seeds": seeds})
    return out


@dataclass
class Candidate:
    values: dict[str, Any]  # knob name -> value
    point: Point
    rows: Any = None  # DataFrame of its runs on the tuning seeds

    @property
    def infeasible(self) -> str | None:
        """Why the setting cannot be a result whatever the constraints (a run trained nothing)."""
        return _untrained(self.rows)

    def objective(self, metric: str) -> float:
        return float(np.mean(self.rows[metric].to_numpy(dtype=float)))


@dataclass
class TuneResult:
    """The chosen setting, its figures on fresh seeds, and how the search went."""

    scheduler: str
    setting: dict[str, Any]
    objective: str
    mean: float
    lo: float
    hi: float
    constraints: list[dict[str, Any]]
    scenario: dict[str, Any]
    evaluated: int
    runs: int
    seeds: list[int]
    fresh_seeds: list[int]
    history: list[dict[str, Any]] = field(default_factory=list)
    infeasible: list[dict[str, Any]] = field(default_factory=list)  # {setting, reason}
    binding: list[dict[str, Any]] = field(default_factory=list)  # constraints that cost objective
    edges: dict[str, str] = field(default_factory=dict)  # knob -> "low"/"high": range's end

    def scenario_toml(self, header: str = "") -> str:
        from aprilsim.interop.toml_out import dumps

        return dumps(self.scenario, header)


GROUP_RATIOS = {f"schedulers.{s}.ratio" for s in ("april", "april_ds", "slime_dapo")}


def grid_values(knob: Knob, lo: float, hi: float, n: int, batch: int | None = None) -> list[Any]:
    """The grid of one knob; an over-sampling ratio only at whole numbers of groups (k / N),
    so every value tried is one slime's --over-sampling-batch-size can launch."""
    if knob.integer:
        return linspace(math.floor(lo), math.ceil(hi), n, integer=True)
    values = linspace(lo, hi, n)
    if batch and any(k in GROUP_RATIOS for k in knob.keys):
        snapped = {math.ceil(v * batch - 1e-9) / batch for v in values}
        values = sorted(v for v in snapped if knob.lo - 1e-12 <= v <= knob.hi + 1e-12) or [
            max(knob.lo, math.floor(hi * batch + 1e-9) / batch)]
    return values


def tune(
    scenario: Scenario,
    knobs: list[Knob],
    maximize: str,
    constraints: list[Constraint] | None = None,
    *,
    scheduler: str | None = None,
    seeds: int = 4,
    rounds: int = 3,
    grid: int | None = None,
    jobs: int | None = None,
    ray: str | bool | None = None,
    log=None,
) -> TuneResult:
    """Maximise mean `maximize` of `scheduler` over the knob box subject to `constraints`.

    Raises ValueError when no grid point satisfies the constraints (the message names the
    closest one), or when `scheduler` reads none of the knobs (every setting the same run).
    The result names the constraints that bind and the knobs whose answer is the edge of the
    range searched. See the module docstring for the method.
    """
    constraints = list(constraints or [])
    if not knobs:
        raise ScenarioError("tune needs at least one --knob")
    if seeds < MIN_SEEDS:
        raise ScenarioError(f"--seeds {seeds}: tune needs at least {MIN_SEEDS} seeds (with 2, the "
                            "95 % t interval has 1 degree of freedom and its width decides alone)")
    name = scheduler or _default_scheduler(scenario, knobs)
    check_reads(name, knobs)
    search = _Search(scenario, knobs, maximize, constraints, name, seeds, jobs, ray, log)
    best = search.refine(grid or {1: 7, 2: 4}.get(len(knobs), 3), rounds)
    if best is None:
        raise search.nothing_feasible()
    chosen, fdf = search.fresh_check()
    mean, _, lo, hi = t_interval(fdf[maximize].to_numpy(dtype=float))
    cons = []
    for con in constraints:
        margin, cmean, clo, chi = con.margin(fdf[con.metric].to_numpy(dtype=float), True)
        cons.append({"constraint": str(con), "mean": cmean, "lo": clo, "hi": chi,
                     "margin": con.bound - abs(cmean) if con.absolute else
                     (con.bound - cmean if con.op == "<=" else cmean - con.bound),
                     "margin_at_interval": margin})
    tuned = apply(search.base.base, chosen.point.overrides)
    return TuneResult(name, chosen.values, maximize, mean, lo, hi, cons, tuned,
                      len(search.cands), search.total_runs, search.tune_seeds, search.fresh_seeds,
                      search.history, search.infeasible, binding=search.binding(chosen),
                      edges=search.edges(chosen))


def check_reads(name: str, knobs: list[Knob]) -> None:
    """ScenarioError when scheduler spec `name` reads none of `knobs` (sync and
    `schedulers.april.ratio`), or sets one itself (`april@ratio=2` overrides the tuned value):
    every setting would be the same run, and the "best" one an accident of the grid."""
    from aprilsim.scheduler_spec import SchedulerSpec
    from aprilsim.sweep.keys import scheduler_reads

    spec = SchedulerSpec.parse(name)
    keys = [key for k in knobs for key in k.keys]
    fixed = [key for key in keys if key.split(".")[:2] == ["schedulers", spec.name]
             and key.split(".")[-1] in spec.knobs]
    if fixed:
        raise ScenarioError(f"-s {name} sets {fixed[0].split('.')[-1]} itself, so --knob "
                            f"{fixed[0]} changes nothing; tune -s {spec.name}")
    if not any(scheduler_reads(spec.name, key) for key in keys):
        raise ScenarioError(
            f"{spec.name} does not read {', '.join(keys)}: every setting would be the same run; "
            f"tune a knob it reads (`aprilsim schedulers {spec.name}`), or -s the scheduler "
            "whose table the knob is in")


class _Search:
    """The rounds of grid refinement on the tuning seeds, and the check on fresh ones."""

    def __init__(self, scenario: Scenario, knobs: list[Knob], maximize: str,
                 constraints: list[Constraint], name: str, seeds: int, jobs, ray, log) -> None:
        self.scenario, self.knobs, self.maximize = scenario, knobs, maximize
        self.constraints, self.name, self.jobs, self.ray, self.log = (
            constraints, name, jobs, ray, log)
        self.tune_seeds = [scenario.seed + i for i in range(seeds)]
        self.fresh_seeds = [s + FRESH_SEED_OFFSET for s in self.tune_seeds]
        self.base = Plan.build(scenario, [], [name], self.tune_seeds)
        self.cands: dict[str, Candidate] = {}
        self.total_runs = 0
        self.history: list[dict[str, Any]] = []
        self.infeasible: list[dict[str, Any]] = []
        wanted = [maximize, *(c.metric for c in constraints)]
        self.paired = sorted({m.rsplit(PAIRED, 1)[1] for m in wanted if PAIRED in m} - {name})

    def measure(self, points: list[Point], seed_list: list[int]):
        """The runs of `points` on `seed_list` (with the paired baselines' columns)."""
        from aprilsim.sweep.api import run_plan, to_frame

        plan = Plan(self.base.base, self.base.base_dir, [], [self.name, *self.paired], seed_list,
                    points)
        plan.check_points(points)
        rows, stats = run_plan(plan, jobs=self.jobs, ray=self.ray, untrained_ok=True)
        self.total_runs += stats["simulated"]
        return with_paired(to_frame(rows, [], plan), self.name, self.paired)

    def check_metric(self, df) -> None:
        if UNTRAINED in df.columns:
            df = df[df[UNTRAINED].isna()]
        if df.empty:  # every run trained nothing: no metric to check yet
            return
        for m in [self.maximize, *(c.metric for c in self.constraints)]:
            if m not in df.columns:
                raise ScenarioError(f"{m}: not a metric; known: {', '.join(sorted(_metrics(df)))}")

    def _round(self, box: list[tuple[float, float]], n: int) -> list[list[Any]]:
        """Grid `box`, simulate the settings not seen yet; the grid's axes."""
        axes = [grid_values(k, lo, hi, n, self.scenario.batch_size)
                for k, (lo, hi) in zip(self.knobs, box)]
        new = []
        for combo in itertools.product(*axes):
            values = {k.name: v for k, v in zip(self.knobs, combo)}
            point = Point(tuple((key, v) for k, v in zip(self.knobs, combo) for key in k.keys))
            if point.id not in self.cands:
                self.cands[point.id] = Candidate(values, point)
                new.append(self.cands[point.id])
        if new:
            df = self.measure([c.point for c in new], self.tune_seeds)
            self.check_metric(df)
            for c in new:
                c.rows = df[df["point_id"] == c.point.id]
                if c.infeasible and self.log:
                    self.log(f"{_fmt_setting(c.values)}: infeasible, {c.infeasible}")
        return axes

    def refine(self, n: int, rounds: int) -> Candidate | None:
        """`rounds` of grid refinement around the best feasible setting (None: none feasible)."""
        box = [(k.lo, k.hi) for k in self.knobs]
        best: Candidate | None = None
        for r in range(rounds):
            axes = self._round(box, n)
            feasible = [c for c in self.cands.values() if _feasible(c, self.constraints)]
            if not feasible:
                break
            best = max(feasible, key=lambda c: c.objective(self.maximize))
            obj = best.objective(self.maximize)
            self.history.append({"round": r, "grid": [list(a) for a in axes], "best": best.values,
                                 "objective": obj, "feasible": len(feasible),
                                 "evaluated": len(self.cands)})
            if self.log:
                self.log(f"round {r + 1}: {len(self.cands)} settings, {len(feasible)} feasible, "
                         f"best {_fmt_setting(best.values)} -> {self.maximize} {obj:,.4g}")
            box = [_narrowed(k, lo, hi, n, best.values[k.name])
                   for k, (lo, hi) in zip(self.knobs, box)]
        return best

    def nothing_feasible(self) -> ValueError:
        """Why no setting is a result: none trains, or the closest one to the constraints (an
        `Infeasible` with what it misses)."""
        ran = [c for c in self.cands.values() if not c.infeasible]
        if not ran:
            first = next(iter(self.cands.values()))
            return ValueError(f"no setting in the knob box trains any sample (e.g. "
                              f"{_fmt_setting(first.values)}: {first.infeasible})")
        closest = max(ran, key=lambda c: min(
            (con.margin(c.rows[con.metric].to_numpy(dtype=float), True)[0]
             for con in self.constraints), default=0.0))
        return Infeasible(f"no setting in the knob box satisfies "
                          f"{', '.join(map(str, self.constraints))} (closest: "
                          f"{_fmt_setting(closest.values)})", closest.values,
                          _misses(self.constraints, closest.rows, True, "tuning"))

    def fresh_check(self):
        """(the chosen candidate, its runs on the fresh seeds): the best of the top three whose
        constraints' means hold there."""
        self.infeasible = [{"setting": c.values, "reason": c.infeasible}
                           for c in self.cands.values() if c.infeasible]
        ranked = sorted((c for c in self.cands.values() if _feasible(c, self.constraints)),
                        key=lambda c: -c.objective(self.maximize))
        missed: tuple[dict[str, Any], list[dict[str, Any]]] | None = None
        for c in ranked[:3]:
            fdf = self.measure([c.point], self.fresh_seeds)
            if _untrained(fdf):
                if self.log:
                    self.log(f"{_fmt_setting(c.values)} trains nothing on a fresh seed; trying "
                             "the next")
                self.infeasible.append({"setting": c.values, "reason": _untrained(fdf)})
                continue
            if all(con.margin(fdf[con.metric].to_numpy(dtype=float), False)[0] >= 0
                   for con in self.constraints):
                return c, fdf
            if missed is None:
                missed = (c.values, _misses(self.constraints, fdf, False, "fresh"))
            if self.log:
                self.log(f"{_fmt_setting(c.values)} misses a constraint on fresh seeds; trying "
                         "the next")
        setting, misses = missed or ({}, [])
        raise Infeasible("the best settings miss their constraints on fresh seeds: the "
                         "constraints sit inside the seed noise; use more --seeds", setting,
                         misses)

    def binding(self, chosen: Candidate) -> list[dict[str, Any]]:
        """The constraints that rule out settings with a better objective than `chosen` (on the
        tuning seeds): each with how many it rules out and the best of them."""
        target = chosen.objective(self.maximize)
        better = [c for c in self.cands.values() if not c.infeasible
                  and c.objective(self.maximize) > target]
        out = []
        for con in self.constraints:
            ruled = [c for c in better
                     if con.margin(c.rows[con.metric].to_numpy(dtype=float), True)[0] < 0]
            if ruled:
                top = max(ruled, key=lambda c: c.objective(self.maximize))
                out.append({"constraint": str(con), "rules_out": len(ruled),
                            "best_ruled_out": top.values,
                            "best_ruled_out_objective": top.objective(self.maximize)})
        return out

    def edges(self, chosen: Candidate) -> dict[str, str]:
        """Knob name -> "low"/"high" where `chosen` is the end of the range searched."""
        out = {}
        for k in self.knobs:
            tried = [c.values[k.name] for c in self.cands.values()]
            v = chosen.values[k.name]
            if len(set(tried)) > 1 and v <= min(tried):
                out[k.name] = "low"
            elif len(set(tried)) > 1 and v >= max(tried):
                out[k.name] = "high"
        return out


def tune_notes(res: TuneResult, knobs: list[Knob]) -> tuple[list[str], bool]:
    """(notes, worth a live run): the constraints that bind, the knobs whose answer is the end
    of the range searched, and whether the answer turns the scheduler's mechanism off (APRIL at
    ratio 1 over-provisions nothing and runs as sync: no live run checks anything new)."""
    notes = []
    for b in res.binding:
        notes.append(f"{b['constraint']} binds: it rules out {b['rules_out']} setting(s) with a "
                     f"higher {res.objective} (the best of them: "
                     f"{_fmt_setting(b['best_ruled_out'])}, "
                     f"{_fmt_number(b['best_ruled_out_objective'])})")
    off = False
    for k in knobs:
        end = res.edges.get(k.name)
        v = res.setting[k.name]
        if end is None:
            continue
        if end == "low" and set(k.keys) & GROUP_RATIOS and v <= 1:
            off = True
            notes.append(f"{k.name} = {v:g} over-provisions nothing: {res.scheduler} then runs as "
                         "sync does (its mechanism off); the answer is the edge of the range, "
                         "set there by " + (", ".join(b["constraint"] for b in res.binding)
                                            or "the objective"))
        else:
            notes.append(f"{k.name} = {v:g} is the {end} end of the range searched "
                         f"({k.lo:g}:{k.hi:g}): the best may lie beyond it; widen --knob")
    return notes, not off


def _narrowed(k: Knob, lo: float, hi: float, n: int, centre: float) -> tuple[float, float]:
    """The next round's range of knob `k`: one grid step either side of `centre`."""
    step = (hi - lo) / max(1, n - 1)
    if k.integer:
        step = max(1.0, math.ceil(step))
    return max(k.lo, centre - step), min(k.hi, centre + step)


def _untrained(rows) -> str | None:
    """The reason of the first run in `rows` that trained nothing (None: every run trained)."""
    if rows is None or UNTRAINED not in rows.columns:
        return None
    bad = rows[UNTRAINED].dropna()
    return str(bad.iloc[0]) if len(bad) else None


def _feasible(c: Candidate, constraints: list[Constraint]) -> bool:
    if c.infeasible:
        return False
    return all(con.margin(c.rows[con.metric].to_numpy(dtype=float), True)[0] >= 0
               for con in constraints)


def _metrics(df) -> list[str]:
    from aprilsim.sweep.stats import metric_columns

    return metric_columns(df, [])


def _fmt_number(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.4g}"


def _fmt_setting(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in values.items())


def _default_scheduler(sc: Scenario, knobs: list[Knob]) -> str:
    """The scheduler whose table a knob sets, else the first non-sync of `compare`."""
    for k in knobs:
        for key in k.keys:
            parts = key.split(".")
            if parts[0] == "schedulers" and len(parts) > 2:
                return parts[1]
    rest = [s for s in sc.compare if s != "sync"]
    return rest[0] if rest else sc.compare[0]


def relocate_paths(data: dict[str, Any], base_dir: str, out_dir: Path) -> dict[str, Any]:
    """Make a `lengths.from` path valid from the directory the tuned file is written to."""
    import os

    lengths = data.get("lengths", {})
    if isinstance(lengths, dict) and "from" in lengths:
        p = Path(lengths["from"])
        if not p.is_absolute():
            p = (Path(base_dir) / p).resolve()
        try:
            rel = os.path.relpath(p, out_dir.resolve())
        except ValueError:
            rel = str(p)
        data = {**data, "lengths": {"from": rel}}
    return data
