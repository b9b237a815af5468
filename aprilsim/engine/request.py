"""What goes into an engine and what comes out: the engine's view of one submission."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from aprilsim.types import Episode, Sample, turn_request

# The engines' heaps hold one int per entry, `major << RID_BITS | minor` (an iteration and a
# request id): ints compare in one step where (int, int) tuples took two and a tuple walk, which
# was a tenth of a cluster run's instructions. Request ids must fit in RID_BITS (`check_requests`).
RID_BITS: Final = 32
RID_MASK: Final = 0xFFFF_FFFF  # (1 << RID_BITS) - 1


def heap_key(major: int, rid: int) -> int:
    """The heap entry ordering by (major, rid): `major` may be negative; 0 <= rid <= RID_MASK."""
    return (major << RID_BITS) | rid


def key_major(key: int) -> int:
    """The `major` of a `heap_key` (an arithmetic shift: negative majors come back)."""
    return key >> RID_BITS


def key_rid(key: int) -> int:
    """The request id of a `heap_key`."""
    return key & RID_MASK


# `__init__` written out (init=False), as in `aprilsim.types`: mypyc compiles it
@dataclass(slots=True, eq=False, init=False)
class Request:
    """One submission of a sample.

    `input_len` tokens are prefilled (prompt + tokens the sample already carried), at most
    `max_new` tokens may be generated; the workload decides the request stops after `target_new`
    (<= max_new). Admission sees only input_len and max_new, as a real engine would.

    With prefix sharing (`EngineSpec.prefix_sharing`), the first `shared` tokens of the input
    are a prefix that every request with the same `prefix` key shares on one engine (a group's
    prompt in SGLang's radix cache): `input_len` is then what follows it, and the prefix is
    prefilled and held once per engine while any request holding it runs there. With the
    retained cache (`prefix_cache = "lru"`), `seq` names the sample: a resubmission of it finds
    the tokens its previous request left in the cache (`parts.PrefixCache`).
    """

    rid: int
    input_len: int
    max_new: int
    target_new: int
    gen: int = 0  # tokens generated in this submission so far (kept across retractions)
    # bookkeeping of the fast engine: gen == base + engine iteration counter while running
    base: int = 0
    retractions: int = 0
    prefix: int = -1  # key of the shared prefix (the group), -1: none
    shared: int = 0  # its length, not counted in input_len
    seq: int = -1  # the sample it continues (key of its run in the retained cache), -1: none
    # a sample's first request: the sample, the driver's tag, which the engine never reads or
    # writes; it reports the request (`started`) when it first schedules it (`started_s`), and
    # the driver records the queue wait (docs/metrics.md); None for any other request
    sample: Sample | None = None
    priority: int = 0  # higher is admitted first (`waiting.enqueue`); 0 for every request (default)
    # simulated KV migration (Seer's global KV cache): the first `migrated` input tokens arrive
    # with their KV, held but not recomputed by the prefill; lost if the request is retracted
    migrated: int = 0
    # speculative decoding with "siblings" acceptance: the request's group and its size (set by
    # the runtime only then; -1: none)
    group: int = -1
    group_n: int = 1
    # the token content a family that hashes tokens reads (vLLM's prefix cache,
    # `families.vllm_content`): the key of the prompt's tokens (the group's; -1: the request's
    # own) and how many input tokens are the sample's own output carried from its earlier
    # requests (the sample: `seq`)
    prompt: int = -1
    carried: int = 0
    # the clipped reserve's own fields (`clipped_reserve`): the iteration at which the request
    # crosses the clip while above it, NEAR (-1) at or below it, ABSENT (-2) in no reserve; and E
    clip_k: int = field(default=-2, init=False)
    clip_e: int = field(default=0, init=False)
    started_s: float = field(default=-1.0, init=False)  # first scheduled (reported ones only)

    def __init__(self, rid: int, input_len: int, max_new: int, target_new: int, gen: int = 0,
                 base: int = 0, retractions: int = 0, prefix: int = -1, shared: int = 0,
                 seq: int = -1, sample: Sample | None = None, priority: int = 0, migrated: int = 0,
                 group: int = -1, group_n: int = 1, prompt: int = -1, carried: int = 0) -> None:
        self.rid = rid
        self.input_len = input_len
        self.max_new = max_new
        self.target_new = target_new
        self.gen = gen
        self.base = base
        self.retractions = retractions
        self.prefix = prefix
        self.shared = shared
        self.seq = seq
        self.sample = sample
        self.priority = priority
        self.migrated = migrated
        self.group = group
        self.group_n = group_n
        self.prompt = prompt
        self.carried = carried
        self.clip_k = -2
        self.clip_e = 0
        self.started_s = -1.0


@dataclass(slots=True, init=False)
class Completion:
    """A request leaving the engine: finished ("stop"/"length") or aborted with partial output."""

    rid: int
    tokens: int
    reason: str
    time: float

    def __init__(self, rid: int, tokens: int, reason: str, time: float) -> None:
        self.rid = rid
        self.tokens = tokens
        self.reason = reason
        self.time = time


class RequestBuilder:
    """The one rule that turns a sample's submission into its engine `Request`, for every driver
    of simulated engines (the simulator's send, its placed path, the live driver's virtual-time
    engines): what it prefills (prompt plus what it carries), how many tokens it may generate (its
    cap where below what it has left) and when it stops (its target), and the engine's own keys.

    `shares` (prefix sharing): the prompt but its last token is a prefix held once per engine,
    keyed by the group; `retains` (the retained cache): the request names its sample; `group_n`
    (speculative decoding with "siblings" acceptance): the group size the request carries (0: no
    group); `tokens` (a family whose engines hash token ids, vLLM's): the request names its
    sample, its group's prompt and the output it carries (`families.vllm_content`). A sample with
    no `start_s` yet asks its engine to report its first scheduling.
    """

    __slots__ = ("group_n", "retains", "shares", "tokens")

    def __init__(self, shares: bool, retains: bool, group_n: int = 0,
                 tokens: bool = False) -> None:
        self.shares = shares
        self.retains = retains
        self.group_n = group_n
        self.tokens = tokens

    def build(self, s: Sample, rid: int, cap: int | None, priority: int = 0,
              keep_kv: bool = False) -> Request:
        """Request `rid` of `s` (`build_all` of one sample)."""
        return self.build_all((s,), rid, cap, priority, keep_kv)[0]

    def build_all(self, samples: Sequence[Sample], first_rid: int, cap: int | None,
                  priority: int = 0, keep_kv: bool = False) -> list[Request]:
        """Requests first_rid, first_rid + 1, ... of `samples` (one send), at most `cap` new
        tokens each (None: what it has left). `keep_kv`: a resumed sample's KV comes along
        (`migrated`: all but the last input token), except with a prefix cache, whose own rule
        says what a resumed request finds. An episode's request is its next turn's
        (`types.turn_request`): its context so far is the input."""
        out: list[Request] = []
        append = out.append
        rid = first_rid
        for s in samples:
            g, t = s.generated, s._target_len
            assert t is not None  # a simulated sample carries its length (a live one may not)
            ep = s.episode
            if ep is not None:
                req = _turn(s, ep, rid, cap)
            else:
                left = s.max_len - g
                if cap is None or cap >= left:  # rollout.core.effective_cap, inlined
                    req = Request(rid, s.prompt_len + g, left, t - g)
                else:  # a token budget: stop this submission after `cap` tokens
                    req = Request(rid, s.prompt_len + g, cap, min(t - g, cap))
            if s.start_s < 0.0:  # not yet scheduled on an engine: its engine reports when it is
                req.sample = s
            append(req)
            rid += 1
        if self.shares or self.retains or self.group_n or self.tokens or priority or keep_kv:
            for s, req in zip(samples, out):  # the rest of the rule: engine keys, placement
                self._place(req, s, priority, keep_kv)
        return out

    def _place(self, req: Request, s: Sample, priority: int, keep_kv: bool) -> None:
        """`build_all` where an engine feature or a placement is on: the shared prefix, the
        retained run, the migrated KV, the group, the priority."""
        if priority:
            req.priority = priority
        shares = self.shares
        if shares and s.prompt_len > 1:  # the prompt but its last token, held once per engine
            req.prefix, req.shared = s.group_id, s.prompt_len - 1
            req.input_len -= req.shared
        if self.retains or self.tokens:  # its run in the retained cache, its tokens' key
            req.seq = s.uid
        if self.tokens:  # the engines hash token ids: its prompt's key, the output it carries
            req.prompt, req.carried = s.group_id, s.generated
        elif keep_kv and s.generated and not shares:
            req.migrated = req.input_len - 1
        if self.group_n:
            req.group, req.group_n = s.group_id, self.group_n


def _turn(s: Sample, ep: Episode, rid: int, cap: int | None) -> Request:
    """The request of an episode's next turn (or the rest of one an abort cut short)."""
    n_in, max_new, target = turn_request(s, ep, cap)
    return Request(rid, n_in, max_new, target)


def check_requests(reqs: list[Request], kv_capacity: int) -> None:
    """Reject requests no engine could serve (what a runtime must never submit)."""
    for r in reqs:
        if not 0 <= r.rid <= RID_MASK:
            raise ValueError(f"request id {r.rid}: the engines' heaps take ids "
                             f"in [0, 2**{RID_BITS})")
        if r.target_new < 1 or r.target_new > r.max_new:
            raise ValueError(f"request {r.rid}: need 1 <= target_new <= max_new")
        if r.input_len + r.shared + r.max_new > kv_capacity:
            raise ValueError(f"request {r.rid} can never fit in the KV cache")
        if r.migrated and (r.shared or not 0 < r.migrated < r.input_len):
            raise ValueError(f"request {r.rid}: migrated KV needs 0 < migrated < input_len and "
                             "no shared prefix")
