"""Golden engine traces: what a real scheduler did with a workload, step by step, in a file.

A trace file (``*.jsonl.xz``, tests/data/engine_traces/<family>-<version>/) holds one JSON object
per line, one per workload:

- ``family``, ``version``: the engine and its version (``"vllm"``, ``"0.32.0"``);
- ``workload``: the workload (`workloads.Workload.to_json`); ``engine``: the family's own
  configuration derived from the workload's limits (for vLLM: num_blocks, block_size, ...);
- ``steps``: run-length-encoded step records ``[step, count, sched, preempted, finished,
  admitted, free]``: from engine step ``step`` on, ``count`` consecutive steps each scheduled
  ``sched`` (flat ``[request id, tokens, ...]`` in the scheduler's order), preempted the sorted
  ids ``preempted``, finished (stop or length) ``finished`` in the order the engine processed
  them, admitted into the running batch ``admitted`` (flat ``[request id, prefix-cache hit
  tokens, ...]``); ``free`` is the engine's free KV (vLLM: free blocks) after the run's last step.
  Steps where the engine had nothing to do are absent (the step counter jumps to the next event);
- ``events``: ``["abort", step, id, outputs]`` for each abort that caught a live request (its
  outputs so far), ``["resubmit", step, id, prompt_len, max_tokens]`` for each partial sent again;
- ``summary``: counts of what the trace reaches (`reach`), and the recording's wall time.

Only steps whose records are equal (no admission, finish or preemption: runs of identical decode
steps) merge into one record, so a file stays small while every step is checked.
"""

from __future__ import annotations

import json
import lzma
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aprilsim.engine.families.workloads import Workload


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One engine step as the trace sees it (see the module docstring for the fields)."""

    sched: tuple[int, ...]
    preempted: tuple[int, ...] = ()
    finished: tuple[int, ...] = ()
    admitted: tuple[int, ...] = ()
    free: int = 0

    def same_plan(self, other: StepRecord) -> bool:
        """Equal in everything but the free KV (steps that merge into one run)."""
        return (self.sched == other.sched and self.preempted == other.preempted
                and self.finished == other.finished and self.admitted == other.admitted)


@dataclass(slots=True)
class Run:
    """`count` consecutive steps from `step`, each like `record`; `free` is after the last."""

    step: int
    count: int
    record: StepRecord

    def to_json(self) -> list[Any]:
        r = self.record
        return [self.step, self.count, list(r.sched), list(r.preempted), list(r.finished),
                list(r.admitted), r.free]

    @staticmethod
    def from_json(x: list[Any]) -> Run:
        step, count, sched, pre, fin, adm, free = x
        return Run(step, count, StepRecord(tuple(sched), tuple(pre), tuple(fin), tuple(adm), free))


@dataclass(slots=True)
class Trace:
    """One workload's trace (the module docstring describes the file form)."""

    family: str
    version: str
    workload: Workload
    engine: dict[str, Any]
    runs: list[Run] = field(default_factory=list)
    events: list[list[Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)

    def add_step(self, step: int, record: StepRecord) -> None:
        """Append engine step `step`, merging it into the last run when the plan repeats."""
        last = self.runs[-1] if self.runs else None
        if (last is not None and last.step + last.count == step
                and last.record.same_plan(record)):
            last.count += 1
            last.record = record
        else:
            self.runs.append(Run(step, 1, record))

    @property
    def num_steps(self) -> int:
        """Engine steps recorded (each run counts its steps)."""
        return sum(r.count for r in self.runs)

    def to_json(self) -> dict[str, Any]:
        return {"family": self.family, "version": self.version,
                "workload": self.workload.to_json(), "engine": self.engine,
                "steps": [r.to_json() for r in self.runs], "events": self.events,
                "summary": self.summary}

    @staticmethod
    def from_json(d: dict[str, Any]) -> Trace:
        return Trace(d["family"], d["version"], Workload.from_json(d["workload"]), d["engine"],
                     [Run.from_json(x) for x in d["steps"]], d["events"], d["summary"])


def reach(trace: Trace) -> dict[str, int]:
    """What a trace exercises, counted from its records and events (engine-neutral)."""
    out = {"steps": 0, "records": len(trace.runs), "preemptions": 0, "preempting_steps": 0,
           "finished": 0, "admissions": 0, "prefix_hits": 0, "hit_tokens": 0,
           "prefill_chunks": 0, "mixed_steps": 0, "aborts": 0, "resubmits": 0, "max_batch": 0}
    for run in trace.runs:
        r = run.record
        out["steps"] += run.count
        out["preemptions"] += len(r.preempted)
        out["preempting_steps"] += 1 if r.preempted else 0
        out["finished"] += len(r.finished)
        out["admissions"] += len(r.admitted) // 2
        hits = r.admitted[1::2]
        out["prefix_hits"] += sum(1 for h in hits if h > 0)
        out["hit_tokens"] += sum(hits)
        toks = r.sched[1::2]
        new = set(r.admitted[::2])
        # a later chunk of a chunked prefill: a running request given more than one token
        later = sum(1 for rid, n in zip(r.sched[::2], toks) if n > 1 and rid not in new)
        out["prefill_chunks"] += later * run.count
        n_prefill = sum(1 for n in toks if n > 1)
        out["mixed_steps"] += run.count if 0 < n_prefill < len(toks) else 0
        out["max_batch"] = max(out["max_batch"], len(toks))
    for ev in trace.events:
        out["aborts" if ev[0] == "abort" else "resubmits"] += 1
    return out


def write_traces(path: Path, traces: Iterable[Trace]) -> int:
    """Write `traces` to an xz-compressed JSON-lines file, one xz stream per trace (written as
    each comes: an interrupted recording leaves a valid file); returns how many."""
    n = 0
    with open(path, "wb") as f:
        for t in traces:
            line = json.dumps(t.to_json(), separators=(",", ":")) + "\n"
            f.write(lzma.compress(line.encode(), preset=9 | lzma.PRESET_EXTREME))
            f.flush()
            n += 1
    return n


def read_traces(path: Path) -> Iterator[Trace]:
    """The traces of one file, in order."""
    with lzma.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield Trace.from_json(json.loads(line))


def trace_files(folder: Path) -> list[Path]:
    """The trace files of a folder, sorted."""
    return sorted(folder.glob("*.jsonl.xz"))
