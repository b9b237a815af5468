"""Small state components of a simulated engine, each with one job and its own reset.

`EngineStats` holds the counters tests and reports read (so two engines' statistics compare with
one `==`); `PrefillBatch` the batch being prefilled, what it costs and the chunked-prefill pass it
leaves open; `PrefixRefs` the shared prompt prefixes an engine holds (radix cache within a group;
`prefill_pieces` prices a batch over them); `PrefixCache` the token runs kept after their last
request left (radix cache past a request's life: `prefix_cache = "lru"`). `EngineFace` is the
read-only public block both engines expose to the runtime.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Container, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

# at run time: `Chunked` is a dataclass with a `Request` field, whose type object the compiled
# build (mypyc) needs when it makes the class
from aprilsim.engine.request import Request
from aprilsim.native import mypyc_attr

# an engine's phase: nothing planned, a prefill batch, a decode span (Final: the compiled build
# inlines them instead of looking them up in the module's dict at every use)
IDLE: Final = 0
PREFILL: Final = 1
DECODE: Final = 2
PHASE_NAMES = {IDLE: "idle", PREFILL: "prefill", DECODE: "decode"}


@dataclass
class EngineStats:
    """What an engine did, counted the same way by every engine model (tests compare with ==).

    `ratio_cuts` is FastEngine's own (decode spans cut short where the decaying ratio may admit:
    the reference engine has no spans), so it takes no part in equality.
    """

    iterations: int = 0  # decode iterations
    retractions: int = 0
    prefill_tokens: int = 0
    prefill_passes: int = 0  # prefill forward passes (one per batch without chunking)
    chunked_requests: int = 0  # requests whose prefill a pass left unfinished (chunked prefill)
    chunk_tail_passes: int = 0  # passes that ended a chunked request's prefill and began others'
    prefix_hits: int = 0  # requests prefilled onto a prefix the engine held
    prefix_drops: int = 0  # prefixes freed with their last holder
    abort_steps_run: int = 0  # steps run while an abort was on its way (in flight + k)
    abort_finishes: int = 0  # requests finished while an abort was on its way
    abort_chunked: int = 0  # requests an abort took with their chunked prefill unfinished
    # the retained prefix cache (`prefix_cache = "lru"`, `PrefixCache`)
    cache_hits: int = 0  # requests prefilled onto tokens the cache kept
    cache_partial_hits: int = 0  # of those, requests that still computed more than one token
    cache_hit_tokens: int = 0  # tokens the cache served (not computed)
    cache_block_dropped: int = 0  # tokens held but computed again: partial blocks (`block_served`)
    cache_evictions: int = 0  # runs evicted for KV that live requests needed
    cache_flushes: int = 0  # flushes of a non-empty cache (weight updates)
    migrated_tokens: int = 0  # input tokens prefilled over migrated KV (held, not computed)
    ratio_cuts: int = field(default=0, compare=False)
    # seconds of prefill batches that ended (the gain decomposition's prefill time); summed in
    # each engine's own order, so float rounding may differ: no part in equality
    prefill_s: float = field(default=0.0, compare=False)
    # speculative decoding: decode seconds less what the same steps cost without it (negative
    # when it saves; the gain decomposition's `speculative` part); float, no part in equality
    spec_s: float = field(default=0.0, compare=False)

    def count_batch(self, batch: PrefillBatch, cont: bool) -> None:
        """A prefill batch (one pass) ended: count its tokens, hits and pass; `cont`: it began
        with a request an earlier pass left unfinished."""
        self.prefill_tokens += batch.tokens - batch.saved
        self.prefill_s += batch.time
        self.migrated_tokens += batch.moved
        self.prefix_hits += batch.hits
        self.prefill_passes += 1
        n = len(batch.reqs)
        self.chunked_requests += batch.left > 0 and n > cont
        self.chunk_tail_passes += cont and n > 1  # the continuing one ended


def note_started(reqs: list[Request], t: float, started: list[Request]) -> None:
    """Requests scheduled on the engine at `t` (a prefill batch starts): each sample's first
    request (one with a `sample` tag) is reported once in `started`, `started_s` set to `t`, for
    the driver to record (the queue wait of docs/metrics.md); the engine writes no sample."""
    for r in reqs:
        if r.sample is not None and r.started_s < 0.0:
            r.started_s = t
            started.append(r)


@dataclass(slots=True)
class PrefillBatch:
    """The prefill batch in progress (empty between batches): one forward pass.

    With chunked prefill (`Rules.per_pass`) a pass's requests are `recs` (the unfinished one
    first when it continues), computing `chunks[i]` tokens each, the last one `left` more after
    it; `added` is the remaining max_new the requests it completes bring to the reserve.
    """

    reqs: list[Request] = field(default_factory=list)
    tokens: int = 0  # KV it adds, migrated KV apart (`moved`)
    time: float = 0.0
    hold_in: bool = False  # the engine's `hold` when the current plan was made (an unplan's)
    hits: int = 0
    moved: int = 0  # migrated KV tokens the batch holds without computing them
    recs: list[Chunked] = field(default_factory=list)
    chunks: list[int] = field(default_factory=list)
    left: int = 0
    added: int = 0
    saved: int = 0  # of `tokens` (KV it adds), those the retained cache serves (not computed)
    got: CacheLookup | None = None  # what it takes from the retained cache (`PrefixCache`)
    # each sample's first request once a batch scheduled it (`note_started`): the engine's
    # `started`, which the driver records and clears (a batch's `clear` keeps it)
    started: list[Request] = field(default_factory=list)

    def clear(self) -> None:
        """No batch in progress."""
        self.reqs = []
        self.tokens = self.hits = self.saved = self.moved = self.left = self.added = 0
        self.recs, self.chunks = [], []
        self.got = None


def prefill_pieces(batch: list[Request],
                   resident: Container[int] = ()) -> tuple[list[int], list[int]]:
    """Per request of a prefill batch, in order: (tokens it computes, tokens of its prefix already
    held). The first request of a group whose prefix is not yet `resident` computes the prefix
    too; the later ones compute their own tokens only, over a cached prefix they attend to. A
    request with migrated KV computes the rest of its input over it."""
    lens: list[int] = []
    cached: list[int] = []
    have: set[int] = set()
    for r in batch:
        n = r.input_len + r.gen
        s = r.shared
        if s and r.prefix not in resident and r.prefix not in have:
            have.add(r.prefix)
            lens.append(n + s)
            cached.append(0)
        elif r.migrated:
            lens.append(n - r.migrated)
            cached.append(r.migrated)
        else:
            lens.append(n)
            cached.append(s)
    return lens, cached


@dataclass(slots=True)
class Chunked:
    """A request in a chunked prefill pass (`Rules.per_pass`), and between passes the one a pass
    left unfinished (SGLang's `chunked_req`): the tokens its prefill computes in all (`walk`:
    its input, and its shared prefix when it brings it), those the passes that ended computed
    (`done`), the tokens its pieces attend to without computing them (`base`: a prefix held
    already, migrated or cached KV), the KV it took when admitted without computing it
    (`held`), and whether its shared prefix entered the engine with it (`brought`: its KV is
    then counted in this request's)."""

    req: Request
    walk: int
    base: int
    held: int
    brought: bool
    done: int = 0

    @property
    def kv(self) -> int:
        """KV tokens it holds between passes."""
        return self.held + self.done

    def cost_terms(self, piece: int) -> int:
        """The attention term of `piece` more tokens: (base + done + piece)^2 - (base + done)^2
        (`cost.prefill_time`'s sum of squares)."""
        a = self.base + self.done
        return (a + piece) * (a + piece) - a * a


def admit_pieces(batch: list[Request], resident: Container[int],
                 got: CacheLookup | None) -> list[Chunked]:
    """The requests a chunked prefill pass admits, each as it starts (`Chunked`): what each
    computes and attends to over the prefixes `resident` and those brought earlier in the pass
    (`prefill_pieces`, or what the retained cache serves, `got` (its `lookup` of `batch`),
    migrated KV held apart)."""
    if got is not None:
        lens, cached = got.lens, got.cached
    else:
        lens, cached = prefill_pieces(batch, resident)
    out = []
    have: set[int] = set()
    for r, n, c in zip(batch, lens, cached):
        brought = bool(r.shared) and r.prefix not in resident and r.prefix not in have
        if brought:
            have.add(r.prefix)
        m = r.migrated if got is not None else 0
        need = r.input_len + r.gen + (r.shared if brought else 0)
        out.append(Chunked(r, n - m, c + m, need - n + m, brought))
    return out


class PrefixRefs(dict):
    """Shared prefixes held by an engine: key -> number of running or prefilling holders. A
    mapping, so admission's `resident` test (`key in refs`) reads it directly."""

    def hold(self, key: int) -> bool:
        """One more holder; True when the prefix was already held (a hit)."""
        c = self.get(key, 0)
        self[key] = c + 1
        return c > 0

    def unref(self, key: int) -> bool:
        """One holder fewer; True when that was the last (the prefix is freed)."""
        c = self[key] - 1
        if c:
            self[key] = c
            return False
        del self[key]
        return True


@dataclass(slots=True)
class CacheLookup:
    """What a prefill batch gets from the retained cache (`PrefixCache.lookup`): per request the
    tokens it computes and the cached tokens it attends to (`prefill_pieces`' form),
    the runs it takes and what that saves."""

    lens: list[int]
    cached: list[int]
    taken: list[tuple[int, int]]
    saved: int = 0  # of the KV the batch adds, tokens not computed (served less `dropped`)
    hits: int = 0  # requests served some
    partial: int = 0  # of those, requests computing more than their last token
    served: int = 0  # tokens served by the cache
    dropped: int = 0  # tokens held (live or cached) but computed: partial blocks (`block_served`)


class PrefixCache:
    """SGLang's radix cache past a request's life, as a two-level tree of token runs.

    A run is a group's shared prompt (key (0, group)) or one sample's own tokens after it (key
    (1, seq): the prompt's last token and the response so far). A run enters when no live request
    holds it any more (its request finished, was aborted or retracted; a prompt with its group's
    last holder); it is unlocked: it occupies free KV, which admission counts as free, and is
    evicted least recently inserted first when live requests need the KV (`fit`). A prefill batch
    takes the runs it uses (`lookup`, then `commit` when the batch ends): they become live KV
    again, and come back longer when the request leaves. A sample's run is used only on top of
    its prompt (live, cached or brought by the batch); a run never outlives its prompt's, since
    the prompt enters last. A weight update flushes it all (`clear`). With `block` > 1 (vLLM's
    KV blocks) only whole blocks of what a request matched serve it (`block_served`).
    """

    __slots__ = ("runs", "heap", "size", "clock", "block", "freed")

    def __init__(self, block: int = 1) -> None:
        self.block = block  # serve whole blocks of this many tokens only (`block_served`)
        self.runs: dict[tuple[int, int], tuple[int, int]] = {}  # key -> (stamp, tokens)
        self.heap: list[tuple[int, tuple[int, int]]] = []  # (stamp, key), stale entries skipped
        self.size = 0  # tokens held
        self.clock = 0
        self.freed: list[int] = []  # prompts freed at this event, for its `leave` (fast engine)

    def __len__(self) -> int:
        return len(self.runs)

    def put(self, key: tuple[int, int], tokens: int) -> None:
        """Keep a run that no live request holds (newest: evicted last)."""
        old = self.runs.pop(key, None)
        if old is not None:
            self.size -= old[1]
        if tokens <= 0:
            return
        self.clock += 1
        self.runs[key] = (self.clock, tokens)
        self.size += tokens
        heapq.heappush(self.heap, (self.clock, key))

    def leave(self, reqs: Iterable[Request], freed: Iterable[int]) -> None:
        """Requests left the engine at one event (each holding input_len + gen - 1 own tokens),
        and with them the shared prompts keyed `freed` (no live holder left): their runs enter
        in a canonical order (samples by rid, then prompts by key), so every engine model ages
        them alike."""
        shared = {}
        for r in sorted(reqs, key=_rid):
            if r.seq >= 0:
                self.put((1, r.seq), r.input_len + r.gen - 1)
            if r.shared:
                shared[r.prefix] = r.shared
        for p in sorted(freed):
            self.put((0, p), shared[p])

    def fit(self, room: int, stats: EngineStats) -> None:
        """Evict the oldest runs until the cache fits in `room` free KV tokens."""
        runs, heap = self.runs, self.heap
        while self.size > room:
            stamp, key = heapq.heappop(heap)
            got = runs.get(key)
            if got is None or got[0] != stamp:
                continue  # taken or replaced since
            del runs[key]
            self.size -= got[1]
            stats.cache_evictions += 1

    def clear(self, stats: EngineStats) -> None:
        """A weight update: every kept run is stale."""
        if self.runs:
            stats.cache_flushes += 1
        self.runs.clear()
        self.heap.clear()
        self.size = 0

    def lookup(self, batch: list[Request], resident: Container[int]) -> CacheLookup:
        """Price a prefill batch over what is live (`resident` prompts) and kept: as
        `prefill_pieces`, but a prompt neither live nor brought earlier in the batch
        comes from the cache when kept there, and a request's own run covers its input but the
        last token (SGLang always computes one); with blocks, only whole blocks of what a
        request matched serve it (`block_served`). Takes nothing yet (`commit`)."""
        out = CacheLookup([], [], [])
        have: set[int] = set()
        for r in batch:
            self._one(r, resident, have, out)
        return out

    def served(self, r: Request, seen: Container[int]) -> int:
        """Tokens of `r`'s prefill the cache would serve uncomputed if it joined a batch now,
        `seen` holding the prompts live or brought earlier in the batch (`lookup`'s `saved`
        for it)."""
        out = CacheLookup([], [], [])
        self._one(r, seen, set(), out)
        return out.saved

    def _one(self, r: Request, resident: Container[int], have: set[int],
             out: CacheLookup) -> None:
        """`lookup` for one request of a batch (`have`: the prompts brought before it)."""
        runs, block = self.runs, self.block
        n = r.input_len + r.gen
        s = r.shared
        pre = s
        saved = 0
        if s and r.prefix not in resident and r.prefix not in have:
            have.add(r.prefix)
            if (0, r.prefix) in runs:
                out.taken.append((0, r.prefix))
                saved = s
            else:  # computed here, with the rest of this request's input
                n += s
                pre = 0
        h = 0
        if (pre or not s) and r.seq >= 0 and (1, r.seq) in runs:
            h = min(runs[1, r.seq][1], n - 1)
            if h > 0:
                out.taken.append((1, r.seq))
                n -= h
                pre += h
                saved += h
        served = saved
        if block > 1 and pre:
            drop = pre - block_served(pre, pre + n, block)
            if drop:  # the partial block is computed again: own tokens first, then prompt's
                n += drop
                pre -= drop
                served -= min(drop, h) + (drop - h if drop > h and saved > h else 0)
                saved -= drop
                out.dropped += drop
        out.lens.append(n)
        out.cached.append(pre)
        out.saved += saved
        if served:
            out.served += served
            out.hits += 1
            out.partial += n > 1

    def commit(self, got: CacheLookup, stats: EngineStats) -> None:
        """The batch `got` priced has run: the runs it used are live KV again."""
        for key in got.taken:
            old = self.runs.pop(key, None)
            if old is not None:
                self.size -= old[1]
        stats.cache_hits += got.hits
        stats.cache_partial_hits += got.partial
        stats.cache_hit_tokens += got.served
        stats.cache_block_dropped += got.dropped


def block_served(matched: int, total: int, block: int) -> int:
    """Tokens of a `total`-token input a prefix cache serves when it matched `matched`: whole
    blocks of `block` only, and never the last token (vLLM's `get_computed_blocks` caps the hit
    at total - 1, then keeps whole blocks; SGLang's radix cache with page_size > 1 aligns the
    match down to a page the same way)."""
    m = min(matched, total - 1)
    return m - m % block if m > 0 else 0


def _rid(r: Request) -> int:
    return r.rid


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassed: tests, engine_factory
class EngineFace:
    """The public block both engines share: what a router and the runtime read.

    Needs `running` and `waiting` (sized), `prefilling()` (the batch being prefilled), `phase`,
    `kv_peak`, `t` and `progress_at(now)`.
    """

    # `running` (sized): a dict on the fast engine, a list on the reference one; not declared
    # here, since a compiled subclass may not narrow an attribute's declared type
    waiting: deque[Request]
    phase: int
    kv_peak: int
    t: float
    stats: EngineStats
    cache: PrefixCache | None
    mixed: Any  # a mixed-step family's stepper, which runs the engine's calls (None: none)

    def flush_prefix_cache(self) -> None:
        """A weight update: drop every run the retained prefix cache kept (none without one)."""
        if self.mixed is not None:
            self.mixed.flush_prefix_cache()
        elif self.cache is not None:
            self.cache.clear(self.stats)

    def prefilling(self) -> list[Request]:  # pragma: no cover - each engine defines it
        raise NotImplementedError

    def progress_at(self, now: float) -> tuple[int, float, int]:  # pragma: no cover
        raise NotImplementedError

    @property
    def load(self) -> int:
        """Requests on this engine (running, prefilling and queued): what a router balances."""
        return len(self.running) + len(self.prefilling()) + len(self.waiting)  # type: ignore[attr-defined]

    def room_at(self, now: float) -> int:
        """KV tokens free at `now` less the input the queued requests bring: what routing to
        "the engine with the most room" compares (`Submit.route`)."""
        free = self.spec.kv_capacity - self.progress_at(now)[2]  # type: ignore[attr-defined]
        return free - sum(r.input_len + r.gen + r.shared for r in self.waiting)

    @property
    def n_running(self) -> int:
        """Requests decoding or prefilling (the running batch; queued requests excluded)."""
        return len(self.running) + len(self.prefilling())  # type: ignore[attr-defined]

    @property
    def peak_kv(self) -> int:
        """Most KV tokens held since the last `reset_peak`."""
        return self.kv_peak

    @property
    def retractions(self) -> int:
        """Requests evicted from the running batch for lack of KV so far."""
        return self.stats.retractions

    def is_idle(self) -> bool:
        """True when nothing is queued, prefilling or decoding."""
        return self.phase == IDLE and self.load == 0

    def reset_peak(self, now: float) -> None:
        """Start a new peak-KV window at the KV held at `now`."""
        self.kv_peak = self.progress_at(now)[2]

    def block_until(self, t: float) -> None:
        """Start nothing before `t`; only valid on an idle engine (after `abort_all`)."""
        if not self.is_idle():
            raise RuntimeError("block_until on a busy engine")
        self.t = max(self.t, t)
