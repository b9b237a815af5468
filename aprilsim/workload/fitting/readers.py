"""Read lengths from logs: CSV/TSV, JSONL (or a JSON array), Parquet, plain one-per-line, gzipped.

Files are streamed in chunks: only the histogram of lengths is kept unless a group or step column
is read, so memory is bounded by the number of distinct lengths. Rows that cannot be used are
skipped and counted by reason (missing, not a number, NaN/inf, zero or negative, non-integer, too
large, ...) with the first rejected cell of each reason, and the counts travel with the data so
the CLI can report them. Where the bytes come from (pipes, gzip, encodings) is `sources.py`; one
cell to a number is `numbers.py`; JSON records and dotted paths are `json_records.py`. Anything
unreadable raises `LengthDataError` with one line of explanation.
"""

from __future__ import annotations

import csv
import gzip
import io
import itertools
import shutil
import tempfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
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
from aprilsim.workload.fitting.fast_rows import BLOCK_CHARS, delimited_lengths, plain_lengths
from aprilsim.workload.fitting.json_records import (
    VALUE_COLUMN,
    column_paths,
    iter_records,
    lookup,
)
from aprilsim.workload.fitting.numbers import MAX_LENGTH, TOO_LARGE, parse_number
from aprilsim.workload.fitting.sources import Source

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


def detect_format(source: Source) -> str:
    """Format from the suffix (ignoring .gz), else from the first bytes / first line."""
    suffixes = source.suffixes
    if suffixes and suffixes[-1] in _SUFFIX:
        return _SUFFIX[suffixes[-1]]
    if source.head(4) == b"PAR1":
        return "parquet"
    text = source.head_text().lstrip()
    first = text.splitlines()[0] if text else ""
    if first.startswith("{"):
        return "jsonl"
    if first.startswith("["):
        return "json"
    if "\t" in first:
        return "tsv"
    if any(d in first for d in ",;|"):
        return "csv"
    return "plain"


def sniff_delimiter(line: str) -> str:
    """The most frequent of , ; tab | in a header line outside quotes (',' when none)."""
    counts = dict.fromkeys(",\t;|", 0)
    quoted = False
    for ch in line:
        if ch == '"':
            quoted = not quoted
        elif not quoted and ch in counts:
            counts[ch] += 1
    best = max(counts, key=lambda d: counts[d])  # ties: the order above
    return best if counts[best] else ","


@contextmanager
def _no_field_limit() -> Iterator[None]:
    """Lift the csv module's 131,072-character field limit (dumps keep whole responses)."""
    old = csv.field_size_limit()
    csv.field_size_limit(2**31 - 1)
    try:
        yield
    finally:
        csv.field_size_limit(old)


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
        self.examples: dict[str, str] = {}  # the first raw cell skipped for each reason
        self.rows = 0
        self._buf_len: list[float] = []
        self._buf_grp: list[Any] = []
        self._buf_step: list[float] = []
        self._len_chunks: list[np.ndarray] = []
        self._grp_chunks: list[np.ndarray] = []
        self._step_chunks: list[np.ndarray] = []

    def skip(self, reason: str, n: int = 1, example: Any = None) -> None:
        if n:
            self.skipped[reason] = self.skipped.get(reason, 0) + n
            if example is not None and reason not in self.examples:
                self.examples[reason] = str(example)[:60]

    _number = staticmethod(parse_number)

    def add(self, raw_len: Any, raw_group: Any = None, raw_step: Any = None) -> None:
        self.rows += 1
        x = self._number(raw_len)
        if isinstance(x, str):
            self.skip(x, example=raw_len)
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

    def add_floats(self, x: np.ndarray) -> None:
        """Bulk path (`fast_rows`): one parsed length per row, no group or step."""
        self.flush()  # keep rows in file order (the first rejected example of each reason)
        self.rows += len(x)
        self._validate(x, None, None)

    def add_array(self, lengths: np.ndarray, reasons: np.ndarray, groups=None, steps=None) -> None:
        """Vectorised path (Parquet): floats plus a per-row reason ("" when the cell is a
        number)."""
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
        self._skip_where("zero or negative", nonpos, x)
        big = ~nan & (x > MAX_LENGTH)  # int64 would wrap these to negative lengths
        self._skip_where(TOO_LARGE, big, x)
        frac = ~nan & ~nonpos & ~big & (x != np.round(x))
        self._skip_where("non-integer", frac, x)
        ok = ~(nan | nonpos | big | frac)
        xi = x[ok].astype(np.int64)
        self.hist.add(xi)
        if self.keep_rows:
            self._len_chunks.append(xi)
            if g is not None:
                self._grp_chunks.append(np.asarray(g)[ok])
            if s is not None:
                self._step_chunks.append(np.asarray(s, float)[ok])

    def _skip_where(self, reason: str, mask: np.ndarray, x: np.ndarray) -> None:
        n = int(mask.sum())
        if n:
            self.skip(reason, n, example=f"{x[mask][0]:g}")

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
            skip_examples=dict(self.examples),
        )


def _resolve(
    columns: list[str], column: str | None, group_column: str | None, step_column: str | None
) -> tuple[str, str | None, str | None]:
    if column:
        col = find_column(columns, column, "length")
    elif columns == [VALUE_COLUMN]:  # a JSON list of bare numbers
        col = VALUE_COLUMN
    else:
        col = detect_length_column(columns)
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


def _csv_header(source: Source, fmt: str) -> tuple[list[str], io.TextIOBase, str]:
    """The header (first non-blank line), the text positioned after it, and the delimiter."""
    f = source.open_text()
    first = ""
    for line in f:
        if line.strip():
            first = line
            break
    if not first:
        raise LengthDataError(f"{source.name}: file is empty")
    delimiter = "\t" if fmt == "tsv" else sniff_delimiter(first)
    header = next(csv.reader([first], delimiter=delimiter))
    return [h.strip() for h in header], f, delimiter


def _fast_blocks(f: io.TextIOBase, acc: _Accumulator, delimiter: str, ic: int, width: int):
    """Read clean blocks of lengths in bulk (`fast_rows`); return the lines of the first block
    that needs the csv module (the rest of the file then goes row by row)."""
    while lines := f.readlines(BLOCK_CHARS):
        x = delimited_lengths(lines, delimiter, ic, width)
        if x is None:
            return lines
        acc.add_floats(x)
    return []


def _read_delimited(source, fmt, column, group_column, step_column, rnd) -> LengthData:
    header, f, delimiter = _csv_header(source, fmt)
    if len(header) == 1 and _Accumulator._number(header[0]) != "not a number" and not column:
        return _read_plain(source, rnd)
    col, grp, stp = _resolve(header, column, group_column, step_column)
    ic, ig, is_ = (
        header.index(col),
        (header.index(grp) if grp else None),
        (header.index(stp) if stp else None),
    )
    acc = _Accumulator(grp is not None or stp is not None, grp is not None, stp is not None, rnd)
    width = max(i for i in (ic, ig, is_) if i is not None)
    pending = [] if acc.keep_rows else _fast_blocks(f, acc, delimiter, ic, width)
    for row in csv.reader(itertools.chain(pending, f), delimiter=delimiter):
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        if len(row) <= width:
            acc.rows += 1
            acc.skip("short row", example=",".join(row))
            continue
        acc.add(row[ic], row[ig] if ig is not None else None, row[is_] if is_ is not None else None)
    return acc.result(source.name, col, grp, stp)


def _read_json(source, fmt, column, group_column, step_column, rnd) -> LengthData:
    records = iter_records(source, fmt)
    first = None
    junk_before = 0
    for rec in records:
        if rec is not None:
            first = rec
            break
        junk_before += 1
    if first is None:
        if junk_before:
            raise LengthDataError(
                f"{source.name}: no JSON records found ({junk_before} unparsable lines)"
            )
        raise LengthDataError(f"{source.name}: file is empty")
    paths = column_paths(first)
    col, grp, stp = _resolve(list(paths), column, group_column, step_column)
    pc = paths[col]
    pg = paths[grp] if grp else None
    ps = paths[stp] if stp else None
    acc = _Accumulator(grp is not None or stp is not None, grp is not None, stp is not None, rnd)
    acc.rows += junk_before
    acc.skip("unparsable line", junk_before)
    for rec in _chain_first(first, records):
        if rec is None:
            acc.rows += 1
            acc.skip("unparsable line")
            continue
        acc.add(
            lookup(rec, pc),
            lookup(rec, pg) if pg else None,
            lookup(rec, ps) if ps else None,
        )
    return acc.result(source.name, col, grp, stp)


def _chain_first(first, rest):
    yield first
    yield from rest


def _read_plain(source: Source, rnd: bool = False) -> LengthData:
    acc = _Accumulator(False, False, False, rnd)
    with source.open_text() as f:
        while lines := f.readlines(BLOCK_CHARS):
            x = plain_lengths(lines)
            if x is not None:
                acc.add_floats(x)
                continue
            for line in lines:
                line = line.strip()
                if line:
                    acc.add(line)
    if acc.rows == 0:
        raise LengthDataError(f"{source.name}: file is empty")
    return acc.result(source.name, "(one length per line)", None, None)


def _read_parquet(source: Source, column, group_column, step_column, rnd) -> LengthData:
    try:
        import pyarrow.parquet as pq
    except ImportError:  # pragma: no cover - depends on the environment
        raise LengthDataError(
            "reading Parquet needs pyarrow: pip install 'aprilsim[fit]'"
        ) from None
    tmp = None
    try:
        if source.gzip:
            tmp = tempfile.NamedTemporaryFile(suffix=".parquet", delete=False)
            with source.open_binary() as src:
                shutil.copyfileobj(src, tmp)
            tmp.close()
            path_to_read = tmp.name
        else:
            path_to_read = str(source.path)
        try:
            pf = pq.ParquetFile(path_to_read)
        except Exception as e:  # pyarrow raises several types for corrupt files
            raise LengthDataError(f"{source.name}: not a readable Parquet file ({e})") from None
        names = list(pf.schema_arrow.names)
        col, grp, stp = _resolve(names, column, group_column, step_column)
        acc = _Accumulator(
            grp is not None or stp is not None, grp is not None, stp is not None, rnd
        )
        cols = [c for c in (col, grp, stp) if c]
        try:
            for batch in pf.iter_batches(batch_size=CHUNK, columns=list(dict.fromkeys(cols))):
                x, reasons = _arrow_floats(batch.column(col))
                g = batch.column(grp).to_pylist() if grp else None
                s = _arrow_floats(batch.column(stp))[0] if stp else None
                acc.add_array(x, reasons, g, s)
        except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid / ArrowIOError
            raise LengthDataError(f"{source.name}: not a readable Parquet file ({e})") from None
        return acc.result(source.name, col, grp, stp)
    finally:
        if tmp is not None:
            Path(tmp.name).unlink(missing_ok=True)


def _arrow_floats(arr) -> tuple[np.ndarray, np.ndarray]:
    """A pyarrow column as floats, with the reason each unusable cell is unusable ("" if fine)."""
    import pyarrow as pa

    n = len(arr)
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    null = np.asarray(arr.is_null().to_numpy(zero_copy_only=False), bool)
    reasons = np.where(null, "missing", "").astype(object)
    if pa.types.is_decimal(arr.type):
        vals = [parse_number(None if v is None else str(v)) for v in arr.to_pylist()]
        x = np.array([np.nan if isinstance(v, str) else v for v in vals], float)
        reasons = np.array([v if isinstance(v, str) else "" for v in vals], dtype=object)
        return x, reasons
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
    path: the file (its format from the suffix, `.gz` allowed, else sniffed from the content);
        "-" reads standard input; pipes and /dev/stdin work too (they are spooled first).
    column: the length column; detected among common names when omitted.
    group_column, step_column: prompt id and training step; detected among exact common names
        when omitted, switched off with "none".
    fmt: force one of FORMATS.
    round_values: round non-integer values (mean-length curves) instead of skipping them.
    """
    try:
        with Source(path) as source:
            fmt = fmt or detect_format(source)
            if fmt not in FORMATS:
                raise LengthDataError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
            return _read(source, fmt, column, group_column, step_column, round_values)
    except EOFError:
        raise LengthDataError(
            f"{path}: compressed data ends early (a truncated gzip file?)"
        ) from None
    except (gzip.BadGzipFile, zlib.error) as e:
        raise LengthDataError(f"{path}: corrupt gzip data ({e})") from None
    except (UnicodeError, csv.Error) as e:
        raise LengthDataError(f"{path}: cannot read as {fmt or 'text'} ({e})") from None
    except RecursionError:
        raise LengthDataError(f"{path}: nested too deeply to read") from None


def _read(source: Source, fmt: str, column, group_column, step_column, rnd) -> LengthData:
    with _no_field_limit():
        if fmt in ("csv", "tsv"):
            return _read_delimited(source, fmt, column, group_column, step_column, rnd)
        if fmt in ("jsonl", "json"):
            return _read_json(source, fmt, column, group_column, step_column, rnd)
        if fmt == "parquet":
            return _read_parquet(source, column, group_column, step_column, rnd)
        return _read_plain(source, rnd)
