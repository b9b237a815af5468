"""Replay logs and per-step rollout times from tables: CSV/TSV, JSONL/JSON, Parquet.

A table replays when every row is one response with a step and a prompt (group) column, the
formats and column names `aprilsim fit` reads (``aprilsim.workload.fitting``: the length column
by its known names, ``prompt_id``/``group_id``/... and ``step``/``global_step``/...), plus, where
present, a prompt-length and a reward column. Per-step rollout times:
`aprilsim.workload.replay.timing`.
"""

from __future__ import annotations

import csv
import itertools
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
from aprilsim.workload.fitting.sources import Source, bounded_lines
from aprilsim.workload.replay.frameworks import PROMPT_FIELDS, REWARD_KEYS, _number
from aprilsim.workload.replay.log import LoggedRow, ReplayLogError

REPLAY_GROUP_NAMES = (*GROUP_NAMES, "group_index", "uid", "prompt_index")


def table_records(path: str | Path) -> tuple[list[str], Iterator[dict[str, Any]]]:
    """Column names and rows (dicts, nested JSON fields by dotted name) of a table file, the
    rows read as they are consumed (a large file in bounded memory; binary data refused)."""
    src = Source(path)
    try:
        fmt = detect_format(src)
    except LengthDataError as e:
        src.close()
        raise ReplayLogError(str(e)) from None
    if fmt == "parquet":
        return _parquet_records(src, path)
    if fmt in ("jsonl", "json"):
        recs = (r for r in iter_records(src, fmt) if r is not None)
        first = next(recs, None)
        if first is None:
            src.close()
            raise ReplayLogError(f"{path}: no JSON records")
        paths = column_paths(first)
        return list(paths), _closing(src, ({k: lookup(r, p) for k, p in paths.items()}
                                           for r in itertools.chain([first], recs)))
    if fmt in ("csv", "tsv"):
        return _csv_records(src, path, fmt)
    src.close()
    raise ReplayLogError(f"{path}: a replay table must be CSV, TSV, JSONL, JSON or Parquet")


def _closing(src: Source, rows: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """`rows`, then the source closed (a spooled copy removed)."""
    try:
        yield from rows
    finally:
        src.close()


def _csv_records(src: Source, path: str | Path, fmt: str
                 ) -> tuple[list[str], Iterator[dict[str, Any]]]:
    f = src.open_text()
    lines = (ln for ln in bounded_lines(f, str(path), ReplayLogError) if ln.strip())
    head = next(lines, None)
    if head is None:
        f.close()
        src.close()
        raise ReplayLogError(f"{path}: file is empty")
    delim = "\t" if fmt == "tsv" else sniff_delimiter(head)
    reader = csv.DictReader(itertools.chain([head], lines), delimiter=delim)
    columns = [c.strip() for c in (reader.fieldnames or [])]

    def rows() -> Iterator[dict[str, Any]]:
        try:
            for row in reader:
                yield {k.strip(): v for k, v in row.items() if k is not None}
        finally:
            f.close()
            src.close()

    return columns, rows()


def _parquet_records(src: Source, path: str | Path) -> tuple[list[str], Iterator[dict[str, Any]]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        src.close()
        raise ReplayLogError(f"{path}: reading Parquet needs pyarrow") from None
    pf = pq.ParquetFile(src.path)
    columns = list(pf.schema_arrow.names)
    batches = (row for batch in pf.iter_batches(batch_size=65_536) for row in batch.to_pylist())
    return columns, _closing(src, batches)


def num(v: Any) -> float | None:
    """A cell as a number (numeric strings included), else None."""
    x = _number(v)
    if x is not None:
        return x
    if isinstance(v, str) and v.strip():
        try:
            return float(v)
        except ValueError:
            return None
    return None


def column(columns: list[str], given: str | None, names: tuple[str, ...], what: str) -> str | None:
    """The column named `given`, else the one with a known name in `names` (None: none or two)."""
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
    group = column(columns, group_column, REPLAY_GROUP_NAMES, "group")
    step = column(columns, step_column, STEP_NAMES, "step")
    if group is None or step is None:
        missing = " and ".join(w for w, c in (("a prompt/group column", group),
                                              ("a step column", step)) if c is None)
        raise ReplayLogError(
            f"{path}: replay needs {missing} (known names: {', '.join(REPLAY_GROUP_NAMES)}; "
            f"{', '.join(STEP_NAMES)}); name them with group_column / step_column")
    prompt = column(columns, prompt_column, PROMPT_FIELDS, "prompt length")
    reward = column(columns, reward_column, REWARD_KEYS, "reward")
    rows, bad = [], 0
    for n, r in enumerate(recs, 2):
        ln, st = num(r.get(length)), num(r.get(step))
        if ln is None or st is None or ln < 0 or ln != int(ln):
            bad += 1
            if bad == 1:
                first = (n, r.get(length), r.get(step))
            continue
        p = num(r.get(prompt)) if prompt else None
        rows.append(LoggedRow(step=int(st), key=("group", str(r.get(group))), length=int(ln),
                              prompt_len=int(p) if p and p > 0 else None,
                              reward=num(r.get(reward)) if reward else None))
    notes = []
    if bad:
        notes.append(f"{bad} rows without a usable length or step skipped (first: row {first[0]}, "
                     f"length {first[1]!r}, step {first[2]!r})")
    return rows, notes
