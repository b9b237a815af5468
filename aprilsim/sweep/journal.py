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


def table_paths(out: Path) -> dict[str, Path]:
    """The files a sweep writes for `out` (a .parquet path): its tables, then its journal."""
    return {"table": out.with_suffix(".parquet"), "table_csv": out.with_suffix(".csv"),
            "aggregate": out.with_name(out.stem + ".agg.parquet"),
            "aggregate_csv": out.with_name(out.stem + ".agg.csv"), "journal": journal_path(out)}


def claim_outputs(out: Path, force: bool) -> None:
    """Refuse (OutputTaken, one line) tables at `out` that no sweep journal vouches for: a user's
    own `mine.parquet` or `mine.csv` is never replaced unless `force`, which starts over."""
    from aprilsim.outputs import OutputTaken

    paths = table_paths(out)
    if force:
        for p in paths.values():
            if p.is_file():
                p.unlink()
        return
    if paths["journal"].exists():
        return  # our own sweep: resumed (Journal checks it is the same base scenario)
    taken = [p for p in paths.values() if p.exists()]
    if taken:
        raise OutputTaken(
            f"--out {out}: {taken[0].name} exists and no sweep journal ({paths['journal'].name}) "
            "says a sweep wrote it; choose another --out, or --force to replace "
            f"{', '.join(p.name for p in taken)}")


def merged_keys_check(rows: list[dict[str, Any]], keys: list[str], out: Path) -> None:
    """OutputTaken when the sweep resumed at `out` swept other keys than `keys`: one table of
    two unrelated grids has no meaning (the same keys at other values extend it)."""
    from aprilsim.outputs import OutputTaken

    before: list[str] = []
    for r in rows:
        for k, _ in json.loads(r["point_id"]):
            if k not in before:
                before.append(k)
    if rows and sorted(before) != sorted(keys):
        raise OutputTaken(
            f"--out {out}: holds a sweep over {', '.join(before) or 'no key'}, this one sweeps "
            f"{', '.join(keys) or 'no key'}; choose another --out, or --force to start over")


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
                    f"{path}: holds a sweep of another base scenario (scenario, --steps or "
                    "--warmup differ); choose another --out or delete it"
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
