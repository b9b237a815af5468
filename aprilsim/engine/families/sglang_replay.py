"""Replay golden engine traces (recorded from a real scheduler) through aprilsim's
`ReferenceEngine` and compare them step by step (issue 34).

A trace is one workload (`experiments/sglang_trace_workloads.py`) with the steps the real
scheduler ran (format: tests/data/engine_traces/sglang-0.5.23/README.md). The replay runs the
same requests on a `ReferenceEngine` whose every step lasts one time unit (decode a = 1, prefill
p0 = 1 per forward pass, nothing else), so time is the step index: a request arriving at step s
is submitted at time s, an abort at the start of step s is sent during step s - 1 and lands one
decode step later (`abort_after_steps(s - 0.5, 1)`, SGLang's "abort method 3"). A `StepObserver`
wraps the engine's `advance` and writes each event as the same records: a prefill forward pass
(with chunked prefill each pass is one event: `Rules.select_pass`) with the tokens each request
computes in it, a decode step with its batch, retractions (in retraction order), finishes and the
new-token ratio.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from aprilsim.engine.cost import CostModel, EngineSpec
from aprilsim.engine.families.sglang import SGLangFamily, SGLangRules
from aprilsim.engine.parts import DECODE, PREFILL
from aprilsim.engine.reference import ReferenceEngine
from aprilsim.engine.request import Completion, Request

INF = float("inf")
RATIO_TOL = 1e-9  # SGLang subtracts the decay step by step, aprilsim in closed form


def load(path: str) -> Iterator[dict[str, Any]]:
    """The workloads of a gzipped JSON-lines trace file."""
    with gzip.open(path, "rt") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def sglang_spec(cfg: dict[str, Any]) -> EngineSpec:
    """aprilsim's `EngineSpec` for a recorded SGLang config (SGLang 0.5.23's defaults for the
    rest: ratio 0.7 decaying over 600 steps to x0.14, 20 retract steps, clip 4,096, tail
    requeue, aborts one decode step late), with unit step costs."""
    return EngineSpec(
        cost=CostModel(a=1.0, b=0.0, c=0.0, p0=1.0, p1=0.0, p2=0.0),
        kv_capacity=cfg["kv_tokens"], max_running=cfg["max_running_requests"],
        max_prefill_tokens=cfg["max_prefill_tokens"], new_token_ratio=0.7,
        new_token_ratio_decay_steps=600, min_new_token_ratio_factor=0.14,
        retract_decode_steps=20, clip_max_new_tokens=4096,
        family=SGLangFamily(retract_to="tail", abort_steps=1),
        chunked_prefill_size=cfg["chunked_prefill_size"],
        prefix_cache="lru" if cfg.get("radix_cache") else "none",
    )


def batch_crc(rids: list[int]) -> int:
    """The decode batch fingerprint the harness records (sorted request ids)."""
    return zlib.crc32(",".join(map(str, sorted(rids))).encode())


@dataclass
class Step:
    """One engine step in comparable form (both sides)."""

    kind: str  # "E" extend (a prefill forward pass), "D" decode
    pieces: list[tuple[int, int]] = field(default_factory=list)  # E: (rid, tokens) in order
    bs: int = 0  # D: batch size
    crc: int = 0  # D: batch fingerprint
    retracted: list[int] = field(default_factory=list)
    finished: list[tuple[int, int, str]] = field(default_factory=list)
    ratio: float = -1.0

    def key(self) -> tuple[Any, ...]:
        """Everything compared but the ratio (compared with a tolerance)."""
        return (self.kind, self.pieces, self.bs, self.crc, self.retracted, sorted(self.finished))


def sglang_steps(w: dict[str, Any]) -> tuple[dict[int, Step], dict[int, set[tuple[int, int]]]]:
    """The recorded steps by index, and per abort step the (rid, tokens) it aborted."""
    steps: dict[int, Step] = {}
    aborts: dict[int, set[tuple[int, int]]] = {}
    last: Step | None = None
    for rec in w["steps"]:
        kind, s = rec[0], rec[1]
        if kind == "E":
            steps[s] = last = Step("E", [(p[0], p[1]) for p in rec[2]],
                                   finished=[tuple(f) for f in rec[3]], ratio=rec[4])
        elif kind == "D":
            steps[s] = last = Step("D", bs=rec[2], crc=rec[3], retracted=list(rec[4]),
                                   finished=[tuple(f) for f in rec[5]], ratio=rec[6])
        elif kind == "R":
            assert last is not None and last.kind == "D"
            for i in range(rec[2]):
                steps[s + i] = Step("D", bs=last.bs, crc=last.crc, ratio=-1.0)
        elif kind == "A":
            aborts[s] = {(a[0], a[1]) for a in rec[2]}
    return steps, aborts


class StepObserver:
    """Wraps a `ReferenceEngine`'s `advance` and records each event as `Step`s keyed by the
    step index (its start time). Touches nothing in the engine's logic."""

    def __init__(self, eng: ReferenceEngine) -> None:
        self.eng = eng
        self.steps: dict[int, Step] = {}
        self._retractions = 0
        self._seen: dict[int, int] = {}  # retractions of each request already reported
        self._crc: tuple[int, int] | None = None  # (bs, crc) of the decode batch, kept while clean
        self._dirty = True
        real = eng.advance

        def advance() -> list[Completion]:
            self._observe()
            done = real()
            if done:
                self._dirty = True
                for c in done:
                    self._last.finished.append((c.rid, c.tokens, c.reason))
            return done

        setattr(eng, "advance", advance)  # noqa: B010 (an instance attribute over the method)

    def _observe(self) -> None:
        eng = self.eng
        t = int(round(eng.t))
        if eng.phase == PREFILL:
            self._dirty = True
            self._last = self._prefill(t)
        elif eng.phase == DECODE:
            step = Step("D")
            if eng.stats.retractions != self._retractions:
                self._retractions = eng.stats.retractions
                self._dirty = True
                step.retracted = self._victims()
            if self._dirty or self._crc is None:
                rids = [r.rid for r in eng.running]
                self._crc = (len(rids), batch_crc(rids))
                self._dirty = False
            step.bs, step.crc = self._crc
            step.ratio = self._ratio(1)
            self.steps[t] = self._last = step

    def _ratio(self, ahead: int) -> float:
        """SGLang's new-token ratio `ahead` decode steps after the engine's last one (a decode
        step decays it before it runs)."""
        rules = self.eng.rules
        assert isinstance(rules, SGLangRules)
        return rules.ratio_at(rules.base, self.eng.it - rules.it0 + ahead)

    def _victims(self) -> list[int]:
        """Requests retracted at this boundary, in retraction order: the queued requests with a
        fresh retraction, in queue order (retracted requests are requeued at the tail in order)."""
        eng = self.eng
        seen = self._seen
        fresh = [r for r in eng.waiting if r.retractions and seen.get(r.rid) != r.retractions]
        for r in fresh:
            seen[r.rid] = r.retractions
        return [r.rid for r in fresh]  # SGLang's tail requeue keeps the retraction order

    def _prefill(self, t: int) -> Step:
        """A prefill forward pass: its requests, each with the tokens it computes in it."""
        eng = self.eng
        lens = eng.batch_chunks if eng.batch_recs else eng.batch_pieces[0]
        self.steps[t] = Step("E", [(r.rid, n) for r, n in zip(eng.batch, lens)],
                             ratio=self._ratio(0))
        return self.steps[t]


def replay(w: dict[str, Any]) -> tuple[dict[int, Step], dict[int, set[tuple[int, int]]]]:
    """Run a recorded workload through aprilsim's ReferenceEngine; its steps and aborts."""
    eng = ReferenceEngine(sglang_spec(w["config"]))
    obs = StepObserver(eng)
    todo: list[tuple[float, int, list[Request]]] = [(s - 0.5, s, []) for s in w["abort_all_steps"]]
    arrivals: dict[int, list[Request]] = {}
    for r in w["requests"]:
        arrivals.setdefault(r["arrival_step"], []).append(
            Request(r["rid"], r["prompt_len"], r["max_new_tokens"], r["target_len"]))
    todo += [(float(s), s, reqs) for s, reqs in arrivals.items()]
    todo.sort(key=lambda x: x[0], reverse=True)  # popped from the end, earliest first
    aborts: dict[int, set[tuple[int, int]]] = {}
    while todo or eng.t_event != INF:
        if todo and (todo[-1][0] <= eng.t_event or eng.t_event == INF):
            at, s, reqs = todo.pop()
            if reqs:
                eng.submit(reqs, at)
            else:  # an abort of everything, sent during step s - 1
                _, out = eng.abort_after_steps(at, 1)
                # what it caught (the step in flight's own finishes are that step's)
                aborts[s] = {(c.rid, c.tokens) for c in out if c.reason == "abort" or c.time > s}
        else:
            eng.advance()
    return obs.steps, aborts


@dataclass
class Agreement:
    """How one workload's replay compares with its recorded steps."""

    wid: str
    steps: int = 0  # recorded steps compared
    equal: int = 0
    first_diff: str = ""
    first_kind: str = ""  # what the first difference is (`classify`)

    @property
    def ok(self) -> bool:
        return self.steps == self.equal


def compare(w: dict[str, Any]) -> Agreement:
    """Step-by-step agreement of aprilsim with one recorded workload."""
    want, want_ab = sglang_steps(w)
    got, got_ab = replay(w)
    out = Agreement(w["id"])
    abort_steps = set(want_ab)
    for s in sorted(set(want) | set(got)):
        a, b = want.get(s), got.get(s)
        out.steps += 1
        if _same(a, b, s in abort_steps):
            out.equal += 1
        elif not out.first_diff:
            out.first_diff = f"step {s}: sglang {a} / aprilsim {b}"
            out.first_kind = classify(a, b)
    for s in abort_steps:
        fin = {(f[0], f[1]) for f in want[s].finished} if s in want else set()
        if want_ab[s] | fin != got_ab.get(s, set()) and not out.first_diff:
            out.first_diff = f"abort at {s}: sglang {sorted(want_ab[s] | fin)[:8]} / " \
                             f"aprilsim {sorted(got_ab.get(s, set()))[:8]}"
            out.equal -= 1
    return out


def _same(a: Step | None, b: Step | None, abort: bool) -> bool:
    """Equal steps: batch, pieces, retractions, finishes (aborts compared apart), ratio."""
    if a is None or b is None:
        return False
    if abort:  # the abort's decode step: its finishes are the aborted requests
        a = Step(a.kind, a.pieces, a.bs, a.crc, a.retracted, [], a.ratio)
        b = Step(b.kind, b.pieces, b.bs, b.crc, b.retracted, [], b.ratio)
    if a.key() != b.key():
        return False
    return a.ratio < 0 or abs(a.ratio - b.ratio) <= RATIO_TOL


def classify(a: Step | None, b: Step | None) -> str:
    """Name a first difference: "prefill pass" (both sides run a prefill forward pass with other
    requests or pieces), "prefill vs decode" (one side prefills, the other decodes),
    "retraction", "finish", "ratio", "other"."""
    if a is None or b is None:
        return "other"
    if a.kind == b.kind == "E":
        if a.pieces != b.pieces:
            return "prefill pass"
        return "finish" if sorted(a.finished) != sorted(b.finished) else "ratio"
    if a.kind != b.kind:
        return "prefill vs decode"
    if a.retracted != b.retracted:
        return "retraction"
    if sorted(a.finished) != sorted(b.finished):
        return "finish"
    return "ratio" if (a.bs, a.crc) == (b.bs, b.crc) else "other"
