"""The SGLang adapter: :class:`real.protocol.Engine` over SGLang's native HTTP API.

Works against one SGLang server, a list of servers, or sglang-router in front of servers:

- generation: ``POST /generate`` with ``stream: true`` to the router/server (or round-robin over
  an explicit worker list), streamed and checked by
  :class:`real.clients.sglang_wire.StreamAccumulator`;
- abort: the router does not proxy ``/abort_request``, so :meth:`SGLangClient.abort_all` posts
  ``{"rid": "", "abort_all": true}`` to every *worker* (from the router's ``GET /workers`` or the
  given list), then polls each worker's ``/v1/loads`` until it is idle and every local request
  has returned its partial result;
- faults: connection errors, timeouts, 5xx/429 and streams cut before their final chunk are
  retried with exponential backoff, a bounded number of times; a retry after partial output
  re-submits prompt + partial ids for the remainder (resume). When the attempts run out (a worker
  that died and stays dead) the request comes back failed-with-partial: ``finish_reason=ABORT``,
  ``error`` set, the ids received so far in ``output_ids``. Other 4xx are not retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Sequence
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
from .http import RetryPolicy
from .sglang_wire import (
    ABORT_ALL_PAYLOAD,
    ParsedFinish,
    RidFactory,
    StreamAccumulator,
    StreamError,
    generate_payload,
    is_retryable_status,
    parse_chunk,
    parse_error_body,
    parse_sse_line,
)

log = logging.getLogger(__name__)
FIRST_POLL_S = 0.005  # the first wait while an abort lands (then doubling to poll_interval_s)


@dataclass(frozen=True)
class ClientConfig:
    """Timeouts (seconds) and policies of :class:`SGLangClient`.

    ``read_timeout_s`` bounds the silence between two stream chunks; a request waiting in a busy
    engine's queue sends nothing, so keep it well above the longest expected queueing time.
    ``incremental`` overrides what ``/server_info`` says about the streaming mode.
    """

    connect_timeout_s: float = 5.0
    read_timeout_s: float = 600.0
    control_timeout_s: float = 10.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    abort_timeout_s: float = 60.0
    poll_interval_s: float = 0.05
    incremental: bool | None = None


class _Retryable(Exception):
    """A failure worth another attempt (connection, timeout, 5xx, cut stream)."""


class _Fatal(Exception):
    """A failure that another attempt will not fix (4xx, malformed response)."""


@dataclass(eq=False)
class _InFlight:
    rid: str
    abort_requested: bool = False


@dataclass
class _Outcome:
    new_ids: list[int]
    finish: ParsedFinish
    prompt_tokens: int | None
    weight_version: str | None


class SGLangClient:
    """An :class:`~real.protocol.Engine` backed by SGLang (or anything speaking its native API).

    ``url``: where ``/generate`` goes (a router or one server). ``worker_urls``: the servers
    behind it; when omitted they are discovered through the router's ``GET /workers`` (or ``url``
    itself when it is a plain server). With ``url=None``, generation is spread over
    ``worker_urls`` directly (fewest requests in flight first).
    """

    family = "sglang"  # unless its server says it is the bundled engine (engine_family)

    def __init__(
        self,
        url: str | None = None,
        worker_urls: Sequence[str] = (),
        config: ClientConfig | None = None,
    ) -> None:
        if url is None and not worker_urls:
            raise ValueError("give a router/server url or a list of worker urls")
        self.url = url.rstrip("/") if url else None
        self._static_workers = tuple(w.rstrip("/") for w in worker_urls)
        self.cfg = config or ClientConfig()
        self.new_rid = RidFactory()
        self._session: aiohttp.ClientSession | None = None
        self._inflight: dict[str, _InFlight] = {}
        self._per_worker: dict[str, int] = {}
        self._incremental: dict[str, bool] = {}
        self._not_aborting = asyncio.Event()
        self._not_aborting.set()
        self._abort_lock = asyncio.Lock()
        self._drained = asyncio.Event()
        self._drained.set()

    # ---- plumbing --------------------------------------------------------------------------
    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, force_close=False),
                timeout=aiohttp.ClientTimeout(total=None, connect=self.cfg.connect_timeout_s),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> SGLangClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def _control_timeout(self) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(total=self.cfg.control_timeout_s,
                                     connect=self.cfg.connect_timeout_s)

    async def _get_json(self, url: str) -> tuple[int, object]:
        async with self.session.get(url, timeout=self._control_timeout()) as resp:
            body = await resp.read()
            try:
                return resp.status, json.loads(body) if body else None
            except ValueError:
                return resp.status, body.decode("utf-8", "replace")

    # ---- discovery -------------------------------------------------------------------------
    async def workers(self) -> list[str]:
        """The engine servers: the explicit list, the router's ``/workers``, or ``url`` itself."""
        if self._static_workers:
            return list(self._static_workers)
        assert self.url is not None
        try:
            status, body = await self._get_json(f"{self.url}/workers")
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return [self.url]
        if status == 200 and isinstance(body, dict) and isinstance(body.get("workers"), list):
            urls = []
            for w in body["workers"]:
                u = w.get("url") if isinstance(w, dict) else w
                if isinstance(u, str):
                    urls.append(u.rstrip("/"))
            return urls
        return [self.url]

    async def _incremental_for(self, target: str) -> bool | None:
        """Whether ``target`` streams incrementally, from ``/server_info`` (cached).

        A router has no such field: then the first worker behind it is asked. None if unknown
        (the accumulator then infers the mode from ``completion_tokens``).
        """
        if self.cfg.incremental is not None:
            return self.cfg.incremental
        if target in self._incremental:
            return self._incremental[target]
        value: bool | None = None
        for candidate in (target, None):
            try:
                url = candidate or (await self.workers())[0]
                status, body = await self._get_json(f"{url}/server_info")
            except (aiohttp.ClientError, asyncio.TimeoutError, IndexError):
                continue
            if status == 200 and isinstance(body, dict) and "incremental_streaming_output" in body:
                value = bool(body["incremental_streaming_output"])
                break
        if value is not None:
            self._incremental[target] = value
        return value

    def _pick_target(self) -> str:
        if self.url is not None:
            return self.url
        return min(self._static_workers, key=lambda w: self._per_worker.get(w, 0))

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
        prompt_tokens = weight_version = worker = None
        last_error: str | None = None
        entry = _InFlight(rid="")
        first_rid = None

        def result(reason: FinishReason, error: str | None = None,
                   message: str | None = None) -> GenerateResult:
            timings.finished = time.monotonic()
            return GenerateResult(
                rid=first_rid or entry.rid, request=request, output_ids=output,
                finish_reason=reason, timings=timings, error=error,
                prompt_tokens=prompt_tokens, abort_message=message,
                weight_version=weight_version, worker=worker, attempts=attempts,
            )

        try:
            while True:
                if current is None or current.tokens_to_generate <= 0:
                    # Nothing left to generate (e.g. the cut came right after the last token).
                    base = (FinishReason.LENGTH if len(output) >= request.tokens_to_generate
                            else FinishReason.ABORT)
                    return result(replay_finish_reason(request, len(output), base))
                if entry.abort_requested:
                    return result(FinishReason.ABORT, message="aborted by abort_all")
                attempts += 1
                rid = self.new_rid()
                first_rid = first_rid or rid
                self._register(entry, rid)
                target = self._pick_target()
                worker = target
                self._per_worker[target] = self._per_worker.get(target, 0) + 1
                try:
                    out = await self._stream_once(target, current, rid, output, on_progress,
                                                  timings)
                except _Fatal as exc:
                    return result(FinishReason.ABORT, error=str(exc))
                except _Retryable as exc:
                    last_error = str(exc)
                    log.info("attempt %d of %s failed: %s", attempts, rid, exc)
                    if entry.abort_requested:
                        return result(FinishReason.ABORT, message="aborted by abort_all")
                    if attempts >= self.cfg.retry.max_attempts:
                        return result(FinishReason.ABORT,
                                      error=f"gave up after {attempts} attempts: {last_error}")
                    await asyncio.sleep(self.cfg.retry.backoff(attempts))
                    current = self._remainder(request, output)
                    continue
                finally:
                    self._per_worker[target] -= 1
                if out.prompt_tokens is not None and prompt_tokens is None:
                    prompt_tokens = out.prompt_tokens - (len(current.prompt_ids)
                                                         - len(request.prompt_ids))
                weight_version = out.weight_version or weight_version
                reason = out.finish.reason
                if reason is FinishReason.ABORT:
                    code = out.finish.status_code
                    if code is not None and code >= 400:
                        err = f"engine aborted the request with status {code}: {out.finish.message}"
                        if is_retryable_status(code) and attempts < self.cfg.retry.max_attempts \
                                and not entry.abort_requested:
                            await asyncio.sleep(self.cfg.retry.backoff(attempts))
                            current = self._remainder(request, output)
                            continue
                        return result(FinishReason.ABORT, error=err, message=out.finish.message)
                    return result(FinishReason.ABORT, message=out.finish.message)
                return result(replay_finish_reason(request, len(output), reason))
        finally:
            self._unregister(entry)

    @staticmethod
    def _remainder(request: GenerateRequest, output: list[int]) -> GenerateRequest | None:
        """The resume request for what is left after ``output`` (None if nothing is)."""
        if not output:
            return request
        partial = GenerateResult(rid="", request=request, output_ids=output,
                                 finish_reason=FinishReason.ABORT, timings=Timings())
        return resume_request(partial)

    def _register(self, entry: _InFlight, rid: str) -> None:
        self._inflight.pop(entry.rid, None)
        entry.rid = rid
        self._inflight[rid] = entry
        self._drained.clear()

    def _unregister(self, entry: _InFlight) -> None:
        self._inflight.pop(entry.rid, None)
        if not self._inflight:
            self._drained.set()

    async def _stream_once(
        self, target: str, req: GenerateRequest, rid: str, output: list[int],
        on_progress: ProgressCallback | None, timings: Timings,
    ) -> _Outcome:
        """One HTTP attempt. Appends new ids to ``output`` as they stream in."""
        incremental = await self._incremental_for(target)
        acc = StreamAccumulator(incremental)
        payload = generate_payload(req, rid, stream=True)
        timeout = aiohttp.ClientTimeout(total=None, connect=self.cfg.connect_timeout_s,
                                        sock_read=self.cfg.read_timeout_s)
        new_this_attempt: list[int] = []
        try:
            async with self.session.post(f"{target}/generate", json=payload,
                                         timeout=timeout) as resp:
                timings.mark_accepted()
                if resp.status != 200:
                    msg = parse_error_body(resp.status, await resp.read())
                    raise (_Retryable if is_retryable_status(resp.status) else _Fatal)(msg)
                final = None
                async for raw_line in resp.content:
                    try:
                        item = parse_sse_line(raw_line)
                    except ValueError as exc:
                        raise _Fatal(f"malformed stream line {raw_line[:200]!r}: {exc}") from exc
                    if item is None:
                        continue
                    if item == "[DONE]":
                        break
                    try:
                        chunk = parse_chunk(item)
                    except StreamError as exc:
                        code = exc.code
                        kind = (_Retryable if code is not None and is_retryable_status(code)
                                else _Fatal)
                        raise kind(f"error in stream: {exc}"
                                   + (f" (code {code})" if code else "")) from exc
                    new = acc.feed(chunk)
                    if new:
                        if timings.first_token is None:
                            timings.first_token = time.monotonic()
                        new_this_attempt += new
                        output += new
                        if on_progress is not None:
                            on_progress(Progress(rid, tuple(new), len(output)))
                    if chunk.finish is not None:
                        final = chunk
                        break
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError,
                asyncio.TimeoutError) as exc:
            raise _Retryable(f"{type(exc).__name__}: {exc}") from exc
        if final is None:
            raise _Retryable("stream ended before its final chunk")
        # The final chunk is the authority: reconcile if it disagrees with what streamed.
        if len(acc.ids) != len(new_this_attempt) or acc.ids != new_this_attempt:
            del output[len(output) - len(new_this_attempt):]
            output += acc.ids
        return _Outcome(acc.ids, final.finish, final.prompt_tokens,  # type: ignore[arg-type]
                        final.weight_version)

    # ---- control ---------------------------------------------------------------------------
    async def abort_all(self) -> None:
        """Abort everything in flight on every worker; return when all is idle and returned.

        New ``generate`` calls wait until this returns. Requests that reach a worker after the
        abort was posted (they were still on the wire) are caught by re-posting the abort while
        any local request is still in flight.
        """
        async with self._abort_lock:
            self._not_aborting.clear()
            try:
                deadline = time.monotonic() + self.cfg.abort_timeout_s
                workers = await self.workers()
                while True:
                    for entry in self._inflight.values():
                        entry.abort_requested = True
                    await asyncio.gather(*(self._post_abort(w) for w in workers))
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self._drained.wait(), timeout=0.5)
                    await self._wait_idle(workers, deadline)
                    if not self._inflight or time.monotonic() > deadline:
                        break
                if self._inflight:
                    log.warning("abort_all: %d requests still in flight after %.0fs",
                                len(self._inflight), self.cfg.abort_timeout_s)
            finally:
                self._not_aborting.set()

    async def _post_abort(self, worker: str) -> bool:
        try:
            async with self.session.post(f"{worker}/abort_request", json=ABORT_ALL_PAYLOAD,
                                         timeout=self._control_timeout()) as resp:
                await resp.read()
                return resp.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return False  # a dead worker has nothing left to abort

    async def counters(self) -> dict[str, float] | None:
        """SGLang's engine-side counters from ``/metrics`` (``--enable-metrics``):
        :func:`parse_sglang_counters` of the one worker behind this client; None for several
        workers (a router: its counts are not one engine's), without metrics, or unreachable."""
        workers = await self.workers()
        if len(workers) != 1:
            return None
        try:
            async with self.session.get(f"{workers[0]}/metrics",
                                        timeout=self._control_timeout()) as r:
                text = await r.text()
        except (aiohttp.ClientError, asyncio.TimeoutError, UnicodeDecodeError):
            return None
        got = parse_sglang_counters(text) if r.status == 200 else {}
        return got or None

    async def loads(self, worker: str) -> dict | None:
        """A worker's ``/v1/loads`` summed over DP ranks, or None if it does not answer."""
        try:
            status, body = await self._get_json(f"{worker}/v1/loads")
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return None
        if status != 200 or not isinstance(body, dict):
            return None
        total = {"num_running_reqs": 0, "num_waiting_reqs": 0, "num_used_tokens": 0}
        for load in body.get("loads") or []:
            for k in total:
                total[k] += int(load.get(k) or 0)
        return total

    async def _wait_idle(self, workers: Sequence[str], deadline: float) -> None:
        """Poll /v1/loads until every reachable worker runs and queues nothing: soon, then every
        ``poll_interval_s`` (each wait twice the last, from 5 ms)."""
        pending = list(workers)
        wait = min(FIRST_POLL_S, self.cfg.poll_interval_s)
        while pending and time.monotonic() < deadline:
            loads = await asyncio.gather(*(self.loads(w) for w in pending))
            pending = [w for w, ld in zip(pending, loads, strict=True)
                       if ld is not None and ld["num_running_reqs"] + ld["num_waiting_reqs"] > 0]
            if pending:
                await asyncio.sleep(wait)
                wait = min(2 * wait, self.cfg.poll_interval_s)

    async def health(self) -> bool:
        """True when ``/health`` answers 200 (on the router/server, or on every listed worker)."""
        targets = [self.url] if self.url else list(self._static_workers)

        async def ok(u: str) -> bool:
            try:
                async with self.session.get(f"{u}/health", timeout=self._control_timeout()) as r:
                    await r.read()
                    return r.status == 200
            except (aiohttp.ClientError, asyncio.TimeoutError):
                return False

        return all(await asyncio.gather(*(ok(u) for u in targets)))

    async def server_info(self) -> ServerInfo:
        """Summed over workers: max running requests and KV capacity (None where unknown)."""
        workers = await self.workers()
        infos = []
        for w in workers:
            try:
                status, body = await self._get_json(f"{w}/server_info")
            except (aiohttp.ClientError, asyncio.TimeoutError):
                continue
            if status == 200 and isinstance(body, dict):
                infos.append(body)
        return summarize_server_info(infos, workers)

    async def weight_version(self) -> str | None:
        for w in await self.workers():
            try:
                status, body = await self._get_json(f"{w}/model_info")
            except (aiohttp.ClientError, asyncio.TimeoutError):
                continue
            if status == 200 and isinstance(body, dict):
                v = body.get("weight_version")
                return None if v is None else str(v)
        return None

    # ---- weight sync (real.protocol.WeightSync) ---------------------------------------------
    async def _post_all(self, path: str, body: dict) -> list[int]:
        """POST ``body`` to ``path`` on every worker; the status codes (0: unreachable)."""

        async def one(w: str) -> int:
            try:
                async with self.session.post(f"{w}{path}", json=body,
                                             timeout=self._control_timeout()) as resp:
                    await resp.read()
                    return resp.status
            except (aiohttp.ClientError, asyncio.TimeoutError):
                return 0

        return list(await asyncio.gather(*(one(w) for w in await self.workers())))

    async def update_weights(self, version: str, path: str | None = None) -> None:
        """Every worker serves ``version``: load ``path`` (``/update_weights_from_disk``) or only
        relabel (``/update_weight_version``). Raises RuntimeError if a reachable worker refuses."""
        if path is not None:
            codes = await self._post_all("/update_weights_from_disk",
                                         {"model_path": path, "weight_version": str(version)})
        else:
            codes = await self._post_all("/update_weight_version", {"new_version": str(version)})
        bad = [c for c in codes if c not in (0, 200)]
        if bad:
            raise RuntimeError(f"weight update to version {version} refused with status {bad[0]}")

    async def pause(self) -> bool:
        """``/pause_generation`` (in place) on every worker; False if a worker lacks it."""
        codes = await self._post_all("/pause_generation", {"mode": "in_place"})
        return all(c in (0, 200) for c in codes)

    async def resume(self) -> bool:
        """``/continue_generation`` on every worker; False if a worker lacks it."""
        codes = await self._post_all("/continue_generation", {})
        return all(c in (0, 200) for c in codes)

    @property
    def in_flight(self) -> int:
        return len(self._inflight)


def _first_int(d: dict, key: str) -> int | None:
    """``key`` at top level, else in internal_states[0], else in deployment_info."""
    for src in (d, *(d.get("internal_states") or [])[:1], d.get("deployment_info") or {}):
        if isinstance(src, dict) and isinstance(src.get(key), int) \
                and not isinstance(src.get(key), bool):
            return src[key]
    return None


def summarize_server_info(infos: Sequence[dict], workers: Sequence[str]) -> ServerInfo:
    """Combine per-worker ``/server_info`` bodies (capacities add up across workers)."""
    def total(key: str) -> int | None:
        vals = [_first_int(i, key) for i in infos]
        return None if not vals or any(v is None for v in vals) else sum(vals)  # type: ignore[misc]

    ctx = [_first_int(i, "max_context_length") for i in infos]
    return ServerInfo(
        max_running_requests=total("max_running_requests"),
        kv_capacity_tokens=total("max_total_num_tokens"),
        max_context_length=min((c for c in ctx if c is not None), default=None),
        incremental_streaming_output=any(bool(i.get("incremental_streaming_output"))
                                         for i in infos),
        version=str(infos[0].get("version")) if infos else None,
        workers=tuple(workers),
        raw={"workers": list(infos)},
    )


def parse_sglang_counters(text: str) -> dict[str, float]:
    """SGLang 0.5.23's engine-side counters in a ``/metrics`` body, summed over labels:
    ``iterations`` (``sglang:cuda_graph_passes_total``: every forward pass, by CUDA-graph mode)
    and ``busy_s`` (``sglang:forward_execution_seconds_total``: the GPU executing forward
    passes), ``prompt_tokens`` and ``cached_tokens`` (``sglang:prompt_tokens_total``,
    ``sglang:cached_tokens_total``: prompt tokens of finished requests and those its radix cache
    served, its ``#cached-token``); names it lacks are left out (the bundled server exposes
    none)."""
    from .vllm_wire import iter_samples

    names = {"sglang:cuda_graph_passes_total": "iterations",
             "sglang:forward_execution_seconds_total": "busy_s",
             "sglang:prompt_tokens_total": "prompt_tokens",
             "sglang:cached_tokens_total": "cached_tokens"}
    out: dict[str, float] = {}
    for name, _labels, value in iter_samples(text):
        key = names.get(name)
        if key is not None:
            out[key] = out.get(key, 0.0) + value
    return out
