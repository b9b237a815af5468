"""The vLLM adapter: :class:`real.protocol.Engine` over vLLM's OpenAI-compatible server.

One ``vllm serve`` endpoint (a data-parallel server counts as one; put several behind the runner
as several engines):

- generation: ``POST /v1/completions`` with a token-id prompt, streamed, the generated ids read
  from ``token_ids`` (or logprob tokens, see :mod:`real.clients.vllm_wire`), checked against the
  final ``usage.completion_tokens``;
- abort: vLLM aborts a request when its client disconnects, so :meth:`VLLMEngine.abort_all`
  closes every open stream (each ``generate`` returns ``ABORT`` with the ids received so far),
  then polls ``/metrics`` until the server runs and queues nothing;
- faults: connection errors, timeouts, 5xx/429 and streams cut before their ``finish_reason`` are
  retried with backoff; a retry after partial output re-submits prompt + partial ids with the
  reduced ``max_tokens`` (resume). When attempts run out, the result is failed-with-partial
  (``ABORT``, ``error`` set, ids so far kept). Other 4xx are not retried;
- load: ``/metrics`` (``vllm:num_requests_running`` / ``_waiting``, ``vllm:kv_cache_usage_perc``,
  ``vllm:cache_config_info``); health: ``/health``; model and context length: ``/v1/models``;
- weights (only with ``VLLM_SERVER_DEV_MODE=1``, which mounts vLLM's RL endpoints):
  ``GET /weight_info``, ``POST /update_weight_version``, ``POST /collective_rpc``
  (``reload_weights`` from a path), ``POST /pause?mode=keep`` / ``POST /resume``. Without dev mode
  they answer 404: ``weight_version`` is then None, ``pause``/``resume`` return False,
  ``update_weights`` only warns for a relabel and raises :class:`NotSupported` for a load.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp

from aprilsim.types import FinishReason

from ..protocol import (
    GenerateRequest,
    GenerateResult,
    Progress,
    ProgressCallback,
    ServerInfo,
    Timings,
    replay_finish_reason,
    resume_request,
    stream_via_generate,
)
from .http import RetryPolicy, RidFactory
from .vllm_wire import (
    MetricsLoad,
    ParsedFinish,
    StreamError,
    completion_payload,
    is_retryable_status,
    parse_counters,
    parse_error_body,
    parse_metrics,
    parse_sse_line,
    parse_stream_chunk,
)

log = logging.getLogger(__name__)
FIRST_POLL_S = 0.005  # the first wait while an abort lands (then doubling to poll_interval_s)

__all__ = ["NotSupported", "VLLMConfig", "VLLMEngine"]


class NotSupported(RuntimeError):
    """The server does not offer this (e.g. weight endpoints without ``VLLM_SERVER_DEV_MODE=1``)."""


@dataclass(frozen=True)
class VLLMConfig:
    """Timeouts (seconds) and policies of :class:`VLLMEngine`.

    ``read_timeout_s`` bounds the silence between two stream chunks (a queued request sends
    nothing: keep it well above the longest expected queueing time). ``ids_via``:
    ``"token_ids"`` (``return_token_ids``, vLLM >= 0.10.2) or ``"logprobs"`` (older servers).
    ``wait_idle_after_abort``: poll ``/metrics`` after closing the streams until nothing runs.
    ``weights_timeout_s`` bounds a weight reload from disk.
    """

    connect_timeout_s: float = 5.0
    read_timeout_s: float = 600.0
    control_timeout_s: float = 10.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    abort_timeout_s: float = 60.0
    poll_interval_s: float = 0.05
    ids_via: str = "token_ids"
    wait_idle_after_abort: bool = True
    weights_timeout_s: float = 600.0


class _Retryable(Exception):
    """A failure worth another attempt (connection, timeout, 5xx, cut stream)."""


class _Fatal(Exception):
    """A failure another attempt will not fix (4xx, malformed response, missing ids)."""


class _Aborted(Exception):
    """This attempt's stream was closed by :meth:`VLLMEngine.abort_all`."""


@dataclass(eq=False)
class _InFlight:
    rid: str
    abort_requested: bool = False
    task: asyncio.Task | None = None


@dataclass
class _Outcome:
    finish: ParsedFinish
    prompt_tokens: int | None
    weight_version: str | None


class VLLMEngine:
    """An :class:`~real.protocol.Engine` backed by one vLLM OpenAI-compatible server at ``url``.

    ``model``: the ``model`` field sent with each request; asked of ``/v1/models`` (its first
    model) when omitted.
    """

    family = "vllm"  # its rules: aprilsim.engine.families.vllm

    def __init__(self, url: str, model: str | None = None,
                 config: VLLMConfig | None = None) -> None:
        self.url = url.rstrip("/")
        self.model = model
        self.cfg = config or VLLMConfig()
        self.new_rid = RidFactory()
        self._session: aiohttp.ClientSession | None = None
        self._inflight: dict[str, _InFlight] = {}
        self._not_aborting = asyncio.Event()
        self._not_aborting.set()
        self._abort_lock = asyncio.Lock()
        self._drained = asyncio.Event()
        self._drained.set()
        self._model_lock = asyncio.Lock()
        self._warned_no_dev = False

    # ---- plumbing --------------------------------------------------------------------------
    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0),
                timeout=aiohttp.ClientTimeout(total=None, connect=self.cfg.connect_timeout_s),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> VLLMEngine:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def _control_timeout(self) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(total=self.cfg.control_timeout_s,
                                     connect=self.cfg.connect_timeout_s)

    async def _request(self, method: str, path: str, body: dict | None = None,
                       timeout_s: float | None = None) -> tuple[int, object]:
        """``(status, JSON or text)`` of a control call; ``(0, None)`` when unreachable."""
        timeout = self._control_timeout() if timeout_s is None else aiohttp.ClientTimeout(
            total=timeout_s, connect=self.cfg.connect_timeout_s)
        try:
            async with self.session.request(method, self.url + path, json=body,
                                            timeout=timeout) as resp:
                raw = await resp.read()
                try:
                    return resp.status, json.loads(raw) if raw else None
                except ValueError:
                    return resp.status, raw.decode("utf-8", "replace")
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return 0, None

    # ---- discovery -------------------------------------------------------------------------
    async def workers(self) -> list[str]:
        """The one server behind this engine (same shape as the SGLang client's)."""
        return [self.url]

    async def models(self) -> list[dict]:
        """``/v1/models`` ``data`` (model cards: ``id``, ``max_model_len``, ...); [] if unknown."""
        status, body = await self._request("GET", "/v1/models")
        if status == 200 and isinstance(body, dict) and isinstance(body.get("data"), list):
            return [m for m in body["data"] if isinstance(m, dict)]
        return []

    async def _model_name(self) -> str | None:
        if self.model is None:
            async with self._model_lock:
                if self.model is None:
                    cards = await self.models()
                    if cards and isinstance(cards[0].get("id"), str):
                        self.model = cards[0]["id"]
        return self.model

    # ---- generation ------------------------------------------------------------------------
    def stream(self, request: GenerateRequest) -> AsyncIterator[Progress | GenerateResult]:
        return stream_via_generate(self, request)

    async def generate(
        self, request: GenerateRequest, on_progress: ProgressCallback | None = None
    ) -> GenerateResult:
        await self._not_aborting.wait()
        timings = Timings(submitted=time.monotonic())
        output: list[int] = []
        attempts = 0
        current: GenerateRequest | None = request
        prompt_tokens = weight_version = None
        entry = _InFlight(rid="")
        first_rid = None

        def result(reason: FinishReason, error: str | None = None,
                   message: str | None = None) -> GenerateResult:
            timings.finished = time.monotonic()
            return GenerateResult(
                rid=first_rid or entry.rid, request=request, output_ids=output,
                finish_reason=reason, timings=timings, error=error, prompt_tokens=prompt_tokens,
                abort_message=message, weight_version=weight_version, worker=self.url,
                attempts=attempts,
            )

        try:
            while True:
                if current is None or current.tokens_to_generate <= 0:
                    base = (FinishReason.LENGTH if len(output) >= request.tokens_to_generate
                            else FinishReason.ABORT)
                    return result(replay_finish_reason(request, len(output), base))
                if entry.abort_requested:
                    return result(FinishReason.ABORT, message="aborted by abort_all")
                attempts += 1
                rid = self.new_rid()
                first_rid = first_rid or rid
                self._register(entry, rid)
                try:
                    out = await self._attempt(entry, current, rid, output, on_progress, timings)
                except _Aborted:
                    return result(FinishReason.ABORT,
                                  message="aborted by abort_all (stream closed)")
                except _Fatal as exc:
                    return result(FinishReason.ABORT, error=str(exc))
                except _Retryable as exc:
                    log.info("attempt %d of %s failed: %s", attempts, rid, exc)
                    if entry.abort_requested:
                        return result(FinishReason.ABORT, message="aborted by abort_all")
                    if attempts >= self.cfg.retry.max_attempts:
                        return result(FinishReason.ABORT,
                                      error=f"gave up after {attempts} attempts: {exc}")
                    await asyncio.sleep(self.cfg.retry.backoff(attempts))
                    current = _remainder(request, output)
                    continue
                if out.prompt_tokens is not None and prompt_tokens is None:
                    prompt_tokens = out.prompt_tokens - (len(current.prompt_ids)
                                                         - len(request.prompt_ids))
                weight_version = out.weight_version or weight_version
                reason = out.finish.reason
                if reason is FinishReason.ABORT:
                    code = out.finish.status_code
                    if code is not None and is_retryable_status(code) \
                            and not entry.abort_requested \
                            and attempts < self.cfg.retry.max_attempts:
                        await asyncio.sleep(self.cfg.retry.backoff(attempts))
                        current = _remainder(request, output)
                        continue
                    err = (None if code is None
                           else f"engine ended the request: {out.finish.message}")
                    return result(FinishReason.ABORT, error=err, message=out.finish.message)
                return result(replay_finish_reason(request, len(output), reason))
        finally:
            self._unregister(entry)

    def _register(self, entry: _InFlight, rid: str) -> None:
        self._inflight.pop(entry.rid, None)
        entry.rid = rid
        self._inflight[rid] = entry
        self._drained.clear()

    def _unregister(self, entry: _InFlight) -> None:
        self._inflight.pop(entry.rid, None)
        if not self._inflight:
            self._drained.set()

    async def _attempt(self, entry: _InFlight, req: GenerateRequest, rid: str, output: list[int],
                       on_progress: ProgressCallback | None, timings: Timings) -> _Outcome:
        """One HTTP attempt in a task of its own, so that abort_all can close its stream."""
        task = asyncio.ensure_future(self._stream_once(req, rid, output, on_progress, timings))
        entry.task = task
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            task.cancel()  # generate itself was cancelled: close the stream too
            raise
        finally:
            entry.task = None
        if task.cancelled():
            raise _Aborted()
        return task.result()

    async def _stream_once(self, req: GenerateRequest, rid: str, output: list[int],
                           on_progress: ProgressCallback | None, timings: Timings) -> _Outcome:
        """Stream one request; appends new ids to ``output`` as they arrive (kept on any
        failure)."""
        payload = completion_payload(req, await self._model_name(), rid, self.cfg.ids_via)
        timeout = aiohttp.ClientTimeout(total=None, connect=self.cfg.connect_timeout_s,
                                        sock_read=self.cfg.read_timeout_s)
        got = 0
        finish: ParsedFinish | None = None
        prompt_tokens = completion_tokens = version = None
        try:
            async with self.session.post(f"{self.url}/v1/completions", json=payload,
                                         timeout=timeout) as resp:
                timings.mark_accepted()
                try:
                    if resp.status != 200:
                        msg = parse_error_body(resp.status, await resp.read())
                        raise (_Retryable if is_retryable_status(resp.status) else _Fatal)(msg)
                    async for raw_line in resp.content:
                        try:
                            item = parse_sse_line(raw_line)
                        except ValueError as exc:
                            raise _Fatal(f"malformed stream line {raw_line[:200]!r}: "
                                         f"{exc}") from exc
                        if item is None:
                            continue
                        if item == "[DONE]":
                            break
                        try:
                            chunk = parse_stream_chunk(item)
                        except StreamError as exc:
                            code = exc.code
                            kind = (_Retryable if code is not None and is_retryable_status(code)
                                    else _Fatal)
                            raise kind(f"error in stream: {exc}"
                                       + (f" (code {code})" if code else "")) from exc
                        if chunk.prompt_ids is not None:
                            prompt_tokens = len(chunk.prompt_ids)
                        if chunk.prompt_tokens is not None and chunk.is_usage:
                            prompt_tokens = chunk.prompt_tokens
                        if chunk.is_usage:
                            completion_tokens = chunk.completion_tokens
                        version = chunk.weight_version or version
                        if chunk.new_ids is None and chunk.text:
                            raise _Fatal("the server sent text without token ids (vLLM older than "
                                         "0.10.2? use VLLMConfig(ids_via='logprobs'))")
                        if chunk.new_ids:
                            if timings.first_token is None:
                                timings.first_token = time.monotonic()
                            got += len(chunk.new_ids)
                            output += chunk.new_ids
                            if on_progress is not None:
                                on_progress(Progress(rid, tuple(chunk.new_ids), len(output)))
                        if chunk.finish is not None:
                            finish = chunk.finish
                except asyncio.CancelledError:
                    resp.close()  # drop the connection: vLLM aborts a request whose client left
                    raise
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError,
                asyncio.TimeoutError) as exc:
            if finish is None:
                raise _Retryable(f"{type(exc).__name__}: {exc}") from exc
            log.info("stream of %s broke after its finish chunk: %s", rid, exc)
        if finish is None:
            raise _Retryable("stream ended before its finish_reason")
        if completion_tokens is not None and completion_tokens != got:
            raise _Fatal(f"usage.completion_tokens={completion_tokens} but {got} token ids "
                         "streamed")
        return _Outcome(finish, prompt_tokens, version)

    # ---- control ---------------------------------------------------------------------------
    async def abort_all(self) -> None:
        """Abort everything in flight: close every stream, then wait until the server is idle.

        Each aborted ``generate`` returns ``ABORT`` with the ids it had received. New ``generate``
        calls wait until this returns.
        """
        async with self._abort_lock:
            self._not_aborting.clear()
            try:
                deadline = time.monotonic() + self.cfg.abort_timeout_s
                while self._inflight and time.monotonic() < deadline:
                    for entry in list(self._inflight.values()):
                        entry.abort_requested = True
                        if entry.task is not None:
                            entry.task.cancel()
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self._drained.wait(), timeout=0.5)
                if self._inflight:
                    log.warning("abort_all: %d requests still in flight after %.0fs",
                                len(self._inflight), self.cfg.abort_timeout_s)
                if self.cfg.wait_idle_after_abort:
                    await self._wait_idle(deadline)
            finally:
                self._not_aborting.set()

    async def metrics(self) -> MetricsLoad | None:
        """Load from ``/metrics``; None when unreachable or without vLLM's gauges."""
        try:
            async with self.session.get(f"{self.url}/metrics",
                                        timeout=self._control_timeout()) as r:
                text = await r.text()
                return parse_metrics(text) if r.status == 200 else None
        except (aiohttp.ClientError, asyncio.TimeoutError, UnicodeDecodeError):
            return None

    async def counters(self) -> dict[str, float] | None:
        """vLLM's engine-side counters from ``/metrics``
        (:func:`real.clients.vllm_wire.parse_counters`); None when unreachable or without them."""
        try:
            async with self.session.get(f"{self.url}/metrics",
                                        timeout=self._control_timeout()) as r:
                text = await r.text()
                got = parse_counters(text) if r.status == 200 else {}
                return got or None
        except (aiohttp.ClientError, asyncio.TimeoutError, UnicodeDecodeError):
            return None

    async def snapshot(self) -> tuple[dict[str, float] | None, MetricsLoad | None]:
        """The counters and the load of one ``/metrics`` read (one request where a sampler
        wants both); (None, None) when unreachable."""
        try:
            async with self.session.get(f"{self.url}/metrics",
                                        timeout=self._control_timeout()) as r:
                text = await r.text()
                if r.status != 200:
                    return None, None
                return parse_counters(text) or None, parse_metrics(text)
        except (aiohttp.ClientError, asyncio.TimeoutError, UnicodeDecodeError):
            return None, None

    async def loads(self, worker: str | None = None) -> dict | None:
        """The SGLang client's ``loads`` keys from ``/metrics`` (``worker`` is ignored)."""
        m = await self.metrics()
        return None if m is None else m.as_loads()

    async def _wait_idle(self, deadline: float) -> None:
        """Poll ``/metrics`` until nothing runs or waits (vLLM notices a disconnect within a
        step): soon after the abort, then every ``poll_interval_s`` (each wait twice the last,
        from 5 ms: an APRIL step ends only when its abort has landed)."""
        wait = min(FIRST_POLL_S, self.cfg.poll_interval_s)
        while time.monotonic() < deadline:
            m = await self.metrics()
            if m is None or m.running + m.waiting == 0:
                return
            await asyncio.sleep(wait)
            wait = min(2 * wait, self.cfg.poll_interval_s)

    async def health(self) -> bool:
        """True when ``/health`` answers 200 (503 once the engine died)."""
        status, _ = await self._request("GET", "/health")
        return status == 200

    async def server_info(self) -> ServerInfo:
        """Context length from ``/v1/models``, KV capacity from ``/metrics``, version from
        ``/version``; ``max_num_seqs`` only from dev mode's ``/server_info`` (else None), whose
        whole scheduler config (``max_num_batched_tokens``, ...) is kept in ``raw``."""
        cards = await self.models()
        m = await self.metrics()
        _, ver = await self._request("GET", "/version")
        max_seqs, sched = None, {}
        status, dev = await self._request("GET", "/server_info?config_format=json")
        if status == 200 and isinstance(dev, dict) and isinstance(dev.get("vllm_config"), dict):
            sched = dev["vllm_config"].get("scheduler_config") or {}
            sched = sched if isinstance(sched, dict) else {}
            v = sched.get("max_num_seqs")
            max_seqs = v if isinstance(v, int) else None
        lens = [c["max_model_len"] for c in cards if isinstance(c.get("max_model_len"), int)]
        return ServerInfo(
            max_running_requests=max_seqs,
            kv_capacity_tokens=None if m is None else m.kv_capacity_tokens,
            max_context_length=min(lens) if lens else None,
            incremental_streaming_output=True,  # completions stream deltas
            version=str(ver["version"]) if isinstance(ver, dict) and "version" in ver else None,
            workers=(self.url,),
            raw={"models": cards, "metrics": m, "scheduler_config": sched},
        )

    # ---- weights (vLLM's dev-mode RL endpoints) ---------------------------------------------
    async def weight_version(self) -> str | None:
        """``GET /weight_info``; None without dev mode (or before any version was set)."""
        status, body = await self._request("GET", "/weight_info")
        if status == 200 and isinstance(body, dict) and body.get("weight_version") is not None:
            return str(body["weight_version"])
        return None

    async def update_weights(self, version: str, path: str | None = None) -> None:
        """Serve ``version``: reload weights from ``path`` first (``/collective_rpc`` with
        ``reload_weights``), then relabel (``/update_weight_version``).

        Without dev mode a relabel alone is skipped with a warning (the runner keeps its own
        version count; :meth:`weight_version` stays None), but loading ``path`` raises
        :class:`NotSupported`. An unreachable server is left to the health check, as with SGLang;
        a refusal raises RuntimeError.
        """
        if path is not None:
            status, body = await self._request("POST", "/collective_rpc", {
                "method": "reload_weights", "kwargs": {"weights_path": str(path)}},
                timeout_s=self.cfg.weights_timeout_s)
            if self._weight_call_failed("/collective_rpc reload_weights", status, body):
                return
        status, body = await self._request("POST", "/update_weight_version",
                                           {"new_version": str(version)})
        try:
            self._weight_call_failed("/update_weight_version", status, body)
        except NotSupported:
            if path is not None:
                raise
            if not self._warned_no_dev:
                self._warned_no_dev = True
                log.warning("%s has no /update_weight_version (no VLLM_SERVER_DEV_MODE=1): "
                            "weight version labels are not set", self.url)

    @staticmethod
    def _weight_call_failed(what: str, status: int, body: object) -> bool:
        """True when the server is unreachable; raises when it lacks the endpoint or refuses."""
        if status == 0:
            return True
        if status in (404, 405):
            raise NotSupported(f"{what}: not offered by this server "
                               "(start vLLM with VLLM_SERVER_DEV_MODE=1)")
        if status != 200:
            raise RuntimeError(f"{what} failed with status {status}: {body!r}"[:500])
        return False

    async def pause(self) -> bool:
        """``POST /pause?mode=keep`` (requests stay queued); False if the server lacks it."""
        status, _ = await self._request("POST", "/pause?mode=keep")
        return status == 200

    async def resume(self) -> bool:
        """``POST /resume``; False if the server lacks it."""
        status, _ = await self._request("POST", "/resume")
        return status == 200

    @property
    def in_flight(self) -> int:
        return len(self._inflight)


def _remainder(request: GenerateRequest, output: list[int]) -> GenerateRequest | None:
    """The resume request for what is left after ``output`` (None if nothing is)."""
    if not output:
        return request
    partial = GenerateResult(rid="", request=request, output_ids=output,
                             finish_reason=FinishReason.ABORT, timings=Timings())
    return resume_request(partial)
