"""Timing records, the common input of every calibration source.

A record is one engine step: a decode iteration (``batch_size`` running requests holding
``kv_tokens`` KV tokens at its start) or a prefill batch (``batch_size`` requests,
``prefill_tokens``
input tokens in all, whose squares sum to ``prefill_tokens_sq``), and how long it took. Every reader
(CSV, the bundled engine's iteration log, SGLang's scheduler log, Vidur profiles, a live engine)
produces these, so one fitting routine serves them all.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

PHASES = ("decode", "prefill")


@dataclass(frozen=True)
class Record:
    """One timed engine step. ``prefill_tokens_sq`` None: estimated as if the batch's requests
    were of equal size (``prefill_tokens**2 / batch_size``, exact for one request).
    ``averaged``: the mean of several steps (a fitting bin), whose mean sum of squares may lie
    outside what one step of the mean size allows (the mean of 100^2 and 104^2 is not 102^2)."""

    phase: str
    batch_size: int
    kv_tokens: float
    prefill_tokens: int
    duration_s: float
    prefill_tokens_sq: float | None = None
    averaged: bool = field(default=False, kw_only=True, repr=False)

    def __post_init__(self) -> None:
        for name in ("kv_tokens", "duration_s", "prefill_tokens_sq"):
            v = getattr(self, name)
            if v is not None and not math.isfinite(v):
                raise ValueError(f"{name} must be finite, got {v}")
        if self.phase not in PHASES:
            raise ValueError(f"phase must be decode or prefill, got {self.phase!r}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.kv_tokens < 0 or self.prefill_tokens < 0:
            raise ValueError("kv_tokens and prefill_tokens must be >= 0")
        if not self.duration_s > 0:
            raise ValueError(f"duration_s must be > 0, got {self.duration_s}")
        if self.phase == "prefill" and self.prefill_tokens < 1:
            raise ValueError("a prefill record needs prefill_tokens >= 1")
        if self.prefill_tokens_sq is not None and self.phase == "prefill" and not self.averaged:
            n, b = self.prefill_tokens, self.batch_size
            # b requests of sizes >= 1 summing to n: sum(n_i^2) lies in [n^2/b, (n-b+1)^2 + b-1]
            lo, hi = n * n / b, (n - b + 1) ** 2 + (b - 1)
            tol = 1e-4 * hi  # CSV round trips
            if b > n or not lo - tol <= self.prefill_tokens_sq <= hi + tol:
                raise ValueError(f"prefill_tokens_sq {self.prefill_tokens_sq:g} is impossible for "
                                 f"{b} request(s) of {n} tokens in all (must lie in "
                                 f"[{lo:g}, {hi:g}])")

    @property
    def tokens_sq(self) -> float:
        """Sum of squared request sizes of a prefill (equal-size estimate when not given)."""
        if self.prefill_tokens_sq is not None:
            return float(self.prefill_tokens_sq)
        return self.prefill_tokens**2 / self.batch_size


CSV_COLUMNS = ("phase", "batch_size", "kv_tokens", "prefill_tokens", "duration_s")


def _num(row: dict[str, str], key: str, where: str, kind: type = float) -> float:
    raw = (row.get(key) or "").strip()
    if raw == "":
        return 0
    try:
        v = float(raw)
    except ValueError:
        raise ValueError(f"{where}: column {key} is not a number: {raw!r}") from None
    if not math.isfinite(v):
        raise ValueError(f"{where}: column {key} must be finite, got {raw!r}")
    if kind is int:
        if v != int(v):
            raise ValueError(f"{where}: column {key} must be a whole number, got {raw!r}")
        return int(v)
    return v


def read_csv(path: str | Path) -> list[Record]:
    """Records from a CSV with columns phase, batch_size, kv_tokens, prefill_tokens, duration_s.

    Optional columns for prefill rows: ``prefill_tokens_sq`` (sum of squared request sizes) or
    ``prefill_sizes`` (the requests' sizes separated by ``;`` or spaces; fills batch_size,
    prefill_tokens and the squares when those are empty). Raises ValueError naming file and line.
    """
    p = Path(path)
    try:
        fh = p.open(newline="")
    except OSError as e:
        raise ValueError(f"cannot read {p}: {e.strerror}") from None
    with fh:
        reader = csv.DictReader(fh)
        missing = [c for c in CSV_COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(f"{p}: missing column(s) {', '.join(missing)} "
                             f"(need {', '.join(CSV_COLUMNS)})")
        out = []
        for i, row in enumerate(reader, start=2):
            where = f"{p}:{i}"
            out.append(_csv_record(row, where))
    if not out:
        raise ValueError(f"{p}: no rows")
    return out


def _csv_record(row: dict[str, str], where: str) -> Record:
    phase = (row.get("phase") or "").strip().lower()
    batch = int(_num(row, "batch_size", where, int))
    tokens = int(_num(row, "prefill_tokens", where, int))
    sq: float | None = None
    if (row.get("prefill_tokens_sq") or "").strip():
        sq = _num(row, "prefill_tokens_sq", where)
    sizes_raw = (row.get("prefill_sizes") or "").replace(";", " ").split()
    if sizes_raw:
        try:
            sizes = [int(s) for s in sizes_raw]
        except ValueError:
            raise ValueError(f"{where}: prefill_sizes must be integers") from None
        if min(sizes) < 1:
            raise ValueError(f"{where}: prefill_sizes must be >= 1, got {min(sizes)}")
        batch = batch or len(sizes)
        tokens = tokens or sum(sizes)
        sq = float(sum(s * s for s in sizes)) if sq is None else sq
    try:
        return Record(phase, batch, _num(row, "kv_tokens", where), tokens,
                      _num(row, "duration_s", where), sq)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def write_csv(records: Iterable[Record], path: str | Path) -> None:
    """Write records in the CSV form `read_csv` reads (with prefill_tokens_sq)."""
    with Path(path).open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([*CSV_COLUMNS, "prefill_tokens_sq"])
        for r in records:
            sq = "" if r.phase == "decode" else f"{r.tokens_sq:g}"
            w.writerow([r.phase, r.batch_size, f"{r.kv_tokens:g}", r.prefill_tokens,
                        f"{r.duration_s:.9g}", sq])
