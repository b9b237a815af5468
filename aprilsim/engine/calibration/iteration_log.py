"""Read the bundled engine's per-iteration log (`python -m real.serve --iteration-log FILE`, or the
JSON of ``GET /iteration_log``) into timing records.

Each line is one engine step (`real.torch_engine.engine.IterationRecord`): ``seq``, ``phase``,
``batch_size``, ``prefill_tokens``, ``kv_tokens`` (KV held *after* the step), ``running``,
``retracted``, ``duration_s`` (compute time, without ``--min-step-seconds`` padding), ...

The cost model wants the KV held at the *start* of a decode iteration: that is the previous step's
``kv_tokens`` when the previous step is the one just before (consecutive ``seq``) and nothing was
retracted; otherwise ``kv_tokens - running`` (each running request added one token; requests that
finished in the step are not counted, so this under-counts slightly). The log has no per-request
prefill sizes, so a prefill batch's sum of squares is estimated as if its requests were of equal
size (exact for single-request prefills, which is what live calibration runs).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .records import Record

REQUIRED = ("seq", "phase", "batch_size", "prefill_tokens", "kv_tokens", "duration_s")


def records_from_iterations(rows: list[dict[str, Any]],
                            where: str = "iteration log") -> list[Record]:
    """Records from iteration-log dicts (in seq order); idle or zero-duration steps are skipped."""
    out: list[Record] = []
    prev: dict[str, Any] | None = None
    for i, row in enumerate(rows, start=1):
        missing = [k for k in REQUIRED if k not in row]
        if missing:
            raise ValueError(f"{where}: record {i} lacks {', '.join(missing)}")
        try:
            phase = str(row["phase"])
            batch = int(row["batch_size"])
            dur = float(row["duration_s"])
            kv_after = float(row["kv_tokens"])
            seq = int(row["seq"])
        except (TypeError, ValueError):
            raise ValueError(f"{where}: record {i} has a non-numeric field") from None
        if phase in ("decode", "prefill") and batch >= 1 and dur > 0:
            if phase == "decode":
                consecutive = prev is not None and int(prev["seq"]) == seq - 1
                if consecutive and not int(row.get("retracted", 0) or 0):
                    kv = float(prev["kv_tokens"])  # type: ignore[index]
                else:
                    kv = max(kv_after - int(row.get("running", batch)), 0.0)
                out.append(Record("decode", batch, kv, 0, dur))
            elif int(row["prefill_tokens"]) >= 1:
                out.append(Record("prefill", batch, 0.0, int(row["prefill_tokens"]), dur))
        prev = row
    return out


def read_iteration_log(path: str | Path) -> list[Record]:
    """Records from a JSON-lines iteration log, or from a saved ``/iteration_log`` response
    (``{"records": [...], "last_seq": N}``)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ValueError(f"cannot read {p}: {e.strerror}") from None
    stripped = text.lstrip()
    rows: list[dict[str, Any]]
    if stripped.startswith("{") and '"records"' in stripped[:200] and "\n{" not in stripped.strip():
        try:
            rows = list(json.loads(text)["records"])
        except (json.JSONDecodeError, KeyError, TypeError):
            raise ValueError(f"{p}: not an /iteration_log response") from None
    else:
        rows = []
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                raise ValueError(f"{p}:{n}: not a JSON line") from None
            if not isinstance(row, dict):
                raise ValueError(f"{p}:{n}: not a JSON object")
            rows.append(row)
    rows.sort(key=lambda r: r.get("seq", 0) if isinstance(r.get("seq"), int) else 0)
    recs = records_from_iterations(rows, str(p))
    if not recs:
        raise ValueError(f"{p}: no decode or prefill steps")
    return recs
