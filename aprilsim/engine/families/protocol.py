"""Engine families as objects: what differs between SGLang, vLLM and the bundled engine.

A `Family` is what an engine spec names (`EngineSpec.family`, `[cluster] family`): which engine
codebase's rules, with the few parameters a user may change (frozen: compared and hashed with the
spec). Each simulated engine gets its own `Rules` from it (`family.rules(spec)`): the answers both
engines ask for (admission, the KV reserve, preemption, one iteration's plan) and the state those
answers keep (SGLang's new-token ratio). `FastEngine` and `ReferenceEngine` take the same rules,
so fast == reference holds for every family. A new family is one module (its `Family` and, when
its rules differ from an existing family's, its `Rules`) and one `families.register` call.

`Rules` is a base class rather than a `typing.Protocol` for one reason: the compiled build
(mypyc) calls a method of a native base natively (through its vtable, ~14 ns) and a Protocol's
through Python's generic call (~90 ns); the fast engine asks its rules at every event. Its
methods raise until a family defines them; a family written in Python subclasses it like any
class (it is marked for interpreted subclasses).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Container, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from aprilsim.engine.parts import DECODE, IDLE, PREFILL, Chunked, PrefixCache
from aprilsim.native import mypyc_attr

if TYPE_CHECKING:
    from aprilsim.engine.clipped_reserve import ClippedReserve
    from aprilsim.engine.request import Request

# an engine spec (`cost.EngineSpec`), untyped here: `cost` imports the families, and the rules
# read its numbers once, when an engine is made
Spec = Any

ABORT_AT_ONCE = -1  # `abort_steps` of an abort that lands the moment it is sent
MIXED = 3  # a step kind beside parts' IDLE, PREFILL, DECODE: prefill chunks and decodes
STEP_KINDS = (IDLE, PREFILL, DECODE, MIXED)

# what `Rules.select_batch` returns: the batch, the input tokens it computes, the sum of their
# squares per request, its remaining max_new (unclipped), the migrated tokens it holds without
# computing them, and whether the token budget ended it
Admitted = tuple[list["Request"], int, int, int, int, bool]


class Family(Protocol):
    """An engine family as a spec names it: a frozen dataclass of the rules' parameters."""

    @property
    def name(self) -> str:
        """The family's registered name (`families.FAMILIES`)."""
        ...

    @property
    def abort_steps(self) -> int:
        """When an abort lands: ABORT_AT_ONCE, or k >= 0: after the step in flight and k more
        decode steps (what the drivers read, through `EngineSpec.abort_steps`)."""
        ...

    @property
    def cache_block(self) -> int:
        """The retained prefix cache's grain: it serves whole blocks of this many tokens."""
        ...

    @property
    def live_prefix_cache(self) -> str:
        """The prefix cache a live server of this family runs by default ("lru" or "none"):
        what `validate` simulates it with."""
        ...

    @property
    def live_accept_is_arrival(self) -> bool:
        """True when a live server of this family answers a streamed request once its engine
        can schedule it, so a burst's answers pace the engine's arrivals (`validate` then
        simulates the client's one-at-a-time sends, `client_send_s`)."""
        ...

    def rules(self, spec: Spec) -> Rules:
        """Fresh rules for one engine of `spec` (each engine keeps its own state)."""
        ...


@dataclass(slots=True)
class Step:
    """One iteration's plan, as a family makes it (`Rules.plan_step`): a prefill batch run as its
    own step (PREFILL; `capped`: the token budget ended it), a decode of the running batch after
    `victims` were preempted (DECODE), a step mixing prefill chunks and decodes under one token
    budget (MIXED: `chunks[i]` tokens of `batch[i]`), or nothing (IDLE). `hold`: whether
    admission waits after this plan until a running request leaves (the engine's `hold`).

    A chunked prefill pass (`Rules.per_pass`) is a PREFILL whose `chunks[i]` are the tokens
    `batch[i]` computes in it: the request whose prefill the last pass left unfinished comes
    first, and the last request may be left unfinished in turn with `left` tokens to compute."""

    kind: int
    batch: list[Request] = field(default_factory=list)
    capped: bool = False
    victims: list[Request] = field(default_factory=list)
    hold: bool = False
    chunks: list[int] = field(default_factory=list)
    left: int = 0


@dataclass(slots=True)
class PassInputs:
    """What a chunked prefill pass is planned from (`Rules.select_pass`): the queue, the request
    the last pass left unfinished, the running requests (how many, their KV with the unfinished
    one's so far, their reserve as `reserve_of` counts it), decode iterations done, the shared
    prefixes held, and the retained prefix cache."""

    waiting: deque[Request]
    partial: Chunked | None
    n_running: int
    kv: int
    reserve: int
    it: int
    resident: Container[int]
    cache: PrefixCache | None


class StepView(Protocol):
    """What a family reads of an engine to plan one iteration (the reference engine)."""

    waiting: deque[Request]
    running: list[Request]  # in admission order
    hold: bool  # admission held after a retraction until a request finishes
    cache: PrefixCache | None  # the retained prefix cache
    partial: Chunked | None  # the request a chunked prefill pass left unfinished (`per_pass`)

    @property
    def kv(self) -> int:
        """KV tokens held now (running requests, the prefill batch, shared prefixes)."""
        ...

    @property
    def reserve(self) -> int:
        """The running requests' remaining tokens as the KV reserve counts them (`reserve_of`)."""
        ...

    @property
    def it(self) -> int:
        """Decode iterations done (the clock of the family's per-step state)."""
        ...


@mypyc_attr(allow_interpreted_subclasses=True)
class Rules:
    """One engine's rules: what differs between engine families, asked by both engines.

    Attributes (set by each family's `__init__`): `family` (its name), `abort_steps` (abort
    latency), `cache_block` (the prefix cache's grain), `mixed_steps` (prefill and decode share a
    step under one token budget, vLLM V1; False: a prefill batch runs as its own step before
    decode, SGLang), `kv_capacity`, `max_running`, `clip` (a running request's remaining tokens
    count at most this many in the KV reserve; 0: no clip), `fewest_first` (preemption's order:
    the running request with the fewest generated tokens goes first, SGLang's `retract_decode`;
    False: the most; among equals the longest prompt, then the latest to join the running batch:
    `victim_order`), `refusal_holds` (a queue head refused while requests run holds admission
    until one of them leaves: SGLang's `batch_is_full`), `per_pass` (chunked prefill planned
    pass by pass, `select_pass`: SGLang's `PrefillAdder` with `chunked_prefill_size`; False:
    a prefill batch is one pass).

    Batch-shaped families (`mixed_steps` False) answer the fast engine's questions: admission
    (`admits_head`, `select_batch`), the reserve (`reserve_of`: the fast engine keeps its sum
    incrementally, so it must be min(remaining, clip), or remaining with clip 0), how long the
    running batch stays fixed (`stretch`), preemption (`fewest_first`, `requeue`, `retracted`)
    and `reset`. Every batch-shaped family plans one iteration for the reference engine
    (`plan_step`; given here, from those answers). A mixed-step family (`mixed_steps` True:
    vLLM's) runs both engines through its own steppers instead (`stepper`).
    """

    family: str
    abort_steps: int
    cache_block: int
    mixed_steps: bool
    kv_capacity: int
    max_running: int
    clip: int
    fewest_first: bool
    refusal_holds: bool = False
    per_pass: bool = False

    # ------------------------------------------------------------------ admission
    def admits_head(self, waiting: deque[Request], n_running: int, kv: int, reserve: int,
                    it: int, batch_reserve: int = 0, resident: Container[int] = ()) -> bool:
        """Would the head of `waiting` join the next iteration? `n_running` running requests
        (those already chosen for the batch included) hold `kv` KV tokens and reserve `reserve`
        (`reserve_of` summed; `batch_reserve` the chosen ones'); `it`: decode iterations done;
        `resident`: the shared prefixes held."""
        raise NotImplementedError

    def select_batch(self, waiting: deque[Request], n_running: int, kv: int, reserve: int,
                     it: int, resident: Container[int] = ()) -> Admitted:
        """Pop from `waiting` the requests the next prefill batch admits (`Admitted`); an empty
        batch exactly when `admits_head` refuses the head."""
        raise NotImplementedError

    def select_pass(self, at: PassInputs) -> Step:
        """One chunked prefill pass (`per_pass`): `at.partial`'s next piece, then requests popped
        from `at.waiting` (a PREFILL `Step` with `chunks` and `left`; an empty batch when
        nothing is prefilled, with the hold a refusal sets)."""
        raise NotImplementedError

    def stretch(self, lo: int, hi: int, n_running: int, kv: int, reserve: int,
                clipped: ClippedReserve | None, it: int, head: Request,
                resident: Container[int]) -> int | None:
        """For a running batch fixed at iteration `it` (`kv`, unclipped `reserve` or its
        `clipped` index) with `head` waiting, refused now: a boundary m in [lo, hi] iterations
        ahead no later than the first at which the batch may change (the head may join), or
        None when it stays fixed through hi. The fast engine jumps to it in closed form; a
        family that must step answers lo."""
        raise NotImplementedError

    # ------------------------------------------------------------------ the KV reserve
    def reserve_of(self, remaining: int) -> int:
        """A running request's `remaining` max_new tokens as the KV reserve counts them."""
        raise NotImplementedError

    # ------------------------------------------------------------------ preemption
    def requeue(self, waiting: deque[Request], victims: list[Request]) -> None:
        """Put preempted requests (in preemption order) back into `waiting`."""
        raise NotImplementedError

    def retracted(self, it: int, gen_sum: int, max_new_sum: int, n: int) -> bool:
        """Requests were preempted at iteration `it`; `n` still run, with `gen_sum` tokens
        generated and `max_new_sum` allowed in all. True: hold admission until one finishes;
        False: admission is tried again (the batch shrank: a hold is lifted)."""
        raise NotImplementedError

    def reset(self, it: int) -> None:
        """The engine emptied at iteration `it` (idle, or aborted): per-step state starts over."""
        raise NotImplementedError

    # ------------------------------------------------------------------ a mixed-step family
    def stepper(self, engine: Any, fast: bool) -> Any:
        """A family whose prefill and decode share a step (`mixed_steps`) runs its own engine
        logic: the object `engine` (a `FastEngine` if `fast`, else a `ReferenceEngine`) hands
        every public call to (its `submit`, `advance`, `abort_all`, `abort_after_steps`,
        `pause`, `progress_at`, `iterations_at`, `flush_prefix_cache`), which keeps the engine's
        public fields (`t`, `t_event`, `phase`, `busy_time`, `tokens`, `kv_peak`, `stats`,
        `running`, `waiting`) as the runtime reads them."""
        raise NotImplementedError(f"the {self.family} family mixes prefill and decode in one "
                                  "step but gives the engines no stepper to run it")

    # ------------------------------------------------------------------ one iteration
    def plan_step(self, view: StepView) -> Step:
        """The next iteration of an engine (the reference engine's one decision): requests
        admitted are popped from `view.waiting`, victims removed from `view.running` and
        requeued; the engine prices and runs the step. This one is a batch-shaped family's: a
        prefill batch if the queue head is admitted (admission not held), or a chunked prefill
        pass (`per_pass`), else a decode of the running batch after preempting in
        `victim_order` until it fits, else nothing (and `reset`: SGLang resets its ratio when
        the engine idles); a refused head holds admission where the family says so
        (`refusal_holds`). A family whose steps mix prefill chunks and decodes writes its own."""
        waiting, running, it = view.waiting, view.running, view.it
        kv, reserve = view.kv, view.reserve
        resident = {r.prefix for r in running if r.shared}
        if self.per_pass:
            step = self._plan_pass(view, resident)
            if step.batch:
                return step
            hold = step.hold
        else:
            if not view.hold and self.admits_head(waiting, len(running), kv, reserve, it, 0,
                                                  resident):
                batch, *_, capped = self.select_batch(waiting, len(running), kv, reserve, it,
                                                      resident)
                # the head refused after this batch: admission holds (set on an empty running
                # batch, SGLang drops it when the prefill batch replaces that batch)
                hold = self.refusal_holds and bool(waiting) and not capped and bool(running)
                return Step(PREFILL, batch, capped, hold=hold)
            hold = view.hold
            if waiting and not hold and self.refusal_holds:
                hold = bool(running)  # the head refused with requests running
        return self._plan_decode(view, hold)

    def _plan_pass(self, view: StepView, resident: set[int]) -> Step:
        """`plan_step`'s chunked prefill pass (`select_pass`): always when a pass left a request
        unfinished, else when admission is open; an empty batch (with the hold) otherwise."""
        waiting, running, partial = view.waiting, view.running, view.partial
        if partial is None:
            if view.hold or not waiting:
                return Step(PREFILL, hold=view.hold)
            if len(running) >= self.max_running:  # full: held until a request leaves
                return Step(PREFILL, hold=self.refusal_holds)
        elif partial.req.shared:
            resident.add(partial.req.prefix)
        return self.select_pass(PassInputs(waiting, partial, len(running), view.kv, view.reserve,
                                           view.it, resident, view.cache))

    def _plan_decode(self, view: StepView, hold: bool) -> Step:
        """`plan_step`'s decode of the running batch (after preempting until the next iteration
        fits), or IDLE when nothing runs."""
        waiting, running, it = view.waiting, view.running, view.it
        if not running:
            self.reset(it)
            return Step(IDLE, hold=hold)
        victims = []
        while view.kv + len(running) > self.kv_capacity:  # recounted: the oracle trusts no sum
            victim = first_victim(self, running)
            running.remove(victim)
            victims.append(victim)
        if victims:
            self.requeue(waiting, victims)
            hold = self.retracted(it, sum(r.gen for r in running),
                                  sum(r.max_new for r in running), len(running))
        return Step(DECODE, victims=victims, hold=hold)


def first_victim(rules: Rules, running: Sequence[Request]) -> Request:
    """The running request a family preempts first (`victim_order`): the per-iteration engines'
    obvious search over `running` in joining order."""
    sign = 1 if rules.fewest_first else -1
    return running[min(range(len(running)), key=lambda i: victim_order(sign, running[i], i))]


def victim_order(sign: int, r: Request, joined: int) -> tuple[int, int, int]:
    """Preemption's order, lowest first: `sign` * generated tokens (1: the fewest first, SGLang),
    then the longest prompt, then the latest to join the running batch (`joined`: its place in
    joining order). SGLang's `ScheduleBatch._get_decode_retraction_order` sorts the running
    batch's requests by (len(output_ids), -len(origin_input_ids)), stably, and pops from the
    end."""
    return sign * r.gen, -(r.input_len + r.shared), -joined
