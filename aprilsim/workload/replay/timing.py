"""Per-step rollout times from a run's logs, under a timing key the user may choose.

Read, line by line (a file of any size in bounded memory): slime's ``perf N: {...}`` log lines
(key ``perf/rollout_time``), verl's console lines ``step:N - ... - KEY:X`` (as the trainer prints
them, or behind Ray's ``(TaskRunner pid=N)`` prefix in the driver's output; key
``timing_s/gen``), verl's ``file`` logger JSONL ``{"step": N, "data": {KEY: X}}``, and tables:
CSV/JSON/Parquet with a step column and a time column, wandb exports included (the run history's
``_step``/``rollout/step`` and metric columns, or a panel's CSV with ``Step`` and
``RUN - KEY``). What a key spans differs by framework (`SPANS`), and the report says it.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from aprilsim.workload.replay.log import ReplayLogError

DEFAULT_KEYS = ("perf/rollout_time", "timing_s/gen")  # slime's, verl's
SPANS = {
    "perf/rollout_time": (
        "slime's rollout call as a whole: generation and rewards, and writing the debug dump "
        "when --save-debug-rollout-data is on (about 1 s of CPU for a 28 MB dump)"),
    "timing_s/gen": (
        "verl's generation step; in the legacy worker path it includes waking the engines and "
        "syncing weights (timing_s/generate_sequences or "
        "timing_s/agent_loop/generate_sequences/max is generation alone)"),
    "timing_s/generate_sequences": "verl's rollout workers' generate_sequences: generation alone",
    "timing_s/agent_loop/generate_sequences/max": (
        "verl's slowest agent-loop worker's generate_sequences: generation alone"),
}
TABLE_NAMES = ("rollout_s", "rollout_time_s", "rollout_time", "perf/rollout_time",
               "timing_s/gen", "gen_s", "generation_s")
_SLIME_PERF = re.compile(r"perf (\d+): \{")
_VERL_STEP = re.compile(r"(?:^|\)\s+|\s)step:(\d+) - ")  # at line start, or after `(Actor pid=N)`
_NUMBER = r"(-?[0-9.]+(?:[eE][+-]?\d+)?|-?inf|nan|-?Infinity|NaN)"


class TimingError(ReplayLogError):
    """The timing file cannot give per-step rollout times (the message names the file)."""


@dataclass
class StepTimes:
    """Rollout seconds per step, the key they were read under, and the log's kind."""

    times: dict[int, float]
    key: str
    kind: str  # "slime log", "verl console", "verl metrics", "table"
    source: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def span(self) -> str:
        """What the chosen key's time includes, in words."""
        return SPANS.get(self.key, f"the logged {self.key}: check that it spans generation alone")


def _seconds(raw: str, where: str) -> float:
    """A logged time: a positive finite number of seconds, or TimingError naming `where`."""
    try:
        x = float(raw)
    except ValueError:
        raise TimingError(f"{where}: {raw!r} is not a number of seconds") from None
    if not math.isfinite(x) or x <= 0:
        raise TimingError(f"{where}: rollout time {raw} is not a positive finite number of "
                          "seconds")
    return x


def _value_re(key: str, style: str) -> re.Pattern[str]:
    k = re.escape(key)
    if style == "slime":  # 'perf/rollout_time': 1.5 (or np.float64(1.5))
        return re.compile(rf"['\"]{k}['\"]:\s*(?:np\.float\d*\()?{_NUMBER}")
    # verl: ` - timing_s/gen:12.3` (pprint.pformat of a numpy float: `np.float64(12.3)`)
    return re.compile(rf"(?:^|\s|- ){k}:(?:np\.float\d*\()?{_NUMBER}")


def _line_time(line: str, pats: dict, where: str
               ) -> tuple[str, int | None, tuple[str, float] | None, list[str]] | None:
    """(log kind, step, (key, seconds) when a wanted key is on the line, timing keys seen) of
    one line of slime's or verl's logs; None for any other line."""
    m = _SLIME_PERF.search(line)
    if m:
        seen = re.findall(r"['\"](perf/[\w/]+)['\"]:", line)
        style, kind = 0, "slime log"
    else:
        m = _VERL_STEP.search(line)
        if m is None:
            s = line.strip()
            if s.startswith("{") and '"data"' in s:
                return _jsonl_line(s, pats, where)
            return None
        seen = re.findall(r"(timing_s/[\w/]+):", line)
        style, kind = 1, "verl console"
    for key, styles in pats.items():
        t = styles[style].search(line)
        if t:
            return kind, int(m.group(1)), (key, _seconds(t.group(1), where)), seen
    return kind, int(m.group(1)), None, seen


def _from_lines(path: Path, key: str | None) -> StepTimes | None:
    """Times from slime's perf lines or verl's console/JSONL lines; None when there are none."""
    out: dict[int, float] = {}
    kind, used = "", key
    seen_keys: set[str] = set()
    pats = {k: (_value_re(k, "slime"), _value_re(k, "verl")) for k in
            ((key,) if key else DEFAULT_KEYS)}
    from aprilsim.workload.fitting.sources import bounded_lines

    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(bounded_lines(f, str(path), TimingError), 1):
            got = _line_time(line, pats, f"{path}:{n}")
            if got is None:
                continue
            kind = kind or got[0]
            seen_keys.update(got[3])
            if got[1] is not None and got[2] is not None:
                used = used or got[2][0]
                out[got[1]] = got[2][1]
    if not kind:
        return None
    if not out:
        known = ", ".join(sorted(seen_keys)) or "none"
        raise TimingError(f"{path}: no {key or ' or '.join(DEFAULT_KEYS)} in its {kind} lines; "
                          f"its timing keys: {known} (choose one with timing_key / --timing-key)")
    return StepTimes(out, used or DEFAULT_KEYS[0], kind, str(path))


def _jsonl_line(s: str, pats: dict, where: str
                ) -> tuple[str, int | None, tuple[str, float] | None, list[str]] | None:
    """verl's `file` logger line {"step": N, "data": {KEY: X, ...}} (None: another JSON line)."""
    try:
        rec = json.loads(s)
    except json.JSONDecodeError:
        return None
    data = rec.get("data") if isinstance(rec, dict) else None
    if not isinstance(data, dict) or not isinstance(rec.get("step"), int):
        return None
    seen = [k for k in data if isinstance(k, str) and k.startswith("timing_s/")]
    for key in pats:
        if data.get(key) is not None:
            return "verl metrics", rec["step"], (key, _seconds(str(data[key]), where)), seen
    return "verl metrics", rec["step"], None, seen


def _time_column(columns: list[str], key: str | None) -> str | None:
    """The time column: `key` (or a wandb panel export's `RUN - key`), else a known name."""
    from aprilsim.workload.fitting.columns import normalise

    for k in ((key,) if key else TABLE_NAMES):
        hits = [c for c in columns if c == k or (c.endswith(f" - {k}"))]
        hits = hits or [c for c in columns if normalise(c) == normalise(k)]
        if len(hits) == 1:
            return hits[0]
    return None


def _from_table(path: Path, key: str | None, step_column: str | None) -> StepTimes:
    from aprilsim.workload.fitting.columns import STEP_NAMES
    from aprilsim.workload.replay.tables import column, num, table_records

    columns, recs = table_records(path)
    if step_column is None and "rollout/step" in columns:  # slime's wandb step (beside _step)
        step_column = "rollout/step"
    step = column(columns, step_column, (*STEP_NAMES, "rollout/step", "rollout_id"), "step")
    t = _time_column(columns, key)
    if step is None or t is None:
        want = key or f"one of {', '.join(TABLE_NAMES)}"
        raise TimingError(f"{path}: no per-step rollout times found (slime 'perf N: {{...}}' "
                          f"lines, verl timing_s/... lines, or a table with a step column and "
                          f"{want})")
    out: dict[int, float] = {}
    for n, r in enumerate(recs, 2):
        s, raw = num(r.get(step)), r.get(t)
        if s is None or raw is None or (isinstance(raw, str) and not raw.strip()):
            continue  # a step the run did not time
        out[int(s)] = _seconds(str(raw).strip(), f"{path}: row {n} ({t})")
    if not out:
        raise TimingError(f"{path}: no usable rows of {step}, {t}")
    label = t.rsplit(" - ", 1)[-1]
    return StepTimes(out, label, "table", str(path))


def read_step_times(path: str | Path, *, step_column: str | None = None,
                    time_column: str | None = None) -> dict[int, float]:
    """Logged rollout seconds per step (`read_timing`; a table's `time_column` is its key)."""
    return read_timing(path, key=time_column, step_column=step_column).times


def read_timing(path: str | Path, *, key: str | None = None,
                step_column: str | None = None) -> StepTimes:
    """The logged rollout seconds per step of `path` under `key` (default: slime's
    perf/rollout_time, verl's timing_s/gen, or a table's rollout-time column)."""
    from aprilsim.workload.fitting.sources import refuse_binary

    p = Path(path)
    if not p.exists():
        raise TimingError(f"{p}: no such file")
    refuse_binary(p, "timing", TimingError)
    if p.suffix.lower() not in (".parquet", ".pq"):
        lines = _from_lines(p, key)
        if lines is not None:
            return lines
    return _from_table(p, key, step_column)
