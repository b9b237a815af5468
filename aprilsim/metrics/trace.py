"""Per-request traces: what each submission did on which engine, and when.

The simulator and the live runner write the same format, so one timeline figure and one calibration
reader serve both. A trace is three tables: requests (one row per submission of a sample), engine
samples (running batch size and KV tokens over time, per engine) and phases (trainer and weight-sync
bands). On disk it is JSON Lines, one object per row with a `kind` field ("request", "engine",
"phase") and a first `{"kind": "meta", ...}` row.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

TRACE_FORMAT_VERSION = 1

EndReason = Literal["stop", "length", "abort", "capped", "failed"]


@dataclass(slots=True)
class RequestSpan:
    """One submission of one sample, from submit to its end on one engine."""

    engine: int
    rid: int
    sample_uid: int
    group_id: int
    version: int  # policy version the tokens of this submission are generated under
    submit_s: float
    end_s: float
    tokens: int  # generated in this submission
    reason: EndReason
    carried: int = 0  # tokens the sample carried in (a resumed partial when > 0)
    first_token_s: float | None = None  # None where the runtime does not observe it
    retractions: int = 0
    # when the engine's server had it (live: its response headers); None where not observed
    accepted_s: float | None = None


@dataclass(slots=True)
class EngineSample:
    """The state of one engine at time `t` (a step curve: it holds until the next sample)."""

    engine: int
    t: float
    running: int
    kv_tokens: int


@dataclass(slots=True)
class PhaseSpan:
    """A trainer or weight-sync band, a rollout phase, or an abort (live runs: from its send
    to the last request it brought back), in wall or simulated time."""

    phase: Literal["rollout", "train", "sync", "abort"]
    step: int
    start_s: float
    end_s: float


@dataclass
class Trace:
    """Everything a timeline figure or a calibration needs from one run of one scheduler."""

    scheduler: str
    n_engines: int
    source: Literal["sim", "live"] = "sim"
    requests: list[RequestSpan] = field(default_factory=list)
    engine_samples: list[EngineSample] = field(default_factory=list)
    phases: list[PhaseSpan] = field(default_factory=list)

    def rows(self) -> Iterator[dict[str, Any]]:
        """The trace as JSON-ready rows: the meta row, then requests, engine samples, phases."""
        yield {
            "kind": "meta",
            "format": TRACE_FORMAT_VERSION,
            "scheduler": self.scheduler,
            "n_engines": self.n_engines,
            "source": self.source,
        }
        for kind, items in (
            ("request", self.requests),
            ("engine", self.engine_samples),
            ("phase", self.phases),
        ):
            for it in items:
                yield {"kind": kind, **asdict(it)}

    def write(self, path: str | Path) -> Path:
        """Write the trace as JSON Lines; return the path written."""
        p = Path(path)
        with p.open("w") as f:
            for row in self.rows():
                f.write(json.dumps(row) + "\n")
        return p

    @classmethod
    def from_rows(cls, rows: Iterable[dict[str, Any]]) -> Trace:
        """Rebuild a trace from `rows()` output; ValueError on a missing meta row or bad kind."""
        it = iter(rows)
        meta = next(it, None)
        if meta is None or meta.get("kind") != "meta":
            raise ValueError("a trace starts with a meta row")
        if meta.get("format") != TRACE_FORMAT_VERSION:
            raise ValueError(f"trace format {meta.get('format')!r}, expected "
                             f"{TRACE_FORMAT_VERSION}")
        tr = cls(scheduler=meta["scheduler"], n_engines=int(meta["n_engines"]),
                 source=meta["source"])
        makers = {"request": (RequestSpan, tr.requests),
                  "engine": (EngineSample, tr.engine_samples),
                  "phase": (PhaseSpan, tr.phases)}
        for row in it:
            kind = row.pop("kind", None)
            if kind not in makers:
                raise ValueError(f"unknown trace row kind {kind!r}")
            typ, out = makers[kind]
            out.append(typ(**row))
        return tr

    @classmethod
    def read(cls, path: str | Path) -> Trace:
        """Read a trace written by `write`."""
        with Path(path).open() as f:
            return cls.from_rows(json.loads(line) for line in f if line.strip())
