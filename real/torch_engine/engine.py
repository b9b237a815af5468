"""Continuous batching over :class:`TinyDecoder`: admission, prefill, decode, finish, abort.

:class:`BatchEngine` is synchronous and single-threaded: the caller adds requests, aborts them,
and calls :meth:`BatchEngine.step`, which runs either one prefill batch (the requests admitted this
step) or one decode iteration over every running request, as SGLang does by default (prefill
first, not mixed). The asyncio driver in :mod:`real.torch_engine.runner` calls these methods
between steps, never during one.

Admission follows two limits: ``max_running_requests`` (the slots of the KV pool) and a KV token
budget. A request reserves ``prompt + tokens it may generate`` tokens when admitted, so the budget
can never be exceeded mid-decode and no retraction is needed (SGLang reserves less and retracts;
with replay lengths known in advance the exact reservation costs nothing). Requests are admitted
in FIFO order; the head of the queue blocks the rest (no overtaking), as in SGLang's default
policy.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import torch

from .model import KVPool, TinyDecoder

ABORT_QUEUED_MESSAGE = "Abort in waiting queue"
ABORT_RUNNING_MESSAGE = "Aborted"


@dataclass(frozen=True)
class EngineConfig:
    """Engine limits. ``kv_budget_tokens`` defaults to slots x context (no extra limit)."""

    max_running_requests: int = 32
    kv_budget_tokens: int | None = None
    max_context: int | None = None  # defaults to the model's
    max_prefill_tokens: int = 8192  # prompt tokens per prefill step (at least one request runs)
    device: str = "cpu"
    dtype: str = "float32"
    min_step_seconds: float = 0.0  # pad each step to this duration (emulates a slower device)


@dataclass(eq=False)
class EngineRequest:
    """One request inside the engine. ``max_new_tokens`` is what it may generate at most."""

    rid: str
    prompt_ids: list[int]
    max_new_tokens: int
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    # engine state
    output_ids: list[int] = field(default_factory=list)
    slot: int = -1
    reserved: int = 0
    arrived: float = field(default_factory=time.monotonic)
    generator: torch.Generator | None = None

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def need(self) -> int:
        return len(self.prompt_ids) + self.max_new_tokens


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


@dataclass
class StepOutput:
    """What one step did: new tokens per request id, and the requests that finished."""

    kind: str  # "prefill" | "decode" | "idle"
    new_tokens: dict[str, int] = field(default_factory=dict)
    finished: list[Finished] = field(default_factory=list)
    seconds: float = 0.0


class BatchEngine:
    """A continuous-batching engine with a real KV cache, on CPU or CUDA."""

    def __init__(self, model: TinyDecoder, cfg: EngineConfig | None = None) -> None:
        self.cfg = cfg or EngineConfig()
        self.device = torch.device(self.cfg.device)
        dtype = getattr(torch, self.cfg.dtype)
        self.model = model.to(device=self.device, dtype=dtype).eval()
        self.max_context = min(self.cfg.max_context or model.cfg.max_context, model.cfg.max_context)
        slots = self.cfg.max_running_requests
        self.kv_budget = self.cfg.kv_budget_tokens or slots * self.max_context
        self.pool = KVPool(model.cfg, slots, self.max_context, self.device, dtype)
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []
        self.reserved_tokens = 0
        self.generator = torch.Generator(device=self.device).manual_seed(0)
        self.steps = 0
        self.generated_total = 0
        self.last_step_seconds = 0.0

    # ---- queries ---------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.model.cfg.vocab_size

    @property
    def eos_token_id(self) -> int:
        return self.model.cfg.eos_token_id

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def used_tokens(self) -> int:
        """KV tokens actually held by running requests."""
        return sum(r.length for r in self.running)

    def rids(self) -> set[str]:
        return {r.rid for r in self.running} | {r.rid for r in self.waiting}

    # ---- commands --------------------------------------------------------------------------
    def validate(self, req: EngineRequest) -> None:
        """Raise ValueError if ``req`` can never be served (SGLang answers such with 400)."""
        if not req.prompt_ids:
            raise ValueError("empty prompt")
        if req.max_new_tokens < 0:
            raise ValueError("max_new_tokens must be >= 0")
        bad = [t for t in req.prompt_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} out of vocabulary [0, {self.vocab_size})")
        if req.need > self.max_context:
            raise ValueError(
                f"prompt ({len(req.prompt_ids)}) + max_new_tokens ({req.max_new_tokens}) "
                f"exceeds the maximum context length ({self.max_context})"
            )
        if req.need > self.kv_budget:
            raise ValueError(f"request needs {req.need} KV tokens, budget is {self.kv_budget}")

    def add(self, req: EngineRequest) -> None:
        """Queue ``req``; raises ValueError if it can never fit or its id is taken."""
        self.validate(req)
        if req.rid in self.rids():
            raise ValueError(f"duplicate request id {req.rid!r}")
        if req.seed is not None:
            req.generator = torch.Generator(device=self.device).manual_seed(req.seed)
        self.waiting.append(req)

    def abort(self, rid: str = "", abort_all: bool = False) -> list[Finished]:
        """Abort by id prefix (SGLang semantics: ``rid.startswith(prefix)``) or everything.

        Queued requests come back with no output and ``queued=True``; running ones with their
        partial output. Both get finish reason ``{"type": "abort", ...}``.
        """
        hit = (lambda r: True) if abort_all else (lambda r: r.rid.startswith(rid))
        out: list[Finished] = []
        for r in [r for r in self.waiting if hit(r)]:
            self.waiting.remove(r)
            out.append(Finished(r.rid, [], len(r.prompt_ids),
                                {"type": "abort", "message": ABORT_QUEUED_MESSAGE}, queued=True))
        for r in [r for r in self.running if hit(r)]:
            out.append(self._retire(r, {"type": "abort", "message": ABORT_RUNNING_MESSAGE,
                                        "status_code": None, "err_type": None}))
        return out

    # ---- the step --------------------------------------------------------------------------
    def step(self) -> StepOutput:
        """Run one prefill batch if anything can be admitted, else one decode iteration."""
        t0 = time.perf_counter()
        admitted = self._admit()
        if admitted:
            out = self._prefill(admitted)
        elif self.running:
            out = self._decode()
        else:
            out = StepOutput("idle")
        self.steps += out.kind != "idle"
        elapsed = time.perf_counter() - t0
        if out.kind != "idle" and self.cfg.min_step_seconds > elapsed:
            time.sleep(self.cfg.min_step_seconds - elapsed)
        out.seconds = time.perf_counter() - t0
        self.last_step_seconds = out.seconds
        return out

    def _admit(self) -> list[EngineRequest]:
        admitted: list[EngineRequest] = []
        prefill_tokens = 0
        while self.waiting and len(self.running) < self.cfg.max_running_requests:
            r = self.waiting[0]
            if self.reserved_tokens + r.need > self.kv_budget:
                break
            if admitted and prefill_tokens + len(r.prompt_ids) > self.cfg.max_prefill_tokens:
                break
            self.waiting.popleft()
            r.slot = self.pool.alloc()
            r.reserved = r.need
            self.reserved_tokens += r.need
            prefill_tokens += len(r.prompt_ids)
            self.running.append(r)
            admitted.append(r)
        return admitted

    def _prefill(self, admitted: list[EngineRequest]) -> StepOutput:
        out = StepOutput("prefill")
        for r in admitted:
            if r.max_new_tokens == 0:
                out.finished.append(self._retire(r, {"type": "length", "length": 0}))
                continue
            ids = torch.tensor(r.prompt_ids, device=self.device)
            logits = self.model.prefill(ids, self.pool, r.slot)
            tok = self._sample(logits[None], [r])[0]
            self._append(r, tok, out)
        return out

    def _decode(self) -> StepOutput:
        out = StepOutput("decode")
        batch = list(self.running)
        ids = torch.tensor([r.output_ids[-1] for r in batch], device=self.device)
        pos = torch.tensor([r.length - 1 for r in batch], device=self.device)
        slots = torch.tensor([r.slot for r in batch], device=self.device)
        logits = self.model.decode(ids, pos, slots, self.pool)
        for r, tok in zip(batch, self._sample(logits, batch), strict=True):
            self._append(r, tok, out)
        return out

    def _append(self, r: EngineRequest, tok: int, out: StepOutput) -> None:
        r.output_ids.append(tok)
        out.new_tokens[r.rid] = tok
        self.generated_total += 1
        stops = r.stop_token_ids + (self.eos_token_id,)
        if not r.ignore_eos and tok in stops:
            out.finished.append(self._retire(r, {"type": "stop", "matched": tok}))
        elif len(r.output_ids) >= r.max_new_tokens:
            out.finished.append(self._retire(r, {"type": "length", "length": r.max_new_tokens}))

    def _retire(self, r: EngineRequest, reason: dict) -> Finished:
        self.running.remove(r)
        self.pool.release(r.slot)
        self.reserved_tokens -= r.reserved
        r.slot, r.reserved = -1, 0
        return Finished(r.rid, list(r.output_ids), len(r.prompt_ids), reason)

    def _sample(self, logits: torch.Tensor, reqs: list[EngineRequest]) -> list[int]:
        """Greedy for temperature 0, else temperature / top-k / top-p sampling."""
        logits = logits.float()
        temps = torch.tensor([max(r.temperature, 0.0) for r in reqs], device=logits.device)
        greedy = logits.argmax(-1)
        if bool((temps <= 1e-5).all()):
            return greedy.tolist()
        scaled = logits / temps.clamp_min(1e-5)[:, None]
        for i, r in enumerate(reqs):
            if 0 < r.top_k < scaled.shape[-1]:
                kth = scaled[i].topk(r.top_k).values[-1]
                scaled[i][scaled[i] < kth] = -float("inf")
            if r.top_p < 1.0:
                sorted_l, order = scaled[i].sort(descending=True)
                cut = sorted_l.softmax(-1).cumsum(-1) - sorted_l.softmax(-1) > r.top_p
                scaled[i][order[cut]] = -float("inf")
        probs = scaled.softmax(-1)
        out: list[int] = []
        shared = torch.multinomial(probs, 1, generator=self.generator).squeeze(1).tolist()
        for i, r in enumerate(reqs):
            if temps[i] <= 1e-5:
                out.append(int(greedy[i]))
            elif r.generator is not None:
                out.append(int(torch.multinomial(probs[i], 1, generator=r.generator)))
            else:
                out.append(int(shared[i]))
        return out
