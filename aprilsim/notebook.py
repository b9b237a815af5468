"""The notebook API: `aprilsim.simulate(scenario, schedulers=[...], seeds=...)` in one call.

It runs every scheduler on every seed (common random numbers: the same groups for the same seed),
keeps each `RunResult`, and gives the summaries as a table: `.rows()` (list of dicts, no extra
dependency) or `.to_frame()` (a pandas DataFrame; pandas comes with the `sweep` extra), and paired
differences against a baseline with `.paired(metric)`.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from aprilsim.config import Scenario, as_scenario, with_overrides
from aprilsim.metrics.records import RunResult
from aprilsim.policies.base import Scheduler


class Paired(NamedTuple):
    """A paired gain over the baseline: the mean and standard deviation over the seeds of
    metric / baseline's - 1 (seed by seed), their count, and the mean's 95 % t interval, as
    `simulate --seeds` prints it. Unpacks as (mean, sd, n)."""

    mean: float
    sd: float
    n: int

    @property
    def half_width(self) -> float:
        """Half the 95 % t interval of the mean (NaN with one seed)."""
        if self.n < 2:
            return math.nan
        from scipy import stats

        return float(stats.t.ppf(0.975, self.n - 1)) * self.sd / math.sqrt(self.n)

    @property
    def lo(self) -> float:
        return self.mean - self.half_width

    @property
    def hi(self) -> float:
        return self.mean + self.half_width

    def __str__(self) -> str:
        ci = "" if self.n < 2 else f" [{self.lo:+.1%}, {self.hi:+.1%}]"
        return f"{self.mean:+.1%}{ci} ({self.n} seed{'s' if self.n != 1 else ''})"


@dataclass(repr=False)
class Results:
    """Runs keyed by (scheduler label, seed), in the order they ran."""

    scenario: Scenario
    runs: dict[tuple[str, int], RunResult] = field(default_factory=dict)

    def __repr__(self) -> str:
        names = list(dict.fromkeys(name for name, _ in self.runs))
        seeds = sorted({seed for _, seed in self.runs})
        return (f"<Results {self.scenario.name!r}: {', '.join(names)} x {len(seeds)} seed(s), "
                f"{self.scenario.steps} steps; .rows(), .to_frame(), .paired()>")

    def _repr_html_(self) -> str:
        """The table a notebook shows: per scheduler, mean rollout tok/s and samples/s over the
        seeds and the paired gain over sync with its 95 % interval."""
        paired = self.paired() if any(n == "sync" for n, _ in self.runs) else {}
        by: dict[str, list[dict[str, Any]]] = {}
        for (name, _), run in self.runs.items():
            by.setdefault(name, []).append(run.summary())
        head = ("<tr><th>scheduler</th><th>seeds</th><th>rollout tok/s</th><th>samples/s</th>"
                "<th>off-policy</th><th>tok/s vs sync [95% CI]</th></tr>")
        rows = []
        for name, rs in by.items():
            tok = sum(r["rollout_throughput_tok_s"] for r in rs) / len(rs)
            sps = sum(r["samples_per_s"] for r in rs) / len(rs)
            off = sum(r["offpolicy_token_fraction"] for r in rs) / len(rs)
            gain = str(paired[name]) if name in paired and name != "sync" else ""
            rows.append(f"<tr><td>{html.escape(name)}</td><td>{len(rs)}</td><td>{tok:,.0f}</td>"
                        f"<td>{sps:,.2f}</td><td>{off:.0%}</td><td>{html.escape(gain)}</td></tr>")
        return (f"<p>{html.escape(self.scenario.name)}: {self.scenario.steps} steps, the first "
                f"{self.scenario.warmup_steps} left out</p><table>{head}{''.join(rows)}</table>")

    def rows(self) -> list[dict[str, Any]]:
        """One summary row per (scheduler, seed), warm-up steps left out."""
        return [{"scheduler": name, "seed": seed, **{k: v for k, v in run.summary().items()
                                                      if k != "scheduler"}}
                for (name, seed), run in self.runs.items()]

    def to_frame(self):  # noqa: ANN201 - pandas is optional
        """The rows as a pandas DataFrame (needs pandas: `pip install 'aprilsim[sweep]'`)."""
        try:
            import pandas as pd
        except ImportError:  # pragma: no cover - depends on the environment
            raise ImportError("to_frame() needs pandas: pip install 'aprilsim[sweep]'") from None
        return pd.DataFrame(self.rows())

    def paired(self, metric: str = "rollout_throughput_tok_s", baseline: str = "sync",
               ) -> dict[str, Paired]:
        """Per scheduler: the `Paired` gain of metric / baseline's - 1 over the seeds (mean,
        standard deviation, seeds, and `.lo`/`.hi` its 95 % interval), paired by seed. Seeds
        the baseline did not run are left out."""
        base = {seed: run.summary()[metric] for (name, seed), run in self.runs.items()
                if name == baseline}
        diffs: dict[str, list[float]] = {}
        for (name, seed), run in self.runs.items():
            if seed in base and base[seed]:
                diffs.setdefault(name, []).append(run.summary()[metric] / base[seed] - 1.0)
        out = {}
        for name, d in diffs.items():
            mean = sum(d) / len(d)
            sd = (sum((x - mean) ** 2 for x in d) / (len(d) - 1)) ** 0.5 if len(d) > 1 else 0.0
            out[name] = Paired(mean, sd, len(d))
        return out


def simulate(
    scenario: Scenario | str | Path | dict[str, Any] | None = None,
    schedulers: Sequence[str | Scheduler] | None = None,
    seeds: int | Iterable[int] | None = None,
    *,
    steps: int | None = None,
    warmup: int | None = None,
) -> Results:
    """Simulate `schedulers` (names, `module:Class`, `NAME@knob=value,...` as on the command line,
    or instances; default: the scenario's
    `compare` list) on `scenario` (a Scenario, a TOML path, a dict, or None for the default) for
    each seed (`seeds=5` means the scenario's seed and the next four).

    >>> import aprilsim
    >>> res = aprilsim.simulate(schedulers=["sync", "april"], seeds=2, steps=3)
    >>> sorted({row["scheduler"] for row in res.rows()})
    ['april', 'sync']
    >>> gain, sd, n = res.paired()["april"]
    >>> n, gain > 0
    (2, True)
    >>> p = res.paired()["april"]
    >>> p.lo < p.mean < p.hi  # the 95 % t interval of the paired gain
    True
    """
    from aprilsim.scheduler_spec import check_schedulers
    from aprilsim.sim.run import simulate as run_one

    sc = with_overrides(as_scenario(scenario), steps=steps, warmup=warmup).check()
    if seeds is None:
        seed_list = [sc.seed]
    elif isinstance(seeds, int):
        seed_list = [sc.seed + k for k in range(seeds)]
    else:
        seed_list = list(seeds)
    chosen = list(schedulers) if schedulers is not None else list(sc.compare)
    check_schedulers(sc, [s for s in chosen if isinstance(s, str)])  # bad input before any run
    out = Results(sc)
    for s in chosen:
        for seed in seed_list:
            label = s if isinstance(s, str) else s.name
            # an instance keeps state: only its first seed may use it as is
            if isinstance(s, str):  # NAME or NAME@knob=value,... as on the command line
                run = run_one(sc, s, seed=seed)
            else:
                run = run_one(sc, s if seed == seed_list[0] else type(s)(), seed=seed)
            out.runs[(label, seed)] = run
    return out
