"""JSON and JSONL records for the readers: nested fields by dotted path, bare numbers, bad lines.

Column names of a record are the dotted paths of its scalar fields at any depth
(`usage.completion_tokens`, `meta.usage.output_tokens`); a key that itself contains a dot is still
one step. A file whose records are bare numbers (`[12, 40, 7]`) has one column, `VALUE_COLUMN`.
Lines that are not JSON, nest too deeply for the parser or hold a number Python refuses to convert
are unparsable lines, counted by the reader, never an abort.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from aprilsim.workload.fitting.errors import LengthDataError
from aprilsim.workload.fitting.numbers import json_int

VALUE_COLUMN = "(value)"
MAX_DEPTH = 8
Path_ = tuple[str, ...]
BAD = None  # a record that could not be parsed


def loads(text: str) -> Any:
    """json.loads that keeps long integers as digit strings (see `numbers.json_int`)."""
    return json.loads(text, parse_int=json_int)


def as_record(obj: Any) -> dict[str, Any] | None:
    """A parsed item as a record: dicts as they are, bare numbers (or numeric strings) as
    {VALUE_COLUMN: x}, anything else unusable (None)."""
    if isinstance(obj, dict):
        return obj
    if isinstance(obj, (int, float, str)) and not isinstance(obj, bool):
        return {VALUE_COLUMN: obj}
    return BAD


def column_paths(record: dict[str, Any]) -> dict[str, Path_]:
    """Dotted name -> key path of every non-object field, in order, at most MAX_DEPTH deep."""
    out: dict[str, Path_] = {}

    def walk(obj: dict[str, Any], prefix: Path_) -> None:
        for k, v in obj.items():
            path = (*prefix, str(k))
            if isinstance(v, dict):
                if len(path) < MAX_DEPTH:
                    walk(v, path)
            else:
                out.setdefault(".".join(path), path)

    walk(record, ())
    return out


def lookup(record: dict[str, Any], path: Path_) -> Any:
    """The value at `path`, None when any step is missing."""
    obj: Any = record
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
        if obj is None:
            return None
    return obj


def iter_records(source, fmt: str) -> Iterator[dict[str, Any] | None]:
    """Records of a JSON array (loaded whole) or of JSONL (one per line); None for a bad line."""
    if fmt == "json":
        with source.open_text() as f:
            try:
                data = loads(f.read())
            except json.JSONDecodeError as e:
                raise LengthDataError(
                    f"{source.name}: not valid JSON ({e.msg} at line {e.lineno})"
                ) from None
            except RecursionError:
                raise LengthDataError(f"{source.name}: JSON nested too deeply to read") from None
            except ValueError as e:
                raise LengthDataError(f"{source.name}: not valid JSON ({e})") from None
        if isinstance(data, dict):
            data = [data]
        if not isinstance(data, list):
            raise LengthDataError(f"{source.name}: JSON must be a list of records or of numbers")
        for item in data:
            yield as_record(item)
        return
    with source.open_text() as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                # the plain parser first (the parse_int hook costs half the time of a line):
                # it differs from `loads` only on integers of 19+ digits, which parse_number
                # then judges alike (a float, or "too large"), and it refuses those beyond
                # Python's int-conversion limit, which `loads` keeps as digit strings
                obj = json.loads(line)
            except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
                try:
                    obj = loads(line)
                except (ValueError, RecursionError):
                    yield BAD
                    continue
            yield as_record(obj)
