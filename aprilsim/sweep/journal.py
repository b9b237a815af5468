"""The journal: one JSON line per finished run, appended and flushed as each run finishes.

It lives beside the output (`results.parquet` -> `results.journal.jsonl`) and is what a second run
with the same output reads to skip finished runs, so a crash or Ctrl-C loses at most the runs in
flight. Its first line names the base scenario (a fingerprint); resuming a different sweep into
the same output is refused. A torn last line (a kill mid-write) is ignored.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from aprilsim.config import ScenarioError

FORMAT = "aprilsim-sweep-journal/1"


def journal_path(out: Path) -> Path:
    return out.with_name(out.stem + ".journal.jsonl")


def _clean(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else v


class Journal:
    """Append-only JSONL of result rows for one sweep fingerprint."""

    def __init__(self, path: Path, fingerprint: str, base: dict[str, Any]) -> None:
        self.path = path
        self.rows: list[dict[str, Any]] = []
        header = {"format": FORMAT, "fingerprint": fingerprint, "base": base}
        if path.exists() and path.stat().st_size:
            text = path.read_text()
            lines = text.splitlines()
            try:
                head = json.loads(lines[0])
            except ValueError:
                head = {}
            if head.get("format") != FORMAT:
                raise ScenarioError(f"{path}: not an aprilsim sweep journal")
            if head.get("fingerprint") != fingerprint:
                raise ScenarioError(
                    f"{path}: holds a sweep of another base scenario (scenario, --steps or --warmup "
                    "differ); choose another --out or delete it"
                )
            for line in lines[1:]:
                try:
                    self.rows.append(json.loads(line))
                except ValueError:
                    continue  # torn last line
            self._f = path.open("a")
            if not text.endswith("\n"):
                self._f.write("\n")
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._f = path.open("w")
            self._f.write(json.dumps(header) + "\n")
        self._f.flush()

    def done(self) -> set[tuple[str, str, int]]:
        return {(r["point_id"], r["scheduler"], int(r["seed"])) for r in self.rows}

    def append(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            self._f.write(json.dumps({k: _clean(v) for k, v in row.items()}) + "\n")
            self.rows.append(row)
        self._f.flush()

    def close(self) -> None:
        self._f.close()
