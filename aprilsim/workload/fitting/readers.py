"""Read lengths from logs: CSV/TSV, JSONL (or a JSON array), Parquet, plain one-per-line, gzipped.

Files are streamed in chunks: only the histogram of lengths is kept unless a group or step column
is read, so memory is bounded by the number of distinct lengths. Rows that cannot be used are
skipped and counted by reason (missing, not a number, NaN/inf, zero or negative, non-integer), and
the counts travel with the data so the CLI can report them. A file with no usable rows raises
`LengthDataError` with one line of explanation.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from aprilsim.workload.fitting.columns import (
    GROUP_NAMES,
    STEP_NAMES,
    detect_length_column,
    detect_optional,
    find_column,
)
from aprilsim.workload.fitting.data import HistogramBuilder, LengthData
from aprilsim.workload.fitting.errors import LengthDataError

CHUNK = 65536
FORMATS = ("csv", "tsv", "jsonl", "json", "parquet", "plain")
_SUFFIX = {
    ".csv": "csv",
    ".tsv": "tsv",
    ".tab": "tsv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".txt": "plain",
}
NONE = "none"  # pass as group/step column to switch auto-detection off


def _is_gzip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def _open_text(path: Path) -> io.TextIOBase:
    if _is_gzip(path):
        return gzip.open(path, "rt", encoding="utf-8", errors="replace", newline="")
    return open(path, encoding="utf-8", errors="replace", newline="")


def detect_format(path: Path) -> str:
    """Format from the suffix (ignoring .gz), else from the first bytes / first line."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    if suffixes and suffixes[-1] in _SUFFIX:
        return _SUFFIX[suffixes[-1]]
    opener = gzip.open if _is_gzip(path) else open
    with opener(path, "rb") as f:
        head = f.read(4096)
    if head[:4] == b"PAR1":
        return "parquet"
    text = head.decode("utf-8", errors="replace").lstrip()
    first = text.splitlines()[0] if text else ""
    if first.startswith("{"):
        return "jsonl"
    if first.startswith("["):
        return "json"
    if "\t" in first:
        return "tsv"
    if "," in first:
        return "csv"
    return "plain"


class _Accumulator:
    """Turns raw rows into validated lengths (plus group and step), counting what it rejects."""

    def __init__(
        self, keep_rows: bool, want_group: bool, want_step: bool, round_values: bool = False
    ) -> None:
        self.round_values = round_values
        self.keep_rows = keep_rows
        self.want_group = want_group
        self.want_step = want_step
        self.hist = HistogramBuilder()
        self.skipped: dict[str, int] = {}
        self.rows = 0
        self._buf_len: list[float] = []
        self._buf_grp: list[Any] = []
        self._buf_step: list[float] = []
        self._len_chunks: list[np.ndarray] = []
        self._grp_chunks: list[np.ndarray] = []
        self._step_chunks: list[np.ndarray] = []

    def skip(self, reason: str, n: int = 1) -> None:
        if n:
            self.skipped[reason] = self.skipped.get(reason, 0) + n

    @staticmethod
    def _number(raw: Any) -> float | str:
        """A float, or the reason the raw cell is not one."""
        if raw is None or (isinstance(raw, str) and not raw.strip()):
            return "missing"
        if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
            return "not a number"
        try:
            return float(raw)
        except ValueError:
            return "not a number"

    def add(self, raw_len: Any, raw_group: Any = None, raw_step: Any = None) -> None:
        self.rows += 1
        x = self._number(raw_len)
        if isinstance(x, str):
            self.skip(x)
            return
        if self.want_step:
            s = self._number(raw_step)
            if isinstance(s, str) or not np.isfinite(s):
                self.skip("bad step")
                return
            self._buf_step.append(s)
        if self.want_group:
            if raw_group is None or raw_group == "":
                if self.want_step:
                    self._buf_step.pop()
                self.skip("missing group")
                return
            self._buf_grp.append(str(raw_group))
        self._buf_len.append(x)
        if len(self._buf_len) >= CHUNK:
            self.flush()

    def add_array(self, lengths: np.ndarray, reasons: np.ndarray, groups=None, steps=None) -> None:
        """Vectorised path (Parquet): floats plus a per-row reason ("" when the cell is a number)."""
        self.rows += len(lengths)
        x = np.asarray(lengths, float)
        ok = reasons == ""
        for r in np.unique(reasons[~ok]):
            self.skip(str(r), int((reasons == r).sum()))
        if steps is not None:
            s = np.asarray(steps, float)
            bad = ~np.isfinite(s) & ok
            self.skip("bad step", int(bad.sum()))
            ok &= ~bad
        if groups is not None:
            g = np.asarray(groups, dtype=object)
            bad = np.array([v is None for v in g], bool) & ok
            self.skip("missing group", int(bad.sum()))
            ok &= ~bad
        self._validate(
            x[ok],
            None if groups is None else g[ok].astype(str),
            None if steps is None else s[ok],
        )

    def _validate(self, x: np.ndarray, g: np.ndarray | None, s: np.ndarray | None) -> None:
        nan = ~np.isfinite(x)
        self.skip("NaN/inf", int(nan.sum()))
        x = np.where(nan, 1.0, x)
        if self.round_values:
            x = np.round(x)
        nonpos = ~nan & (x <= 0)
        self.skip("zero or negative", int(nonpos.sum()))
        frac = ~nan & ~nonpos & (x != np.round(x))
        self.skip("non-integer", int(frac.sum()))
        ok = ~(nan | nonpos | frac)
        xi = x[ok].astype(np.int64)
        self.hist.add(xi)
        if self.keep_rows:
            self._len_chunks.append(xi)
            if g is not None:
                self._grp_chunks.append(np.asarray(g)[ok])
            if s is not None:
                self._step_chunks.append(np.asarray(s, float)[ok])

    def flush(self) -> None:
        if not self._buf_len:
            return
        x = np.asarray(self._buf_len, float)
        g = np.asarray(self._buf_grp, dtype=object) if self.want_group else None
        s = np.asarray(self._buf_step, float) if self.want_step else None
        self._buf_len, self._buf_grp, self._buf_step = [], [], []
        self._validate(x, g, s)

    def result(self, source: str, column: str, group: str | None, step: str | None) -> LengthData:
        self.flush()

        def cat(chunks, dtype):
            return np.concatenate(chunks) if chunks else np.zeros(0, dtype)

        groups = None
        if group is not None:
            _, groups = np.unique(cat(self._grp_chunks, object).astype(str), return_inverse=True)
        return LengthData(
            histogram=self.hist.build(),
            source=source,
            column=column,
            group_column=group,
            step_column=step,
            lengths=cat(self._len_chunks, np.int64) if self.keep_rows else None,
            groups=groups,
            steps=cat(self._step_chunks, float) if step is not None else None,
            rows_read=self.rows,
            skipped=dict(self.skipped),
        )


def _resolve(
    columns: list[str], column: str | None, group_column: str | None, step_column: str | None
) -> tuple[str, str | None, str | None]:
    col = find_column(columns, column, "length") if column else detect_length_column(columns)
    rest = [c for c in columns if c != col]

    def optional(given: str | None, names: tuple[str, ...], what: str) -> str | None:
        if given is not None and given.lower() == NONE:
            return None
        if given:
            return find_column(columns, given, what)
        return detect_optional(rest, names)

    return (
        col,
        optional(group_column, GROUP_NAMES, "group"),
        optional(step_column, STEP_NAMES, "step"),
    )


def _flatten(rec: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in rec.items():
        if isinstance(v, dict):
            for k2, v2 in v.items():
                out[f"{k}.{k2}"] = v2
        else:
            out[k] = v
    return out


def _csv_rows(path: Path, delimiter: str) -> tuple[list[str], Iterator[list[str]]]:
    f = _open_text(path)
    reader = csv.reader(f, delimiter=delimiter)
    for header in reader:
        if any(cell.strip() for cell in header):
            return [h.strip() for h in header], reader
    raise LengthDataError(f"{path}: file is empty")


def _read_delimited(path, fmt, column, group_column, step_column, rnd) -> LengthData:
    header, rows = _csv_rows(path, "\t" if fmt == "tsv" else ",")
    if len(header) == 1 and _Accumulator._number(header[0]) != "not a number" and not column:
        return _read_plain(path, rnd)
    col, grp, stp = _resolve(header, column, group_column, step_column)
    ic, ig, is_ = (
        header.index(col),
        (header.index(grp) if grp else None),
        (header.index(stp) if stp else None),
    )
    acc = _Accumulator(grp is not None or stp is not None, grp is not None, stp is not None, rnd)
    width = max(i for i in (ic, ig, is_) if i is not None)
    for row in rows:
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        if len(row) <= width:
            acc.rows += 1
            acc.skip("short row")
            continue
        acc.add(row[ic], row[ig] if ig is not None else None, row[is_] if is_ is not None else None)
    return acc.result(str(path), col, grp, stp)


def _json_records(path: Path, fmt: str) -> Iterator[dict[str, Any] | None]:
    if fmt == "json":
        with _open_text(path) as f:
            try:
                data = json.load(f)
            except json.JSONDecodeError as e:
                raise LengthDataError(
                    f"{path}: not valid JSON ({e.msg} at line {e.lineno})"
                ) from None
        if isinstance(data, dict):
            data = [data]
        if not isinstance(data, list):
            raise LengthDataError(f"{path}: JSON must be a list of records")
        for rec in data:
            yield _flatten(rec) if isinstance(rec, dict) else None
        return
    with _open_text(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                yield None
                continue
            yield _flatten(rec) if isinstance(rec, dict) else None


def _read_json(path, fmt, column, group_column, step_column, rnd) -> LengthData:
    records = _json_records(path, fmt)
    first = None
    junk_before = 0
    for rec in records:
        if rec is not None:
            first = rec
            break
        junk_before += 1
    if first is None:
        if junk_before:
            raise LengthDataError(f"{path}: no JSON records found ({junk_before} unparsable lines)")
        raise LengthDataError(f"{path}: file is empty")
    col, grp, stp = _resolve(list(first), column, group_column, step_column)
    acc = _Accumulator(grp is not None or stp is not None, grp is not None, stp is not None, rnd)
    acc.rows += junk_before
    acc.skip("unparsable line", junk_before)
    for rec in _chain_first(first, records):
        if rec is None:
            acc.rows += 1
            acc.skip("unparsable line")
            continue
        acc.add(rec.get(col), rec.get(grp) if grp else None, rec.get(stp) if stp else None)
    return acc.result(str(path), col, grp, stp)


def _chain_first(first, rest):
    yield first
    yield from rest


def _read_plain(path: Path, rnd: bool = False) -> LengthData:
    acc = _Accumulator(False, False, False, rnd)
    with _open_text(path) as f:
        for line in f:
            line = line.strip()
            if line:
                acc.add(line)
    if acc.rows == 0:
        raise LengthDataError(f"{path}: file is empty")
    return acc.result(str(path), "(one length per line)", None, None)


def _read_parquet(path, column, group_column, step_column, rnd) -> LengthData:
    try:
        import pyarrow.parquet as pq
    except ImportError:  # pragma: no cover - depends on the environment
        raise LengthDataError(
            "reading Parquet needs pyarrow: pip install 'aprilsim[fit]'"
        ) from None
    tmp = None
    try:
        if _is_gzip(path):
            tmp = tempfile.NamedTemporaryFile(suffix=".parquet", delete=False)
            with gzip.open(path, "rb") as src:
                shutil.copyfileobj(src, tmp)
            tmp.close()
            path_to_read = tmp.name
        else:
            path_to_read = str(path)
        try:
            pf = pq.ParquetFile(path_to_read)
        except Exception as e:  # pyarrow raises several types for corrupt files
            raise LengthDataError(f"{path}: not a readable Parquet file ({e})") from None
        names = list(pf.schema_arrow.names)
        col, grp, stp = _resolve(names, column, group_column, step_column)
        acc = _Accumulator(
            grp is not None or stp is not None, grp is not None, stp is not None, rnd
        )
        cols = [c for c in (col, grp, stp) if c]
        for batch in pf.iter_batches(batch_size=CHUNK, columns=list(dict.fromkeys(cols))):
            x, reasons = _arrow_floats(batch.column(col))
            g = batch.column(grp).to_pylist() if grp else None
            s = _arrow_floats(batch.column(stp))[0] if stp else None
            acc.add_array(x, reasons, g, s)
        return acc.result(str(path), col, grp, stp)
    finally:
        if tmp is not None:
            Path(tmp.name).unlink(missing_ok=True)


def _arrow_floats(arr) -> tuple[np.ndarray, np.ndarray]:
    """A pyarrow column as floats, with the reason each unusable cell is unusable ("" if fine)."""
    import pyarrow as pa

    n = len(arr)
    null = np.asarray(arr.is_null().to_numpy(zero_copy_only=False), bool)
    reasons = np.where(null, "missing", "").astype(object)
    if pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type):
        x = arr.cast(pa.float64()).fill_null(np.nan).to_numpy(zero_copy_only=False)
        return x, reasons
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        vals = [_Accumulator._number(v) for v in arr.to_pylist()]
        x = np.array([np.nan if isinstance(v, str) else v for v in vals], float)
        reasons = np.array([v if isinstance(v, str) else "" for v in vals], dtype=object)
        return x, reasons
    return np.full(n, np.nan), np.full(n, "not a number", dtype=object)


def read_lengths(
    path: str | Path,
    column: str | None = None,
    group_column: str | None = None,
    step_column: str | None = None,
    fmt: str | None = None,
    round_values: bool = False,
) -> LengthData:
    """Read response lengths from a log file.

    Parameters
    ----------
    path: the file (its format from the suffix, `.gz` allowed, else sniffed from the content).
    column: the length column; detected among common names when omitted.
    group_column, step_column: prompt id and training step; detected among exact common names
        when omitted, switched off with "none".
    fmt: force one of FORMATS.
    round_values: round non-integer values (mean-length curves) instead of skipping them.
    """
    path = Path(path)
    if not path.exists():
        raise LengthDataError(f"{path}: no such file")
    if path.is_dir():
        raise LengthDataError(f"{path}: is a directory")
    if path.stat().st_size == 0:
        raise LengthDataError(f"{path}: file is empty")
    fmt = fmt or detect_format(path)
    if fmt not in FORMATS:
        raise LengthDataError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
    try:
        if fmt in ("csv", "tsv"):
            return _read_delimited(path, fmt, column, group_column, step_column, round_values)
        if fmt in ("jsonl", "json"):
            return _read_json(path, fmt, column, group_column, step_column, round_values)
        if fmt == "parquet":
            return _read_parquet(path, column, group_column, step_column, round_values)
        return _read_plain(path, round_values)
    except (gzip.BadGzipFile, EOFError, UnicodeDecodeError, csv.Error) as e:
        raise LengthDataError(f"{path}: cannot read as {fmt} ({e})") from None
