"""Replay logs and per-step rollout times from tables: CSV/TSV, JSONL/JSON, Parquet.

A table replays when every row is one response with a step and a prompt (group) column, the
formats and column names `aprilsim fit` reads (``aprilsim.workload.fitting``: the length column
by its known names, ``prompt_id``/``group_id``/... and ``step``/``global_step``/...), plus, where
present, a prompt-length and a reward column. Per-step rollout times come from a table of
(step, rollout seconds), slime's log lines ``perf N: {..., 'perf/rollout_time': X, ...}``, or
verl's metrics (the ``file`` logger's JSONL ``{"step": N, "data": {"timing_s/gen": X}}``, or the
console's ``step:N - ... - timing_s/gen:X``).
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from aprilsim.workload.fitting.columns import (
    GROUP_NAMES,
    STEP_NAMES,
    detect_length_column,
    detect_optional,
    find_column,
)
from aprilsim.workload.fitting.errors import LengthDataError
from aprilsim.workload.fitting.json_records import column_paths, iter_records, lookup
from aprilsim.workload.fitting.readers import detect_format, sniff_delimiter
from aprilsim.workload.fitting.sources import Source
from aprilsim.workload.replay.frameworks import PROMPT_FIELDS, REWARD_KEYS, _number
from aprilsim.workload.replay.log import LoggedRow, ReplayLogError

ROLLOUT_TIME_NAMES = ("rollout_s", "rollout_time_s", "rollout_time", "perf/rollout_time",
                      "timing_s/gen", "gen_s", "generation_s")
REPLAY_GROUP_NAMES = (*GROUP_NAMES, "group_index", "uid", "prompt_index")


def table_records(path: str | Path) -> tuple[list[str], Iterator[dict[str, Any]]]:
    """Column names and rows (dicts, nested JSON fields by dotted name) of a table file."""
    src = Source(path)
    try:
        fmt = detect_format(src)
    except LengthDataError as e:
        src.close()
        raise ReplayLogError(str(e)) from None
    if fmt == "parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ReplayLogError(f"{path}: reading Parquet needs pyarrow") from None
        table = pq.read_table(src.path)
        src.close()
        return list(table.column_names), iter(table.to_pylist())
    if fmt in ("jsonl", "json"):
        recs = [r for r in iter_records(src, fmt) if r is not None]
        src.close()
        if not recs:
            raise ReplayLogError(f"{path}: no JSON records")
        paths = column_paths(recs[0])
        return list(paths), ({k: lookup(r, p) for k, p in paths.items()} for r in recs)
    if fmt in ("csv", "tsv"):
        with src.open_text() as f:
            lines = [ln for ln in f if ln.strip()]
        src.close()
        if not lines:
            raise ReplayLogError(f"{path}: file is empty")
        delim = "\t" if fmt == "tsv" else sniff_delimiter(lines[0])
        reader = csv.DictReader(lines, delimiter=delim)
        return [c.strip() for c in (reader.fieldnames or [])], (
            {k.strip(): v for k, v in row.items() if k is not None} for row in reader)
    src.close()
    raise ReplayLogError(f"{path}: a replay table must be CSV, TSV, JSONL, JSON or Parquet")


def _num(v: Any) -> float | None:
    x = _number(v)
    if x is not None:
        return x
    if isinstance(v, str) and v.strip():
        try:
            return float(v)
        except ValueError:
            return None
    return None


def _col(columns: list[str], given: str | None, names: tuple[str, ...], what: str) -> str | None:
    try:
        return find_column(columns, given, what) if given else detect_optional(columns, names)
    except LengthDataError as e:
        raise ReplayLogError(str(e)) from None


def table_rows(path: str | Path, *, length_column: str | None = None,
               group_column: str | None = None, step_column: str | None = None,
               prompt_column: str | None = None,
               reward_column: str | None = None) -> tuple[list[LoggedRow], list[str]]:
    """Rows of a table with one response per row (see the module doc)."""
    columns, recs = table_records(path)
    try:
        length = find_column(columns, length_column, "length") if length_column \
            else detect_length_column([c for c in columns if c not in PROMPT_FIELDS])
    except LengthDataError as e:
        raise ReplayLogError(f"{path}: {e}") from None
    group = _col(columns, group_column, REPLAY_GROUP_NAMES, "group")
    step = _col(columns, step_column, STEP_NAMES, "step")
    if group is None or step is None:
        missing = " and ".join(w for w, c in (("a prompt/group column", group), ("a step column", step)) if c is None)
        raise ReplayLogError(
            f"{path}: replay needs {missing} (known names: {', '.join(REPLAY_GROUP_NAMES)}; "
            f"{', '.join(STEP_NAMES)}); name them with group_column / step_column")
    prompt = _col(columns, prompt_column, PROMPT_FIELDS, "prompt length")
    reward = _col(columns, reward_column, REWARD_KEYS, "reward")
    rows, bad = [], 0
    for n, r in enumerate(recs, 2):
        ln, st = _num(r.get(length)), _num(r.get(step))
        if ln is None or st is None or ln < 0 or ln != int(ln):
            bad += 1
            if bad == 1:
                first = (n, r.get(length), r.get(step))
            continue
        p = _num(r.get(prompt)) if prompt else None
        rows.append(LoggedRow(step=int(st), key=("group", str(r.get(group))), length=int(ln),
                              prompt_len=int(p) if p and p > 0 else None,
                              reward=_num(r.get(reward)) if reward else None))
    notes = []
    if bad:
        notes.append(f"{bad} rows without a usable length or step skipped (first: row {first[0]}, "
                     f"length {first[1]!r}, step {first[2]!r})")
    return rows, notes


# ---------------------------------------------------------------------------------------- times
_SLIME_PERF = re.compile(r"perf (\d+): \{")
_SLIME_TIME = re.compile(r"['\"]perf/rollout_time['\"]:\s*(?:np\.float64\()?([0-9.eE+-]+)")
_VERL_CONSOLE = re.compile(r"^step:(\d+) - ")
_VERL_GEN = re.compile(r"(?:^| - )timing_s/gen:([0-9.eE+-]+)")


def read_step_times(path: str | Path, *, step_column: str | None = None,
                    time_column: str | None = None) -> dict[int, float]:
    """Logged rollout seconds per step (see the module doc for the formats read)."""
    p = Path(path)
    if not p.is_file():
        raise ReplayLogError(f"{p}: no such file")
    text = p.read_text(errors="replace")
    out: dict[int, float] = {}
    for line in text.splitlines():
        m = _SLIME_PERF.search(line)
        if m:
            t = _SLIME_TIME.search(line)
            if t:
                out[int(m.group(1))] = float(t.group(1))
            continue
        m = _VERL_CONSOLE.match(line)
        if m:
            t = _VERL_GEN.search(line)
            if t:
                out[int(m.group(1))] = float(t.group(1))
            continue
        s = line.strip()
        if s.startswith("{") and '"data"' in s:
            try:
                rec = json.loads(s)
            except json.JSONDecodeError:
                continue
            data = rec.get("data") if isinstance(rec, dict) else None
            if isinstance(data, dict) and _num(data.get("timing_s/gen")) is not None:
                out[int(rec["step"])] = float(data["timing_s/gen"])
    if out:
        return out
    columns, recs = table_records(p)
    if step_column is None and "rollout/step" in columns:  # slime's wandb step (beside _step)
        step_column = "rollout/step"
    step = _col(columns, step_column, (*STEP_NAMES, "rollout/step", "rollout_id"), "step")
    t = _col(columns, time_column, ROLLOUT_TIME_NAMES, "rollout time")
    if step is None or t is None:
        raise ReplayLogError(
            f"{p}: no per-step rollout times found (slime 'perf N: {{...}}' lines, verl "
            f"timing_s/gen, or a table with a step and one of {', '.join(ROLLOUT_TIME_NAMES)})")
    for r in recs:
        s, x = _num(r.get(step)), _num(r.get(t))
        if s is not None and x is not None and x > 0:
            out[int(s)] = x
    if not out:
        raise ReplayLogError(f"{p}: no usable rows of {step}, {t}")
    return out
