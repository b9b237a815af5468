"""Small state components of a simulated engine, each with one job and its own reset.

`EngineStats` holds the counters tests and reports read (so two engines' statistics compare with
one `==`); `PrefillBatch` the batch being prefilled and what it costs; `NewTokenRatio` SGLang's
decaying admission ratio; `PrefixRefs` the shared prompt prefixes an engine holds (radix cache
within a group). `EngineFace` is the read-only public block both engines expose to the runtime.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aprilsim.engine.admission import ratio_after_retraction, ratio_at

if TYPE_CHECKING:
    from aprilsim.engine.cost import EngineSpec
    from aprilsim.engine.request import Request

IDLE, PREFILL, DECODE = 0, 1, 2  # an engine's phase: nothing planned, a prefill batch, a decode span
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
    multi_pass_batches: int = 0  # prefill batches over several passes (chunked prefill)
    joined_open_pass: int = 0  # prefill batches that began in the pass left open before them
    prefix_hits: int = 0  # requests prefilled onto a prefix the engine held
    prefix_drops: int = 0  # prefixes freed with their last holder
    abort_steps_run: int = 0  # steps run while an abort was on its way (in flight + k)
    abort_finishes: int = 0  # requests finished while an abort was on its way
    abort_pass_cuts: int = 0  # aborts that landed after a pass in flight, mid-batch
    migrated_tokens: int = 0  # input tokens prefilled over migrated KV (held, not computed)
    ratio_cuts: int = field(default=0, compare=False)

    def count_batch(self, batch: PrefillBatch) -> None:
        """A prefill batch ended: count its tokens, hits and passes."""
        self.prefill_tokens += batch.tokens
        self.migrated_tokens += batch.moved
        self.prefix_hits += batch.hits
        self.prefill_passes += batch.passes
        joined = batch.room_in > 0
        self.joined_open_pass += joined
        self.multi_pass_batches += batch.passes + joined > 1


@dataclass(slots=True)
class PrefillBatch:
    """The prefill batch in progress (empty between batches) and the open chunked-prefill pass.

    `room_in` is the room of the open pass the current plan started from (restored by an unplan),
    `room_out` the room this batch leaves open when the token budget ended it; `pieces` the tokens
    each request computes and the cached prefix each attends to (what an abort mid-batch walks).
    """

    reqs: list[Request] = field(default_factory=list)
    tokens: int = 0
    time: float = 0.0
    passes: int = 1
    room_in: int = 0
    room_out: int = 0
    hits: int = 0
    moved: int = 0  # migrated KV tokens the batch holds without computing them
    pieces: tuple[list[int], list[int]] = ((), ())  # type: ignore[assignment]

    def clear(self) -> None:
        """No batch in progress."""
        self.reqs = []
        self.tokens = self.hits = self.moved = 0


@dataclass(slots=True)
class NewTokenRatio:
    """SGLang's new-token ratio: `base` set at decode iteration `it0` (a reset or a retraction's
    re-estimate), decaying per step from there (`admission.ratio_at`)."""

    spec: EngineSpec
    base: float = 0.0
    it0: int = 0

    def __post_init__(self) -> None:
        self.base = self.spec.new_token_ratio

    def at(self, it: int) -> float:
        """The ratio at decode iteration `it`."""
        return ratio_at(self.spec, self.base, it - self.it0)

    def reset(self, it: int) -> None:
        """Back to the initial ratio (the engine went idle, or was aborted) at iteration `it`."""
        self.base, self.it0 = self.spec.new_token_ratio, it

    def re_estimate(self, it: int, gen_sum: int, max_new_sum: int, n: int) -> None:
        """After a retraction at iteration `it`: SGLang's estimate over the requests left; the
        step that retracted does not decay it."""
        self.base = ratio_after_retraction(self.spec, gen_sum, max_new_sum, n)
        self.it0 = it + 1


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


class EngineFace:
    """The public block both engines share: what a router and the runtime read.

    Needs `running` and `waiting` (sized), `prefilling()` (the batch being prefilled), `phase`,
    `kv_peak`, `t` and `progress_at(now)`.
    """

    running: object
    waiting: deque[Request]
    phase: int
    kv_peak: int
    t: float
    stats: EngineStats

    def prefilling(self) -> list[Request]:  # pragma: no cover - each engine defines it
        raise NotImplementedError

    def progress_at(self, now: float) -> tuple[int, float, int]:  # pragma: no cover
        raise NotImplementedError

    @property
    def load(self) -> int:
        """Requests on this engine (running, prefilling and queued): what a router balances."""
        return len(self.running) + len(self.prefilling()) + len(self.waiting)  # type: ignore[arg-type]

    def room_at(self, now: float) -> int:
        """KV tokens free at `now` less the input the queued requests bring: what routing to
        "the engine with the most room" compares (`Submit.route`)."""
        free = self.spec.kv_capacity - self.progress_at(now)[2]  # type: ignore[attr-defined]
        return free - sum(r.input_len + r.gen + r.shared for r in self.waiting)

    @property
    def n_running(self) -> int:
        """Requests decoding or prefilling (the running batch; queued requests excluded)."""
        return len(self.running) + len(self.prefilling())  # type: ignore[arg-type]

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
