"""One async engine protocol for every live engine (SGLang over HTTP, the bundled torch engine).

The scheduler runner on top of `real/` talks only to :class:`Engine`: submit a request, watch its
progress, get a final :class:`GenerateResult` (output ids, finish reason, timings), abort everything
in flight, ask for health, server info and the weight version. Nothing here does I/O; the types are
plain dataclasses so that a result can be logged, compared and replayed.

Finish reasons reuse :class:`aprilsim.types.FinishReason` (stop / length / abort). A request that
could not be completed because of an engine failure (worker died, stream cut, retries exhausted)
comes back as ``finish_reason=ABORT`` with ``error`` set and the partial output it had reached, so
that the caller can resume it like any aborted sample: no sample is ever lost silently.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Protocol, runtime_checkable

from aprilsim.types import FinishReason

__all__ = [
    "Engine",
    "FinishReason",
    "GenerateRequest",
    "GenerateResult",
    "Progress",
    "SamplingParams",
    "ServerInfo",
    "Timings",
    "WeightSync",
    "resume_request",
]


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """The sampling knobs a rollout uses. ``temperature`` is always sent explicitly.

    ``stop_token_ids`` end a response early (EOS and friends); they are ignored in replay mode.
    ``seed`` makes sampling reproducible on engines that support it.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    """One sample to generate.

    ``max_new_tokens`` is the remainder of the response budget (max_response_len minus what a
    resumed sample already holds). ``replay_len``, when set, switches to replay mode: the engine
    ignores EOS and generates exactly ``min(replay_len, max_new_tokens)`` tokens, so that a live run
    does the same work as a simulated one. A replayed response that reaches ``replay_len`` before
    ``max_new_tokens`` is reported as ``stop`` (the synthetic EOS), otherwise as ``length``.

    ``tag`` is an opaque caller key (e.g. the sample uid) carried into the result. ``priority``
    (higher first, ``Submit.priority``) goes to engines that schedule by it (SGLang's
    ``priority`` field, honoured when the server runs with ``--enable-priority-scheduling``).
    """

    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    replay_len: int | None = None
    tag: object = None
    priority: int = 0

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if self.replay_len is not None and self.replay_len < 0:
            raise ValueError(f"replay_len must be >= 0, got {self.replay_len}")

    @property
    def replay(self) -> bool:
        return self.replay_len is not None

    @property
    def tokens_to_generate(self) -> int:
        """The most tokens this request can produce (exactly this many in replay mode)."""
        if self.replay_len is None:
            return self.max_new_tokens
        return min(self.replay_len, self.max_new_tokens)


@dataclass(slots=True)
class Timings:
    """Wall-clock marks (``time.monotonic()`` seconds) of one request, as seen by the client."""

    submitted: float = 0.0
    first_token: float | None = None
    finished: float | None = None
    # when the engine first scheduled it (its queue wait ended), on the same clock, where the
    # engine says (the simulated engines of `real.runner.virtual`); None: not known
    scheduled: float | None = None
    # when the server answered with its headers: it had the request (vLLM and the bundled server
    # answer once it is queued on the engine); None where not observed
    accepted: float | None = None

    def mark_accepted(self) -> None:
        """The server has the request now (its first answer; a retry keeps the first)."""
        if self.accepted is None:
            self.accepted = time.monotonic()

    @property
    def latency(self) -> float | None:
        return None if self.finished is None else self.finished - self.submitted

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.submitted


@dataclass(frozen=True, slots=True)
class Progress:
    """Streamed progress: ``new_ids`` were just generated, ``generated`` is the running total."""

    rid: str
    new_ids: tuple[int, ...]
    generated: int


@dataclass(slots=True)
class GenerateResult:
    """The final word on one request.

    ``output_ids`` are the tokens generated by this request (not including the prompt).
    ``error`` is set when the request failed (engine died, non-retryable error, retries exhausted);
    ``finish_reason`` is then ``ABORT`` and ``output_ids`` hold whatever partial output was
    received. ``prompt_tokens`` is None when the engine did not report it (SGLang omits it for a
    request aborted in its waiting queue). ``attempts`` counts HTTP submissions (1 = no retry).
    """

    rid: str
    request: GenerateRequest
    output_ids: list[int]
    finish_reason: FinishReason
    timings: Timings
    error: str | None = None
    prompt_tokens: int | None = None
    abort_message: str | None = None
    weight_version: str | None = None
    worker: str | None = None
    attempts: int = 1

    @property
    def failed(self) -> bool:
        return self.error is not None

    @property
    def aborted(self) -> bool:
        return self.finish_reason is FinishReason.ABORT

    @property
    def finished(self) -> bool:
        """True when the response is complete (stop or length), i.e. needs no resume."""
        return self.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)

    @property
    def generated(self) -> int:
        return len(self.output_ids)


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """What an engine says about itself; ``None`` where it does not say."""

    max_running_requests: int | None = None
    kv_capacity_tokens: int | None = None
    max_context_length: int | None = None
    incremental_streaming_output: bool = False
    version: str | None = None
    workers: tuple[str, ...] = ()
    raw: dict = field(default_factory=dict, compare=False, repr=False)


def resume_request(result: GenerateResult) -> GenerateRequest | None:
    """The request that continues an aborted/partial result, or None if nothing remains.

    Resume = re-submit prompt + partial output ids, with ``max_new_tokens`` (and the replay length)
    reduced by the partial length. A result that already finished needs no resume.
    """
    req = result.request
    if result.finished:
        return None
    done = len(result.output_ids)
    remaining_budget = req.max_new_tokens - done
    remaining_replay = None if req.replay_len is None else req.replay_len - done
    if remaining_budget <= 0 or (remaining_replay is not None and remaining_replay <= 0):
        return None
    return replace(
        req,
        prompt_ids=tuple(req.prompt_ids) + tuple(result.output_ids),
        max_new_tokens=remaining_budget,
        replay_len=remaining_replay,
    )


def replay_finish_reason(req: GenerateRequest, generated: int,
                         engine_reason: FinishReason) -> FinishReason:
    """Map an engine's finish reason to the sample's, for replay mode.

    In replay mode the engine is asked for exactly ``tokens_to_generate`` tokens with EOS ignored,
    so it always reports ``length``; the sample itself stopped (synthetic EOS) unless its budget
    ``max_new_tokens`` is what ran out.
    """
    if engine_reason is not FinishReason.LENGTH or req.replay_len is None:
        return engine_reason
    if generated >= req.max_new_tokens:
        return FinishReason.LENGTH
    return FinishReason.STOP if generated >= req.replay_len else engine_reason


ProgressCallback = Callable[[Progress], None]


@runtime_checkable
class Engine(Protocol):
    """The async interface every live engine offers to the runner.

    ``generate`` submits one request and returns when it is finished, aborted or failed; progress
    goes to ``on_progress`` as tokens stream in. It never raises for engine-side failures: those
    come back as a result with ``error`` set. ``abort_all`` aborts everything in flight on the
    engine (every worker) and returns once the engine is idle and every ``generate`` call has
    returned its partial result.
    """

    async def generate(
        self, request: GenerateRequest, on_progress: ProgressCallback | None = None
    ) -> GenerateResult: ...

    def stream(self, request: GenerateRequest) -> AsyncIterator[Progress | GenerateResult]: ...

    async def abort_all(self) -> None: ...

    async def health(self) -> bool: ...

    async def server_info(self) -> ServerInfo: ...

    async def weight_version(self) -> str | None: ...

    async def close(self) -> None: ...


@runtime_checkable
class WeightSync(Protocol):
    """Optional engine capabilities the scheduler runner uses around a weight update.

    Kept apart from :class:`Engine` so that engines without them still satisfy it; the runner
    checks ``isinstance(engine, WeightSync)`` and otherwise only holds back new submissions.

    - ``update_weights(version, path=None)``: the engine now serves policy ``version``; with
      ``path`` it loads the checkpoint there first (SGLang ``/update_weights_from_disk``),
      without it only the version label changes (``/update_weight_version``).
    - ``pause()`` / ``resume()``: stop and restart decoding, keeping in-flight requests (SGLang
      ``/pause_generation`` in place and ``/continue_generation``, as slime does around a sync).
      They return False when the engine does not support it.
    """

    async def update_weights(self, version: str, path: str | None = None) -> None: ...

    async def pause(self) -> bool: ...

    async def resume(self) -> bool: ...


async def stream_via_generate(
    engine: Engine, request: GenerateRequest
) -> AsyncIterator[Progress | GenerateResult]:
    """Adapt ``generate`` + callback into an async iterator (progress items, then the result)."""
    import asyncio

    queue: asyncio.Queue[Progress | GenerateResult] = asyncio.Queue()

    async def run() -> None:
        res = await engine.generate(request, on_progress=queue.put_nowait)
        queue.put_nowait(res)

    task = asyncio.create_task(run())
    try:
        while True:
            item = await queue.get()
            yield item
            if isinstance(item, GenerateResult):
                break
        await task
    finally:
        if not task.done():
            task.cancel()


