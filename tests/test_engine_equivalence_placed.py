"""Fast == reference at users' scale with Seer's placement (issue 21): priorities, routing, migrated KV.

The small-KV priority property (tests/test_engine_equivalence.py) reaches each new action on
caches of 500-3,000 tokens; this one runs them together in the regime users run: 16k caps, KV of
100k-400k tokens per engine under the presets' SGLang rules (decaying new-token ratio, the 4,096
clip, retraction to the tail, chunked prefill of 8,192 tokens, aborts landing one decode step
late), the retained prefix cache or none. A driver plays Seer's life cycle on 1-3 engines: groups
whose first response is a probe at top priority, responses in pieces of a few thousand tokens,
each returned piece (capped, or aborted) sent again at its group's new length estimate (a
re-prioritised requeue) to the router's engine, a fixed one or the engine with the most room, its
KV migrated with it (when no prefix cache); aborts, pauses and interrupting weight updates meet
it mid-flight. Every completion (request, tokens, reason, time to 1e-9), every statistic and the
cache's runs must agree; the examples must reach what they name (asserted shares of examples):
priority inversions actually served (a later, higher-priority request admitted while an earlier,
lower-priority one waits), migrated KV prefilled and moved to another engine, retractions among
mixed priorities and of migrated requests, the clip binding while the queue waits, pieces and
whole responses hitting their caps, cache hits, aborts landing a step late.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from engine_agreement import assert_engines_agree
from hypothesis import event, given, settings, target
from hypothesis import strategies as st
from test_engine_equivalence import _no_mined_constants

from aprilsim.config import default_scenario
from aprilsim.engine.cost import SGLANG_RULES, EngineSpec
from aprilsim.engine.fast import FastEngine
from aprilsim.engine.parts import PREFILL
from aprilsim.engine.reference import ReferenceEngine
from aprilsim.engine.request import Completion, Request
from aprilsim.engine.router import make_router

PRESET = default_scenario().engine_spec()  # the presets' default cost and SGLang's rules
CAP = 16_384  # max_response_len of the default scenario
TOP = CAP + 1  # a probe's priority: above every length estimate (Seer's probe)
MOST_ROOM = "most_room"


@dataclass
class PlacedCase:
    """Engines, groups and outside calls of one example."""

    spec: EngineSpec
    engines: int
    router: str
    chunk: int  # tokens per piece (0: a response in one piece)
    probe: bool  # each group's first response goes first, at top priority
    migrate: bool  # resumed pieces bring their KV (Submit.keep_kv; never with a prefix cache)
    # per group: (arrival time, prompt length, route: None | engine index | MOST_ROOM, targets)
    groups: list[tuple[float, int, int | str | None, list[int]]]
    timed: list[tuple[float, str, float]]  # (time, kind, duration)
    base_priority: list[int] = field(default_factory=list)  # per group: its first non-probe priority


@st.composite
def placed_cases(draw) -> PlacedCase:
    """1-3 engines of 100k-400k KV tokens under the presets' SGLang rules, aborts one step late;
    groups of 2-8 responses (16k caps, lengths long-tailed) on prompts of 100-4,000 tokens,
    arriving in waves, enough to fill the caches; a few aborts, pauses, interrupting updates.
    The prefix cache and migration are picked by the KV size (so targets cannot starve them)."""
    kv = draw(st.integers(100_000, 400_000))
    cache = ("none", "lru", "none")[kv % 3]
    spec = EngineSpec(draw(st.sampled_from([PRESET.cost])), kv_capacity=kv, max_running=256,
                      max_prefill_tokens=16_384, prefix_cache=cache, **SGLANG_RULES)
    engines = draw(st.integers(1, 3))
    routes = st.one_of(st.none(), st.just(MOST_ROOM), st.integers(0, engines - 1))
    groups = []
    samples = 0
    want = draw(st.integers(engines * kv // 4_000, engines * kv // 2_800))  # more than fits
    while samples < want:
        size = draw(st.integers(2, 8))
        tgts = [draw(st.one_of(st.just(CAP), st.integers(1, CAP), st.integers(1, 5_000)))
                for _ in range(size)]
        groups.append((draw(st.sampled_from([0.0, 0.0, 0.0, 5.0, 40.0])),
                       draw(st.integers(100, 4_000)), draw(routes), tgts))
        samples += size
    dur = st.floats(0.05, 3.0)
    # an abort (APRIL's, or an interrupting update's) while the pieces run, then maybe another call
    t1 = draw(st.floats(1, 120, allow_nan=False))
    timed = [(t1, ("abort", "update", "abort", "abort_now")[kv // 7 % 4], draw(dur))]
    timed += draw(st.lists(st.tuples(st.floats(t1, 200, allow_nan=False),
                                     st.sampled_from(["abort", "abort_now", "pause", "update"]),
                                     dur), max_size=1))
    return PlacedCase(spec, engines, draw(st.sampled_from(["round_robin", "least_loaded",
                                                           "group_affinity"])),
                      (0, 2_048, 4_096, 8_192)[kv // 3 % 4], draw(st.booleans()),
                      cache == "none" and kv // 12 % 4 != 0, groups, sorted(timed),
                      [draw(st.sampled_from([0, 0, -1, 7])) for _ in groups])


class ProbedReference(ReferenceEngine):
    """The reference engine, counting the cases this property is for (nothing else changed)."""

    def __init__(self, spec: EngineSpec, name: int = 0) -> None:
        super().__init__(spec, name)
        self.probe: Counter[str] = Counter()
        self.order: dict[int, int] = {}  # rid -> submission order, set by the driver

    def advance(self):
        clip, p = self.spec.clip_max_new_tokens, self.probe
        if self.phase == PREFILL and self.waiting:  # a batch is served: did it jump the queue?
            first = {}
            for q in self.waiting:  # the earliest submission waiting in each priority class
                first[q.priority] = min(first.get(q.priority, math.inf), self.order[q.rid])
            p["priority inversion served"] += sum(
                any(pr < r.priority and o < self.order[r.rid] for pr, o in first.items())
                for r in self.batch)
        above = [r for r in self.running if r.max_new - r.gen > clip] if self.waiting else []
        before = self.stats.retractions
        mixed = len({r.priority for r in self.running}) > 1
        migrated = sum(r.migrated > 0 for r in self.running)
        done = super().advance()
        p["crossed the clip with the queue waiting"] += sum(
            r.max_new - r.gen <= clip for r in above)
        got = self.stats.retractions - before
        p["retracted among mixed priorities"] += got if mixed else 0
        p["retracted with migrated KV"] += got if migrated else 0
        return done

    def _plan(self) -> None:
        rules, w = self.rules, self.waiting
        if w and not self.hold and len(self.running) < rules.max_running:
            args = (w, len(self.running), self.kv)
            if not rules.admits_head(*args, self.reserve, self.it) \
                    and rules.admits_head(*args, 0, self.it):
                self.probe["reserve refused the head"] += 1
        super()._plan()


@dataclass
class _Sample:
    group: int
    index: int
    target: int  # its whole response's length (hidden truth)
    generated: int = 0
    engine: int = -1  # where its last piece ran


class PlacedDriver:
    """Runs one cluster through a case as Seer's scheduler and the simulator's driver would."""

    def __init__(self, engine_cls, case: PlacedCase) -> None:
        self.case = case
        self.engines = [engine_cls(case.spec, i) for i in range(case.engines)]
        self.router = make_router(case.router)
        self.out: list[Completion] = []
        self.samples: list[_Sample] = []
        self.of_rid: dict[int, _Sample] = {}
        self.est: dict[int, int] = {}  # group -> length estimate (its longest piece so far)
        self.hits: Counter[str] = Counter()
        self.next_rid = 0
        self.order: dict[int, int] = {}
        for e in self.engines:
            if isinstance(e, ProbedReference):
                e.order = self.order
        self.calls: list[tuple[float, int, str, object]] = []  # (time, seq, kind, payload)
        self.seq = 0

    def _call(self, t: float, kind: str, payload: object) -> None:
        self.calls.append((t, self.seq, kind, payload))
        self.seq += 1
        self.calls.sort(key=lambda c: (c[0], c[1]))

    def send(self, smps: list[_Sample], priority: int, now: float) -> None:
        """One Submit: a piece of each sample, placed by its group's route."""
        case, spec = self.case, self.case.spec
        route = case.groups[smps[0].group][2]
        rooms = [e.room_at(now) for e in self.engines] if route == MOST_ROOM else []
        loads = [e.load for e in self.engines]
        per: dict[int, list[Request]] = {}
        for s in smps:
            plen = case.groups[s.group][1]
            g = s.generated
            cap = min(case.chunk, CAP - g) if case.chunk else CAP - g
            r = Request(self.next_rid, plen + g, cap, min(s.target - g, cap), priority=priority)
            self.next_rid += 1
            if spec.shares_prefixes:  # the group's prompt but its last token, held once
                r.prefix, r.shared = s.group, plen - 1
                r.input_len -= r.shared
                if spec.retains_prefixes:  # and the sample's run, kept past its requests
                    r.seq = id_of(s)
            elif case.migrate and g:
                r.migrated = r.input_len - 1
            if route is None:
                i = self.router.pick(loads, s.group)
            elif route == MOST_ROOM:
                i = max(range(len(rooms)), key=rooms.__getitem__)
                rooms[i] -= r.input_len + r.shared + r.max_new
            else:
                i = route % len(self.engines)
            loads[i] += 1
            if r.migrated:
                self.hits["migrated to another engine" if s.engine not in (-1, i)
                          else "migrated onto its engine"] += 1
            s.engine = i
            self.of_rid[r.rid] = s
            self.order[r.rid] = len(self.order)
            per.setdefault(i, []).append(r)
        for i, reqs in per.items():
            self.engines[i].submit(reqs, now)

    def ended(self, c: Completion, now: float) -> None:
        """A piece came back: learn from it, then send the next piece unless the response ended."""
        s = self.of_rid[c.rid]
        s.generated += c.tokens
        gid = s.group
        if s.generated > self.est.get(gid, -1):
            self.est[gid] = s.generated
        if c.reason == "stop" or s.generated >= CAP or s.generated >= s.target:
            self.hits["response at its cap"] += s.generated == CAP
            return
        self.hits["piece capped" if c.reason == "length" else "aborted piece resent"] += 1
        self.send([s], self.est[gid], now)  # re-prioritised at the group's new estimate

    def start_group(self, gid: int, now: float) -> None:
        _, _, _, tgts = self.case.groups[gid]
        smps = [_Sample(gid, k, t) for k, t in enumerate(tgts)]
        self.samples += smps
        if self.case.probe:
            self.send(smps[:1], TOP, now)
            smps = smps[1:]
        if smps:
            self.send(smps, self.case.base_priority[gid], now)

    def outside(self, now: float, kind: str, dur: float) -> None:
        es = self.engines
        if kind == "pause":  # a weight update that pauses: caches flushed
            self.hits["paused a busy engine"] += sum(not e.is_idle() for e in es)
            for e in es:
                for c in e.pause(now, now + dur):
                    self.out.append(c)
                    self._call(c.time, "ended", c)
                e.flush_prefix_cache()
            return
        for e in es:  # an abort (one step late, SGLang's, or at once): the partials come back
            if kind == "abort_now":
                t_land, got = now, e.abort_all(now)
            else:
                busy = not e.is_idle()
                t_land, got = e.abort_after_steps(now, e.spec.abort_steps)
                self.hits["abort landed a step late"] += busy and t_land > now
            if kind == "update":
                self.hits["interrupting update"] += 1
                e.block_until(max(t_land, now + dur))
                e.flush_prefix_cache()
            self.hits["aborted with partial output"] += sum(
                c.tokens > 0 and c.reason == "abort" for c in got)
            for c in got:
                self.out.append(c)
                self._call(c.time, "ended", c)

    def run(self) -> list[tuple[int, int, str, float]]:
        case = self.case
        for gid, (t, *_) in enumerate(case.groups):
            self._call(t, "group", gid)
        for t, kind, d in case.timed:
            self._call(t, kind, d)
        es = self.engines
        while True:
            e = min(es, key=lambda e: e.t_event)
            t_call = self.calls[0][0] if self.calls else math.inf
            if e.t_event == math.inf and t_call == math.inf:
                break
            if e.t_event <= t_call:
                done = e.advance()
                self.out += done
                for c in sorted(done, key=lambda c: c.rid):
                    self.ended(c, c.time)
                continue
            t, _, kind, payload = self.calls.pop(0)
            if kind == "group":
                self.start_group(payload, t)  # type: ignore[arg-type]
            elif kind == "ended":
                self.ended(payload, t)  # type: ignore[arg-type]
            else:
                self.outside(t, kind, payload)  # type: ignore[arg-type]
        return sorted((c.rid, c.tokens, c.reason, c.time) for c in self.out)


def id_of(s: _Sample) -> int:
    """A sample's key in the retained cache (its run): unique per (group, index)."""
    return s.group * 64 + s.index


EXAMPLES = 12
REACHED: Counter[str] = Counter()
# the least share of examples that must reach each case (measured on the derandomized examples
# without mined constants: inversions served 1.0, migrated KV prefilled 0.25, migrated to another
# engine 0.25, retractions among mixed priorities 1.0, of migrated requests 0.25, clip crossed
# with the queue waiting 0.33, reserve refused the head 1.0, piece capped 0.83, response at its
# cap 1.0, cache hit 0.75, abort a step late 0.92, aborted piece resent 1.0, interrupting update
# 0.33, several prefill passes 1.0, several engines 0.75, routed by room 0.83; one example is 0.08)
MIN_SHARE = {
    "priority inversion served": 0.3,
    "prefilled over migrated KV": 0.15,
    "migrated to another engine": 0.08,
    "retracted among mixed priorities": 0.15,
    "retracted with migrated KV": 0.08,
    "crossed the clip with the queue waiting": 0.15,
    "reserve refused the head": 0.3,
    "piece capped": 0.3,
    "response at its cap": 0.3,
    "retained cache hit": 0.08,
    "abort landed a step late": 0.3,
    "aborted piece resent": 0.3,
    "interrupting update": 0.08,
    "request prefilled over several passes": 0.3,
    "several engines": 0.3,
    "routed to the engine with most room": 0.3,
}


def _check(case: PlacedCase) -> tuple[PlacedDriver, PlacedDriver]:
    fd, rd = PlacedDriver(FastEngine, case), PlacedDriver(ProbedReference, case)
    fast, _ = assert_engines_agree(fd, rd, case.spec.kv_capacity)
    assert len({c[0] for c in fast}) == len(fast) == fd.next_rid  # each request ends once
    # every response ran to its end: nothing is lost across pieces, aborts and retractions
    assert all(s.generated == s.target for s in fd.samples)
    return fd, rd


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True)
@given(placed_cases())
def _fast_matches_reference_placed(case: PlacedCase) -> None:
    fd, rd = _check(case)
    probe = sum((e.probe for e in rd.engines), Counter())
    stats = [e.stats for e in fd.engines]
    got = {
        **{k: probe[k] for k in ("priority inversion served", "retracted among mixed priorities",
                                 "retracted with migrated KV",
                                 "crossed the clip with the queue waiting",
                                 "reserve refused the head")},
        **{k: fd.hits[k] for k in ("migrated to another engine", "piece capped",
                                   "response at its cap", "abort landed a step late",
                                   "aborted piece resent", "interrupting update")},
        "prefilled over migrated KV": sum(s.migrated_tokens for s in stats),
        "retained cache hit": sum(s.cache_hits for s in stats),
        "request prefilled over several passes": sum(s.chunked_requests for s in stats),
        "several engines": case.engines - 1,
        "routed to the engine with most room": sum(g[2] == MOST_ROOM for g in case.groups),
    }
    REACHED["examples"] += 1
    for name, n in got.items():
        if n:
            event(name)
            REACHED[name] += 1
    target(float(probe["priority inversion served"]), label="inversions served")
    target(float(probe["retracted among mixed priorities"]), label="mixed-priority retractions")
    target(float(probe["retracted with migrated KV"]), label="migrated retractions")


def test_fast_engine_matches_reference_with_placement_at_users_scale():
    """Priorities, routing and migrated KV with the presets' SGLang rules at 16k caps and
    100k-400k KV: fast == reference, and the examples reach the combination."""
    REACHED.clear()
    with _no_mined_constants():
        _fast_matches_reference_placed()
    n = REACHED["examples"]
    shares = {k: REACHED[k] / n for k in MIN_SHARE}
    print("placed scale examples reached:", {k: round(v, 2) for k, v in shares.items()})
    for name, least in MIN_SHARE.items():
        assert shares[name] >= least, (name, shares)
