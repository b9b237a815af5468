"""Continuous batching over :class:`TinyDecoder`: SGLang's admission, retraction, finish, abort.

:class:`BatchEngine` is synchronous and single-threaded: the caller adds requests, aborts them,
and calls :meth:`BatchEngine.step`, which runs either one prefill batch (the requests admitted this
step) or one decode iteration over every running request, as SGLang does by default (prefill
first, not mixed). The asyncio driver in :mod:`real.torch_engine.runner` calls these methods
between steps, never during one.

Scheduling follows SGLang 0.5.23's scheduler (``schedule_policy.py``, ``schedule_batch.py``,
``new_token_ratio_tracker.py``), simplified to page size 1, no prefix cache, no chunked prefill:

- **Admission** (FCFS, the head blocks the rest; ``schedule_policy.PrefillAdder``): each
  running request reserves ``min(max_new_tokens - generated, clip_max_new_tokens) *
  new_token_ratio`` (ratio 1 with ``ignore_eos``) beyond the KV it holds. A candidate needs its
  input (prompt + tokens it generated before a retraction) plus its whole clipped remaining
  ``max_new_tokens`` to fit in what is left, counting the requests admitted in the same batch at
  their full reserve. An ``ignore_eos`` candidate passes SGLang's ``add_one_req_ignore_eos``
  check instead: with every request decoding together and finishing in order of tokens left,
  free KV must stay above one token per running request at each finish. A slot must be free.
- **Retraction**: before a decode step every running request needs one more KV token. When the
  budget cannot hold them, the request with the fewest output tokens (ties: the longest prompt)
  is retracted (its KV freed, its output kept), until the rest fit (at least one keeps running).
  Retracted requests are appended to the *tail* of the waiting queue, in the order they were
  retracted, as SGLang's ``scheduler.update_running_batch`` does (``for req in retracted_reqs:
  self._add_request_to_queue(req, is_retracted=True)``, which calls ``waiting_queue.append``;
  the default FCFS policy does not re-sort the queue). A retracted request is re-prefilled with
  prompt + output when it reaches the head and fits, and goes on where it stopped; its client
  sees nothing but a pause. ``pause_generation`` in "retract" mode likewise appends the running
  requests, in batch order, behind those already waiting. After a retraction
  ``new_token_ratio`` is re-estimated from the running batch; otherwise it decays each decode
  step from ``init_new_token_ratio`` to ``init * min_new_token_ratio_factor``.
- **Limits** (SGLang's messages): ``max_req_len = min(context - 1, kv budget - 1)``; a prompt of
  ``max_req_len - 5`` tokens or more is refused ("Input length ... exceeds the maximum allowed
  length"), prompts too long for the context and prompt + max_new_tokens over the context too;
  ``max_new_tokens`` is clipped to ``max_req_len - prompt - 1``.

**Output vocabulary** (:meth:`BatchEngine.restrict_output`): a server with a tokenizer lets
the model sample only tokens whose text round-trips (:func:`.tokenizer.roundtrip_token_ids`),
plus EOS for requests that stop on it. The mask is added to the logits of every sampled position
(greedy, seeded, batched or not), so ``output_token_logprobs`` and ``output_top_logprobs`` are
``log_softmax`` over the allowed tokens, the distribution actually sampled. Prompt ids are not
restricted, and ``input_token_logprobs`` score them under the unmasked model (as SGLang scores
inputs before any sampling mask).

Every step is recorded (:class:`IterationRecord`: phase, batch size, KV tokens, duration) for
calibration. A failure while sampling one request fails that request alone.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

import torch

from aprilsim.engine.cost import SGLANG_RULES

from .model import KVPool, TinyDecoder
from .sampling import ParamError, SamplingSpec, adjust_logits, sample_next

log = logging.getLogger(__name__)

ABORT_QUEUED_MESSAGE = "Abort in waiting queue"
ABORT_RUNNING_MESSAGE = "Aborted"
IGNORE_EOS_RESERVE_TOKENS = 1  # SGLang's schedule_policy constant


@dataclass(frozen=True)
class EngineConfig:
    """Engine limits and SGLang's scheduling constants (their env-var defaults: SGLANG_RULES,
    the rules the simulator's presets run, stated there once)."""

    max_running_requests: int = 32
    kv_budget_tokens: int | None = None  # defaults to slots x context
    max_context: int | None = None  # defaults to the model's
    max_prefill_tokens: int = 8192  # prompt tokens per prefill step (at least one request runs)
    device: str = "cpu"
    dtype: str = "float32"
    min_step_seconds: float = 0.0  # pad each step to this duration (emulates a slower device)
    init_new_token_ratio: float = SGLANG_RULES["new_token_ratio"]  # SGLANG_INIT_NEW_TOKEN_RATIO
    min_new_token_ratio_factor: float = SGLANG_RULES["min_new_token_ratio_factor"]
    new_token_ratio_decay_steps: int = SGLANG_RULES["new_token_ratio_decay_steps"]
    retract_decode_steps: int = SGLANG_RULES["retract_decode_steps"]
    clip_max_new_tokens: int = SGLANG_RULES["clip_max_new_tokens"]
    # SGLang --enable-priority-scheduling: the waiting queue by request priority, higher first
    # (arrival order among equals); no preemption of running requests (SGLang's, on by default
    # there, is not modelled: run SGLang with --disable-priority-preemption to match)
    enable_priority_scheduling: bool = False
    iteration_log_size: int = 100_000  # iteration records kept in memory


@dataclass(eq=False)
class EngineRequest:
    """One request inside the engine. ``max_new_tokens`` is what it may generate at most.

    Either pass ``spec`` (validated :class:`SamplingSpec`, what the HTTP server does) or the plain
    fields (temperature 0 = greedy), from which a spec is built.
    """

    rid: str
    prompt_ids: list[int]
    max_new_tokens: int
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    spec: SamplingSpec | None = None
    return_logprob: bool = False
    logprob_start_len: int = -1  # -1: output log-probs only (SGLang's default)
    top_logprobs_num: int = 0
    priority: int = 0  # with EngineConfig.enable_priority_scheduling: higher is admitted first
    # engine state
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    input_logprobs: list[float | None] | None = None
    input_top_logprobs: list[list[tuple[float, int]] | None] | None = None
    slot: int = -1
    retractions: int = 0
    arrived: float = field(default_factory=time.monotonic)
    generator: torch.Generator | None = None

    def __post_init__(self) -> None:
        if self.spec is None:
            greedy = self.temperature < 1e-6
            self.spec = SamplingSpec(
                max_new_tokens=self.max_new_tokens, ignore_eos=self.ignore_eos,
                stop_token_ids=tuple(self.stop_token_ids),
                temperature=1.0 if greedy else self.temperature, top_p=self.top_p,
                top_k=1 if greedy else (self.top_k if self.top_k > 0 else 1 << 30),
                seed=self.seed)
        else:
            self.ignore_eos = self.spec.ignore_eos
            self.stop_token_ids = self.spec.stop_token_ids
            self.seed = self.spec.seed

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def need(self) -> int:
        return len(self.prompt_ids) + self.max_new_tokens

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - len(self.output_ids)


@dataclass(frozen=True)
class Finished:
    """A request that left the engine. ``reason`` is SGLang-shaped: {"type": ..., ...}.

    ``queued`` is True when it was aborted before it ever ran (SGLang then omits prompt_tokens).
    """

    rid: str
    output_ids: list[int]
    prompt_tokens: int
    reason: dict
    queued: bool = False


@dataclass(frozen=True)
class IterationRecord:
    """One engine step, for calibration: what ran, how big, how long."""

    seq: int
    t: float  # wall clock (time.time()) at the end of the step
    phase: str  # "prefill" | "decode"
    batch_size: int  # requests in the forward pass
    prefill_tokens: int  # tokens run through prefill (0 for decode)
    kv_tokens: int  # KV tokens held after the step
    kv_budget: int
    running: int  # requests running after the step
    waiting: int
    new_token_ratio: float
    retracted: int  # requests retracted before this step
    duration_s: float  # compute time (before --min-step-seconds padding)
    padded_s: float  # wall time of the step including padding

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class StepOutput:
    """What one step did: new tokens per request id, and the requests that finished."""

    kind: str  # "prefill" | "decode" | "idle"
    new_tokens: dict[str, int] = field(default_factory=dict)
    finished: list[Finished] = field(default_factory=list)
    seconds: float = 0.0
    retracted: list[str] = field(default_factory=list)


class BatchEngine:
    """A continuous-batching engine with a real KV cache, on CPU or CUDA."""

    def __init__(self, model: TinyDecoder, cfg: EngineConfig | None = None,
                 decode_text: Callable[[list[int]], str] | None = None) -> None:
        self.cfg = cfg or EngineConfig()
        self.device = torch.device(self.cfg.device)
        self.dtype = getattr(torch, self.cfg.dtype)
        self.model = model.to(device=self.device, dtype=self.dtype).eval()
        self.max_context = min(self.cfg.max_context or model.cfg.max_context, model.cfg.max_context)
        slots = self.cfg.max_running_requests
        self.kv_budget = self.cfg.kv_budget_tokens or slots * self.max_context
        self.max_req_len = min(self.max_context - 1, self.kv_budget - 1)
        self.max_req_input_len = self.max_req_len - 5
        self.pool = KVPool(model.cfg, slots, self.max_context, self.device, self.dtype)
        self.decode_text = decode_text  # for stop strings
        # additive [2, V] output mask (row 0: may stop on EOS, row 1: ignore_eos), or None
        self.output_mask: torch.Tensor | None = None
        self.allowed_output_ids: tuple[int, ...] | None = None
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []
        self.generator = torch.Generator(device=self.device).manual_seed(0)
        self.init_ratio = min(self.cfg.init_new_token_ratio, 1.0)
        self.min_ratio = min(self.init_ratio * self.cfg.min_new_token_ratio_factor, 1.0)
        self.ratio_decay = (self.init_ratio - self.min_ratio) / self.cfg.new_token_ratio_decay_steps
        self.new_token_ratio = self.init_ratio
        self.steps = 0
        self.generated_total = 0
        self.retracted_total = 0
        self.last_step_seconds = 0.0
        self.iterations: deque[IterationRecord] = deque(maxlen=self.cfg.iteration_log_size)

    # ---- queries ---------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.model.cfg.vocab_size

    @property
    def eos_token_id(self) -> int:
        return self.model.cfg.eos_token_id

    @property
    def sampleable_tokens(self) -> int:
        """How many ids a request that may stop on EOS can sample (see :meth:`restrict_output`)."""
        if self.output_mask is None:
            return self.vocab_size
        return int((self.output_mask[0] == 0).sum())

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def used_tokens(self) -> int:
        """KV tokens actually held by running requests."""
        return sum(r.length for r in self.running)

    @property
    def reserved_tokens(self) -> float:
        """KV tokens held plus the reserves of running requests (what admission counts)."""
        return self.used_tokens + sum(self._reserve(r) for r in self.running)

    def rids(self) -> set[str]:
        return {r.rid for r in self.running} | {r.rid for r in self.waiting}

    # ---- commands --------------------------------------------------------------------------
    def validate(self, req: EngineRequest) -> None:
        """Raise ValueError if ``req`` can never be served (SGLang answers such with 400).

        The messages are SGLang's (tokenizer_manager / scheduler), so clients that match on them
        behave the same.
        """
        n = len(req.prompt_ids)
        if not req.prompt_ids:
            raise ParamError("input_ids", "The input_ids is empty: nothing to generate from.")
        if req.max_new_tokens < 0:
            raise ParamError("max_new_tokens",
                             f"max_new_tokens must be at least 0, got {req.max_new_tokens}.")
        bad = [t for t in req.prompt_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ParamError("input_ids", f"token id {bad[0]} out of vocabulary "
                                          f"[0, {self.vocab_size})")
        if n >= self.max_context:
            raise ParamError("input_ids", f"The input ({n} tokens) is longer than the model's "
                                          f"context length ({self.max_context} tokens).")
        if n + req.max_new_tokens > self.max_context:
            raise ParamError(
                "max_new_tokens",
                "Requested token count exceeds the model's maximum context length of "
                f"{self.max_context} tokens. You requested a total of {n + req.max_new_tokens} "
                f"tokens: {n} tokens from the input messages and {req.max_new_tokens} tokens for "
                "the completion. Please reduce the number of tokens in the input messages or the "
                "completion to fit within the limit.")
        if n >= self.max_req_input_len:
            raise ParamError(
                "input_ids", f"Input length ({n} tokens) exceeds the maximum allowed length "
                             f"({self.max_req_input_len} tokens). Use a shorter input or enable "
                             "--allow-auto-truncate.")
        if req.return_logprob and req.logprob_start_len > n:
            raise ParamError(
                "logprob_start_len",
                f"req.logprob_start_len={req.logprob_start_len} is higher than the number of "
                f"input tokens len(req.origin_input_ids)={n}. Please use a smaller "
                "logprob_start_len.")
        if req.top_logprobs_num < 0:
            raise ParamError("top_logprobs_num", "top_logprobs_num must be >= 0")
        if any(not 0 <= t < self.vocab_size for t in req.stop_token_ids):
            raise ParamError("stop_token_ids", "stop_token_ids out of vocabulary")

    def add(self, req: EngineRequest) -> None:
        """Queue ``req``; raises ValueError if it can never fit or its id is taken."""
        self.validate(req)
        if req.rid in self.rids():
            raise ValueError(f"duplicate request id {req.rid!r}")
        # SGLang's scheduler: keep max_new_tokens inside the admission budget.
        req.max_new_tokens = max(0, min(req.max_new_tokens,
                                        self.max_req_len - len(req.prompt_ids) - 1))
        if req.seed is not None:
            req.generator = torch.Generator(device=self.device).manual_seed(req.seed % (2**63))
        if self.cfg.enable_priority_scheduling and self.waiting \
                and self.waiting[-1].priority < req.priority:
            i = next(i for i, q in enumerate(self.waiting) if q.priority < req.priority)
            self.waiting.insert(i, req)
            return
        self.waiting.append(req)

    def abort(self, rid: str = "", abort_all: bool = False) -> list[Finished]:
        """Abort by id prefix (SGLang semantics: ``rid.startswith(prefix)``) or everything.

        Queued requests come back with no output and ``queued=True``; running ones with their
        partial output. Both get finish reason ``{"type": "abort", ...}``. A queued request that
        was retracted keeps the output it had streamed.
        """
        hit = (lambda r: True) if abort_all else (lambda r: r.rid.startswith(rid))
        out: list[Finished] = []
        for r in [r for r in self.waiting if hit(r)]:
            self.waiting.remove(r)
            out.append(Finished(r.rid, list(r.output_ids), len(r.prompt_ids),
                                {"type": "abort", "message": ABORT_QUEUED_MESSAGE},
                                queued=not r.output_ids))
        for r in [r for r in self.running if hit(r)]:
            out.append(self._retire(r, {"type": "abort", "message": ABORT_RUNNING_MESSAGE,
                                        "status_code": None, "err_type": None}))
        return out

    def fail(self, rid: str, message: str, status_code: int = 500) -> Finished | None:
        """End one request with an error finish reason (its partial output kept)."""
        for r in list(self.running):
            if r.rid == rid:
                return self._retire(r, {"type": "abort", "message": message,
                                        "status_code": status_code, "err_type": "InternalError"})
        for r in list(self.waiting):
            if r.rid == rid:
                self.waiting.remove(r)
                return Finished(r.rid, list(r.output_ids), len(r.prompt_ids),
                                {"type": "abort", "message": message, "status_code": status_code,
                                 "err_type": "InternalError"})
        return None

    def retract_all(self) -> int:
        """Move every running request to the tail of the waiting queue, in batch order
        (pause_generation "retract": SGLang's ``_add_request_to_queue`` for each request of
        ``running_batch.reqs``)."""
        n = len(self.running)
        for r in list(self.running):
            self._retract(r)
        return n

    def restrict_output(self, allowed: Iterable[int] | None) -> None:
        """Sample only ``allowed`` ids from now on (``None``: the whole vocabulary again).

        EOS is added for requests that may stop on it; an ``ignore_eos`` request never samples it
        (it would not stop, and its empty text would break the round trip). Prompt ids stay
        unrestricted. Raises ValueError for an empty set or an id outside the vocabulary.
        """
        if allowed is None:
            self.output_mask = self.allowed_output_ids = None
            return
        ids = sorted({int(t) for t in allowed} - {self.eos_token_id})
        if not ids:
            raise ValueError("restrict_output: no token left to sample")
        if ids[0] < 0 or ids[-1] >= self.vocab_size:
            raise ValueError(f"restrict_output: ids must lie in [0, {self.vocab_size})")
        mask = torch.full((2, self.vocab_size), -float("inf"), device=self.device)
        mask[:, ids] = 0.0
        if 0 <= self.eos_token_id < self.vocab_size:
            mask[0, self.eos_token_id] = 0.0
        self.output_mask, self.allowed_output_ids = mask, tuple(ids)

    def _mask_for(self, r: EngineRequest) -> torch.Tensor | None:
        return None if self.output_mask is None else self.output_mask[int(r.ignore_eos)]

    def load_weights(self, model: TinyDecoder) -> None:
        """Copy ``model``'s weights into the live model (same shape required)."""
        if model.cfg != self.model.cfg:
            raise ValueError(f"checkpoint config {model.cfg} does not match the served model "
                             f"{self.model.cfg}")
        self.model.load_state_dict(model.state_dict())

    # ---- the step --------------------------------------------------------------------------
    def step(self) -> StepOutput:
        """Run one prefill batch if anything can be admitted, else one decode iteration."""
        t0 = time.perf_counter()
        admitted = self._admit()
        retracted: list[str] = []
        prefill_tokens = sum(r.length for r in admitted)
        if admitted:
            out = self._prefill(admitted)
            batch = len(admitted)
        elif self.running:
            retracted = self._make_room_for_decode()
            batch = len(self.running)
            out = self._decode()
            out.retracted = retracted
        else:
            out, batch = StepOutput("idle"), 0
        if not self.running:
            self.new_token_ratio = self.init_ratio  # SGLang resets it when the batch empties
        compute = time.perf_counter() - t0
        if out.kind != "idle":
            self.steps += 1
            if self.cfg.min_step_seconds > compute:
                time.sleep(self.cfg.min_step_seconds - compute)
        out.seconds = time.perf_counter() - t0
        self.last_step_seconds = out.seconds
        if out.kind != "idle":
            self.iterations.append(IterationRecord(
                seq=self.steps, t=time.time(), phase=out.kind, batch_size=batch,
                prefill_tokens=prefill_tokens,
                kv_tokens=self.used_tokens, kv_budget=self.kv_budget, running=len(self.running),
                waiting=len(self.waiting), new_token_ratio=self.new_token_ratio,
                retracted=len(retracted), duration_s=compute, padded_s=out.seconds))
        return out

    def _reserve(self, r: EngineRequest) -> float:
        ratio = 1.0 if r.ignore_eos else self.new_token_ratio
        return min(max(r.remaining, 0), self.cfg.clip_max_new_tokens) * ratio

    def _admit(self) -> list[EngineRequest]:
        """FCFS admission under SGLang's PrefillAdder budget (page size 1, no prefix cache).

        ``total`` = KV tokens free minus the running requests' ratio-scaled reserves minus what
        this batch already took (input + 1 + its clipped max_new_tokens); ``current`` = free
        minus this batch's inputs. A candidate needs ``input + min(remaining, clip) < total``;
        an ``ignore_eos`` candidate instead passes SGLang's ``add_one_req_ignore_eos`` check.
        """
        admitted: list[EngineRequest] = []
        prefill_tokens = 0
        free = self.kv_budget - self.used_tokens
        total_offset = sum(self._reserve(r) for r in self.running)
        current_offset = 0
        while (self.waiting and len(self.running) < self.cfg.max_running_requests
               and self.pool.free):
            r = self.waiting[0]
            inp = r.length
            if admitted and prefill_tokens + inp > self.cfg.max_prefill_tokens:
                break
            max_new = min(max(r.remaining, 0), self.cfg.clip_max_new_tokens)
            if r.ignore_eos:
                ok = self._fits_ignore_eos(r, free - current_offset, free - total_offset)
            else:
                ok = inp + max_new < free - total_offset
            if not ok:
                break
            self.waiting.popleft()
            r.slot = self.pool.alloc()
            total_offset += inp + 1 + max_new
            current_offset += inp + 1
            prefill_tokens += inp
            self.running.append(r)
            admitted.append(r)
        return admitted

    def _fits_ignore_eos(self, cand: EngineRequest, rem_current: float,
                         rem_total: float) -> bool:
        """SGLang's check for a fixed-length request: replay the batch's future, requests
        finishing in order of tokens left, and require free KV at every point."""
        inp = cand.length
        if inp > min(rem_current, rem_total):
            return False
        states = []
        for r in [*self.running, cand]:  # running includes this batch's admitted requests
            ratio = 1.0 if r.ignore_eos else self.new_token_ratio
            left = r.max_new_tokens * ratio - len(r.output_ids)
            if left > 0:
                states.append((left, r.length))
        states.sort(key=lambda x: x[0])
        cur_rem = rem_current - inp
        freed = 0
        for i, (left, occupied) in enumerate(states):
            bs = len(states) - i
            if cur_rem + freed - left * bs <= IGNORE_EOS_RESERVE_TOKENS * bs:
                return False
            freed += occupied
        return True

    def _make_room_for_decode(self) -> list[str]:
        """Retract running requests until one more token each fits in the KV budget."""
        if self.used_tokens + len(self.running) <= self.kv_budget:
            self.new_token_ratio = max(self.new_token_ratio - self.ratio_decay, self.min_ratio)
            return []
        keep = sorted(self.running, key=lambda r: (len(r.output_ids), -len(r.prompt_ids)),
                      reverse=True)
        retracted: list[str] = []
        while len(keep) > 1 and sum(r.length + 1 for r in keep) > self.kv_budget:
            r = keep.pop()
            self._retract(r)
            retracted.append(r.rid)
        total_out = sum(len(r.output_ids) for r in keep)
        total_max = sum(r.max_new_tokens for r in keep)
        self.new_token_ratio = min(
            1.0, (total_out + self.cfg.retract_decode_steps * len(keep)) / (total_max + 1))
        log.info("retracted %d requests (KV budget %d); new_token_ratio %.3f",
                 len(retracted), self.kv_budget, self.new_token_ratio)
        return retracted

    def _retract(self, r: EngineRequest) -> None:
        self.running.remove(r)
        self.pool.release(r.slot)
        r.slot = -1
        r.retractions += 1
        self.retracted_total += 1
        self.waiting.append(r)  # SGLang appends retracted requests to the waiting queue

    def _prefill(self, admitted: list[EngineRequest]) -> StepOutput:
        out = StepOutput("prefill")
        for r in admitted:
            try:
                self._prefill_one(r, out)
            except Exception as exc:  # this request alone fails
                self._fail_in_step(r, exc, out)
        return out

    def _prefill_one(self, r: EngineRequest, out: StepOutput) -> None:
        want_input = r.return_logprob and r.input_logprobs is None and r.logprob_start_len >= 0
        if r.output_ids:  # re-prefill after a retraction: the last output is fed by decode
            ids = torch.tensor(r.prompt_ids + r.output_ids[:-1], device=self.device)
            self.model.prefill(ids, self.pool, r.slot)
            return
        if r.max_new_tokens == 0 and not want_input:
            out.finished.append(self._retire(r, {"type": "length", "length": 0}))
            return
        ids = torch.tensor(r.prompt_ids, device=self.device)
        logits = self.model.prefill(ids, self.pool, r.slot, all_logits=want_input)
        if want_input:
            self._input_logprobs(r, logits)
            logits = logits[-1]
        if r.return_logprob and r.input_logprobs is None:
            r.input_logprobs, r.input_top_logprobs = [], []
        if r.max_new_tokens == 0:
            out.finished.append(self._retire(r, {"type": "length", "length": 0}))
            return
        self._sample_and_append(r, logits, out)

    def _input_logprobs(self, r: EngineRequest, logits: torch.Tensor) -> None:
        """SGLang's input_token_logprobs from ``logprob_start_len``: position 0 has None."""
        assert r.spec is not None
        lp = torch.log_softmax(logits.float() / r.spec.temperature, dim=-1)
        vals: list[float | None] = []
        tops: list[list[tuple[float, int]] | None] = []
        for i in range(r.logprob_start_len, len(r.prompt_ids)):
            if i == 0:
                vals.append(None)
                tops.append(None)
                continue
            vals.append(float(lp[i - 1, r.prompt_ids[i]]))
            tops.append(_top(lp[i - 1], r.top_logprobs_num))
        r.input_logprobs, r.input_top_logprobs = vals, tops

    def _decode(self) -> StepOutput:
        out = StepOutput("decode")
        batch = list(self.running)
        ids = torch.tensor([r.output_ids[-1] for r in batch], device=self.device)
        pos = torch.tensor([r.length - 1 for r in batch], device=self.device)
        slots = torch.tensor([r.slot for r in batch], device=self.device)
        logits = self.model.decode(ids, pos, slots, self.pool)
        fast = self._sample_plain_rows(batch, logits)
        for i, r in enumerate(batch):
            try:
                if i in fast:
                    tok, lp = fast[i]
                    self._record_logprob(r, tok, lp)
                    self._append(r, tok, out)
                else:
                    self._sample_and_append(r, logits[i], out)
            except Exception as exc:  # this request alone fails
                self._fail_in_step(r, exc, out)
        return out

    def _is_plain(self, r: EngineRequest) -> bool:
        """No penalty, bias, filter or min_new_tokens block: batchable sampling."""
        s = r.spec
        assert s is not None
        return (not s.needs_penalties and not s.logit_bias and s.top_p >= 1.0 and s.min_p <= 0.0
                and (s.greedy or s.top_k >= self.vocab_size)
                and (s.ignore_eos or len(r.output_ids) >= s.min_new_tokens))

    def _sample_plain_rows(self, batch: list[EngineRequest],
                           logits: torch.Tensor) -> dict[int, tuple[int, torch.Tensor]]:
        """Sample the plain rows of a decode batch with batched tensor ops (the hot path).

        Same distribution as :func:`sample_next`: greedy rows take the argmax, the others draw
        from ``softmax(logits / temperature)`` (with their own generator if seeded), both after
        the output mask.
        """
        rows = [i for i, r in enumerate(batch) if self._is_plain(r)]
        if not rows:
            return {}
        try:
            sub = logits[rows].float()
            if self.output_mask is not None:
                which = torch.tensor([int(batch[i].ignore_eos) for i in rows], device=sub.device)
                sub = sub + self.output_mask[which]
            temps = torch.tensor(
                [batch[i].spec.temperature for i in rows],  # type: ignore[union-attr]
                device=sub.device)[:, None]
            lps = torch.log_softmax(sub / temps, dim=-1)
            greedy = sub.argmax(-1).tolist()
            shared = [j for j, i in enumerate(rows)
                      if not batch[i].spec.greedy  # type: ignore[union-attr]
                      and batch[i].generator is None]
            drawn: dict[int, int] = {}
            if shared:
                picks = torch.multinomial(lps[shared].exp(), 1, generator=self.generator)
                drawn = dict(zip(shared, picks.squeeze(1).tolist()))
        except Exception:  # fall back to the per-request path, which isolates failures
            return {}
        out: dict[int, tuple[int, torch.Tensor]] = {}
        for j, i in enumerate(rows):
            r = batch[i]
            if r.spec.greedy:  # type: ignore[union-attr]
                tok = greedy[j]
            elif j in drawn:
                tok = drawn[j]
            else:
                tok = int(torch.multinomial(lps[j].exp(), 1, generator=r.generator))
            out[i] = (tok, lps[j])
        return out

    def _record_logprob(self, r: EngineRequest, tok: int, lp: torch.Tensor) -> None:
        if r.return_logprob:
            r.output_logprobs.append(float(lp[tok]))
            if r.top_logprobs_num:
                r.output_top_logprobs.append(_top(lp, r.top_logprobs_num))

    def _fail_in_step(self, r: EngineRequest, exc: Exception, out: StepOutput) -> None:
        log.error("request %s failed in the engine step:\n%s", r.rid,
                  "".join(traceback.format_exception(exc)))
        if r in self.running:
            out.finished.append(self._retire(r, {
                "type": "abort", "message": f"Internal server error: {type(exc).__name__}: {exc}",
                "status_code": 500, "err_type": "InternalServerError"}))

    def _sample_and_append(self, r: EngineRequest, logits: torch.Tensor, out: StepOutput) -> None:
        s = r.spec
        assert s is not None
        blocked: tuple[int, ...] = ()
        if len(r.output_ids) < s.min_new_tokens and not s.ignore_eos:
            blocked = (self.eos_token_id, *s.stop_token_ids)
        adj = adjust_logits(logits, s, r.prompt_ids, r.output_ids, blocked, self._mask_for(r))
        gen = r.generator if r.generator is not None else self.generator
        tok, lp = sample_next(adj, s, gen)
        self._record_logprob(r, tok, lp)
        self._append(r, tok, out)

    def _append(self, r: EngineRequest, tok: int, out: StepOutput) -> None:
        r.output_ids.append(tok)
        out.new_tokens[r.rid] = tok
        self.generated_total += 1
        s = r.spec
        assert s is not None
        may_stop = not r.ignore_eos and len(r.output_ids) > s.min_new_tokens - 1
        if may_stop and (tok == self.eos_token_id or tok in r.stop_token_ids):
            out.finished.append(self._retire(r, {"type": "stop", "matched": tok}))
        elif may_stop and s.stop_strs and (hit := self._stop_str(r)) is not None:
            out.finished.append(self._retire(r, {"type": "stop", "matched": hit}))
        elif len(r.output_ids) >= r.max_new_tokens:
            out.finished.append(self._retire(r, {"type": "length", "length": r.max_new_tokens}))

    def _stop_str(self, r: EngineRequest) -> str | None:
        """The stop string that the output's tail now ends in or contains, if any."""
        if self.decode_text is None:
            return None
        assert r.spec is not None
        longest = max(len(x) for x in r.spec.stop_strs)
        tail = self.decode_text(r.output_ids[-(longest + 2):])
        for x in r.spec.stop_strs:
            if x in tail:
                return x
        return None

    def _retire(self, r: EngineRequest, reason: dict) -> Finished:
        self.running.remove(r)
        self.pool.release(r.slot)
        r.slot = -1
        return Finished(r.rid, list(r.output_ids), len(r.prompt_ids), reason)


def _top(lp: torch.Tensor, k: int) -> list[tuple[float, int]]:
    if k <= 0:
        return []
    vals, idx = lp.topk(min(k, lp.shape[-1]))
    return [(float(v), int(i)) for v, i in zip(vals.tolist(), idx.tolist())]
