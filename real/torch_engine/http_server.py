"""An aiohttp server for the bundled engine that speaks SGLang's HTTP API (the subset in
docs/real.md).

The point is that SGLang clients (:class:`real.clients.sglang.SGLangClient`, the real
sglang-router, ``sglang.bench_serving``, RL frameworks' rollout code, OpenAI clients) can run
end to end in CI against a live engine, without a GPU. Shapes follow SGLang 0.5.23
(``sglang/srt/entrypoints/http_server.py``, ``managers/io_struct.py``):

- ``POST /generate``: see :mod:`.generate_api`. Streaming sends ``data: {json}\\n\\n`` per step
  and ``data: [DONE]``; ``output_ids``/``text``/log-probs are cumulative, or per-chunk deltas
  when started with ``incremental_streaming_output``. Invalid or unsupported fields get a 400
  naming them. A client that disconnects (streaming or not) has its request aborted.
- ``POST /abort_request``: ``{"rid": prefix, "abort_all": bool}``.
- RL control: ``/pause_generation`` (modes abort / retract / in_place), ``/continue_generation``,
  ``/update_weights_from_disk`` (a checkpoint directory of the bundled model),
  ``/update_weight_version``, ``/get_weight_version``, ``/release_memory_occupation``,
  ``/resume_memory_occupation``, ``/flush_cache``.
- Info: ``/health``, ``/health_generate``, ``/server_info`` (+ ``/get_server_info``),
  ``/model_info`` (+ ``/get_model_info``), ``/v1/loads``, ``/v1/models``, ``/iteration_log``.
- OpenAI: ``/v1/completions``, ``/v1/chat/completions`` (:mod:`.openai_api`).

No handler can take the server down: a middleware turns any unexpected exception into a 500 with
a message (and logs its traceback); what a client can send is answered with a 4xx instead
(:func:`read_json`: bodies nested past :data:`MAX_JSON_DEPTH`, lone surrogates, a
``Content-Encoding`` other than gzip/deflate/identity gets 415, a body slower than
``read_timeout_s`` gets 408). :meth:`EngineHTTPServer.reap_idle` closes connections that hold no
request for ``read_timeout_s`` (a half-open socket, a request head that never completes), and
every JSON the server writes is strict (no bare ``NaN``: non-finite numbers become ``null``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import traceback
from dataclasses import asdict, dataclass

from aiohttp import web

from .engine import Finished
from .generate_api import GenerateOptions, ResponseBuilder, parse_generate
from .http_body import (
    MAX_BODY_BYTES,
    READ_TIMEOUT_KEY,
    BodyError,
    dumps,
    json_response,
    read_json,
    strict_bool,
)
from .runner import EngineRunner, RequestHandle, TokenEvent
from .sampling import ParamError
from .tokenizer import TextCodec

log = logging.getLogger(__name__)
SERVER_VERSION = "aprilsim-torch-0.2"


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 30000
    incremental_streaming_output: bool = False
    model_path: str = "aprilsim/tiny-random"
    tokenizer_path: str | None = None  # a directory with tokenizer.json; None = no tokenizer
    # SGLang's --enable-memory-saver: /release_memory_occupation works only with it (as there)
    enable_memory_saver: bool = False
    # seconds a connection may hold no request (head not complete) or take to send a body
    read_timeout_s: float = 60.0


KEEPALIVE_S = 75.0  # an idle kept-alive connection is closed after this (aiohttp's run_app's)


def error_response(status: int, message: str, param: str | None = None) -> web.Response:
    """SGLang's legacy ErrorResponse shape (``object/message/type/param/code``)."""
    body = {"object": "error", "message": message, "type": _phrase(status), "param": param,
            "code": status}
    return json_response(body, status=status)


def _phrase(status: int) -> str:
    from http import HTTPStatus

    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return str(status)


@web.middleware
async def _never_crash(request: web.Request, handler) -> web.StreamResponse:
    """Any unexpected exception becomes a 500 with a message, logged with its traceback."""
    try:
        return await handler(request)
    except BodyError as exc:  # the body may be half read: the connection cannot be reused
        if exc.gone:
            log.debug("%s %s: %s", request.method, request.path, exc)
        resp = error_response(exc.status, str(exc), "body")
        resp.force_close()
        return resp
    except web.HTTPException as exc:
        if exc.status >= 400 and exc.content_type != "application/json":
            return error_response(exc.status, exc.reason or exc.text or _phrase(exc.status))
        raise
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as exc:
        log.error("unhandled error in %s %s:\n%s", request.method, request.path,
                  traceback.format_exc())
        return error_response(500, f"Internal server error: {type(exc).__name__}: {exc}")


class EngineHTTPServer:
    """Routes SGLang endpoints onto an :class:`EngineRunner`."""

    def __init__(self, runner: EngineRunner, cfg: ServerConfig) -> None:
        self.runner = runner
        self.cfg = cfg
        self.codec = TextCodec(cfg.tokenizer_path) if cfg.tokenizer_path else None
        if self.codec is not None:
            if self.codec.vocab_size != runner.engine.vocab_size:
                raise ValueError(f"tokenizer has {self.codec.vocab_size} tokens, model "
                                 f"{runner.engine.vocab_size}")
            runner.engine.decode_text = self.codec.decode
            # Sample only tokens whose text re-encodes to themselves (bench_serving's
            # retokenized count then equals the generated count); none found: no restriction.
            allowed = self.codec.roundtrip_ids
            if allowed:
                runner.engine.restrict_output(allowed)
            else:
                log.warning("tokenizer %s has no round-trip token set: the model samples the "
                            "whole vocabulary", cfg.tokenizer_path)
        self.started = time.time()
        self.total_requests = 0
        self._updating = asyncio.Event()  # set while a weight update waits for the engine
        self.app = web.Application(client_max_size=MAX_BODY_BYTES,
                                   middlewares=[self._track, _never_crash])
        self.app[READ_TIMEOUT_KEY] = cfg.read_timeout_s
        self._ignored_seen: set[tuple[str, str]] = set()
        self._busy: dict[object, int] = {}  # connection -> requests it is serving now
        self._served: set[object] = set()  # connections that completed a request
        self._idle_since: dict[object, float] = {}  # connection -> when it last had none
        self.app.on_startup.append(self._on_startup)
        self.app.on_cleanup.append(self._on_cleanup)
        r = self.app.router
        r.add_route("POST", "/generate", self.generate)
        r.add_route("PUT", "/generate", self.generate)
        r.add_post("/abort_request", self.abort_request)
        for path in ("/health", "/health_generate"):
            r.add_get(path, self.health)
        for path in ("/server_info", "/get_server_info"):
            r.add_get(path, self.server_info)
        for path in ("/model_info", "/get_model_info"):
            r.add_get(path, self.model_info)
        r.add_get("/v1/loads", self.loads)
        r.add_get("/iteration_log", self.iteration_log)
        r.add_post("/update_weight_version", self.update_weight_version)
        r.add_get("/get_weight_version", self.get_weight_version)
        r.add_post("/update_weights_from_disk", self.update_weights_from_disk)
        r.add_post("/pause_generation", self.pause_generation)
        r.add_post("/continue_generation", self.continue_generation)
        for path in ("/release_memory_occupation", "/resume_memory_occupation"):
            r.add_route("GET", path, self.memory_occupation)
            r.add_route("POST", path, self.memory_occupation)
        r.add_route("*", "/flush_cache", self.flush_cache)
        from .openai_api import OpenAIRoutes

        OpenAIRoutes(self).register(r)

    @web.middleware
    async def _track(self, request: web.Request, handler) -> web.StreamResponse:
        """Mark the connection busy while it is served (:meth:`reap_idle` spares it)."""
        conn = request.protocol
        self._busy[conn] = self._busy.get(conn, 0) + 1
        try:
            return await handler(request)
        finally:
            n = self._busy.pop(conn, 1) - 1
            if n > 0:
                self._busy[conn] = n
            self._idle_since[conn] = time.monotonic()
            self._served.add(conn)

    def reap_idle(self, server: web.Server, now: float | None = None) -> int:
        """Close connections that hold no request: one that never completed a request head
        within ``read_timeout_s`` of opening (a half-open socket, a stalled head; aiohttp itself
        has no header timeout), or a kept-alive one idle for :data:`KEEPALIVE_S` (at least
        ``read_timeout_s``; clients' pools close theirs sooner: aiohttp's after 15 s). Returns
        how many were closed."""
        now = time.monotonic() if now is None else now
        live = set(server.connections)
        for gone in [c for c in self._idle_since if c not in live]:
            del self._idle_since[gone]
        self._served &= live
        closed = 0
        keepalive = max(KEEPALIVE_S, self.cfg.read_timeout_s)
        for conn in live:
            if conn in self._busy:
                continue
            since = self._idle_since.setdefault(conn, now)
            limit = keepalive if conn in self._served else self.cfg.read_timeout_s
            if now - since > limit:
                conn.force_close()
                if conn.transport is not None:
                    conn.transport.close()
                del self._idle_since[conn]
                closed += 1
        return closed

    async def watch_connections(self, server: web.Server, every_s: float | None = None) -> None:
        """Run :meth:`reap_idle` forever (started by ``real.serve``); ``read_timeout_s`` <= 0
        turns it off."""
        if self.cfg.read_timeout_s <= 0:
            return
        every = every_s or max(0.05, min(1.0, self.cfg.read_timeout_s / 4))
        while True:
            await asyncio.sleep(every)
            n = self.reap_idle(server)
            if n:
                log.info("closed %d idle connection(s) (no request for %.0f s)", n,
                         self.cfg.read_timeout_s)

    async def _on_startup(self, app: web.Application) -> None:
        self.runner.start()

    async def _on_cleanup(self, app: web.Application) -> None:
        await self.runner.close()

    # ---- /generate -------------------------------------------------------------------------
    async def submit(self, body: object) -> tuple[RequestHandle, GenerateOptions]:
        """Parse and queue one /generate body (also used by the OpenAI routes)."""
        req, opts = parse_generate(body, self.runner.engine.vocab_size, self.codec)
        self.note_ignored(opts.ignored, "/generate")
        while self._updating.is_set():  # a weight update holds new requests back (SGLang's lock)
            await asyncio.sleep(0.005)
        handle = self.runner.submit(req)
        self.total_requests += 1
        return handle, opts

    def note_ignored(self, keys: tuple[str, ...] | list[str], where: str) -> None:
        """Log, once per name, the unknown fields a request carried (SGLang ignores them)."""
        for k in keys:
            if (where, k) not in self._ignored_seen and len(self._ignored_seen) < 1000:
                self._ignored_seen.add((where, k))
                log.warning("%s: ignoring unknown field %r (as SGLang does)", where, k[:80])

    async def generate(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await read_json(request)
            handle, opts = await self.submit(body)
        except ParamError as exc:
            return error_response(400, str(exc), exc.param)
        except ValueError as exc:
            return error_response(400, str(exc))
        except RuntimeError as exc:
            return error_response(503, str(exc))
        builder = ResponseBuilder(handle.request, opts, self.codec,
                                  self.cfg.incremental_streaming_output)
        if not opts.stream:
            return await self._generate_once(handle, builder)
        return await self._generate_stream(request, handle, builder)

    async def next_events(self, handle: RequestHandle, at_least: int = 1
                          ) -> tuple[list[int], Finished | None]:
        """Wait for ``at_least`` tokens (or the end), then drain what is queued."""
        new: list[int] = []
        while True:
            ev = await handle.events.get()
            while True:
                if isinstance(ev, Finished):
                    return new, ev
                assert isinstance(ev, TokenEvent)
                new.append(ev.token)
                try:
                    ev = handle.events.get_nowait()
                except asyncio.QueueEmpty:
                    break
            if len(new) >= at_least:
                return new, None

    async def abort_on_disconnect(self, handle: RequestHandle) -> None:
        """Abort a request whose client went away (as SGLang does), unless it already ended."""
        if handle.finished is None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self.runner.abort(handle.request.rid))

    async def wait_finished(self, handle: RequestHandle) -> Finished:
        """The end of a request; aborts it if the caller (the client's handler) is cancelled."""
        try:
            while True:
                _, fin = await self.next_events(handle)
                if fin is not None:
                    return fin
        except (asyncio.CancelledError, ConnectionResetError):
            await self.abort_on_disconnect(handle)  # SGLang aborts a disconnected request
            raise

    def _elapsed(self, handle: RequestHandle) -> float:
        return time.monotonic() - handle.submitted

    async def _generate_once(self, handle: RequestHandle,
                             builder: ResponseBuilder) -> web.Response:
        fin = await self.wait_finished(handle)
        code = fin.reason.get("status_code")
        if fin.reason.get("type") == "abort" and isinstance(code, int) and 400 <= code < 600:
            return error_response(code, str(fin.reason.get("message", "")))
        return json_response(builder.render(fin.output_ids, fin, self.runner.weight_version,
                                                self._elapsed(handle)))

    async def _generate_stream(self, request: web.Request, handle: RequestHandle,
                               builder: ResponseBuilder) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        spec = handle.request.spec
        interval = (spec.stream_interval if spec is not None else None) or 1
        out: list[int] = []
        try:
            await resp.prepare(request)
            while True:
                new, fin = await self.next_events(handle, interval)
                out += new
                ids = fin.output_ids if fin is not None else list(out)
                chunk = builder.render(ids, fin, self.runner.weight_version,
                                       None if fin is None else self._elapsed(handle))
                await resp.write(b"data: " + dumps(chunk).encode() + b"\n\n")
                if fin is not None:
                    break
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            await self.abort_on_disconnect(handle)  # the client went away: abort, then stop
            raise
        return resp

    # ---- control ---------------------------------------------------------------------------
    async def _body(self, request: web.Request) -> dict:
        body = await read_json(request, required=False)
        if not isinstance(body, dict):
            raise ParamError("body", "request body must be a JSON object")
        return body

    async def abort_request(self, request: web.Request) -> web.Response:
        try:
            body = await self._body(request)
        except ParamError as exc:
            return error_response(400, str(exc), exc.param)
        rid = body.get("rid") or ""
        if not isinstance(rid, str):
            return error_response(400, "rid: expected a string", "rid")
        try:
            abort_all = strict_bool(body, "abort_all")
        except ParamError as exc:
            return error_response(400, str(exc), exc.param)
        if not rid and not abort_all:
            return web.Response(status=200)  # SGLang: empty prefix without abort_all is a no-op
        await self.runner.abort(rid, abort_all)
        return web.Response(status=200)

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.runner.alive else 503)

    def _info(self) -> dict:
        e = self.runner.engine
        return {
            "model_path": self.cfg.model_path,
            "served_model_name": self.cfg.model_path,
            "tokenizer_path": self.cfg.tokenizer_path or "",
            "skip_tokenizer_init": self.codec is None,
            "context_length": e.max_context,
            "max_context_length": e.max_context,
            "max_total_num_tokens": e.kv_budget,
            "max_running_requests": e.cfg.max_running_requests,
            "max_prefill_tokens": e.cfg.max_prefill_tokens,
            "max_req_input_len": e.max_req_input_len,
            "chunked_prefill_size": -1,
            "page_size": 1,
            "schedule_policy": "fcfs",
            "schedule_conservativeness": 1.0,
            "disable_radix_cache": True,
            "enable_memory_saver": self.cfg.enable_memory_saver,
            "weight_version": self.runner.weight_version,
            "load_format": "aprilsim",
            "dtype": e.cfg.dtype,
            "tp_size": 1,
            "dp_size": 1,
            "version": SERVER_VERSION,
            "internal_states": [{
                "max_running_requests": e.cfg.max_running_requests,
                "total_requests": self.total_requests,
                "max_total_num_tokens": e.kv_budget,
                "last_gen_throughput": self.runner.gen_throughput(),
                "new_token_ratio": e.new_token_ratio,
                "num_running_reqs": self.runner.num_running,
                "num_waiting_reqs": self.runner.num_waiting,
                "num_in_flight": self.runner.num_in_flight,
                "kv_used_tokens": e.used_tokens,
                "free_slots": len(e.pool.free),
                "retracted_total": e.retracted_total,
                # ids the model may sample (round-trip words + EOS; the vocabulary if unmasked)
                "sampleable_tokens": e.sampleable_tokens,
                "step_errors": self.runner.step_errors,
                "paused": self.runner.paused,
                "memory_released": sorted(self.runner.released),
            }],
            "host": self.cfg.host,
            "port": self.cfg.port,
            "incremental_streaming_output": self.cfg.incremental_streaming_output,
            "disaggregation_mode": "null",
            "device": str(e.device),
            "model_config": asdict(e.model.cfg),
            "startup_time": self.started,
        }

    async def server_info(self, request: web.Request) -> web.Response:
        return json_response(self._info())

    async def model_info(self, request: web.Request) -> web.Response:
        return json_response({
            "model_path": self.cfg.model_path,
            "served_model_name": self.cfg.model_path,
            "tokenizer_path": self.cfg.tokenizer_path or "",
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": self.runner.weight_version,
            "load_format": None,
            "reasoning_parser": None,
            "tool_call_parser": None,
            "model_type": "aprilsim-tiny",
            "architectures": ["TinyDecoder"],
        })

    async def loads(self, request: web.Request) -> web.Response:
        e = self.runner.engine
        used = e.used_tokens
        load = {
            "timestamp": time.time(),
            "dp_rank": 0,
            "num_running_reqs": self.runner.num_running,
            "num_waiting_reqs": self.runner.num_waiting,
            "num_used_tokens": used,
            "num_total_tokens": used + sum(r.length for r in e.waiting),
            "max_total_num_tokens": e.kv_budget,
            "max_running_requests": e.cfg.max_running_requests,
            "token_usage": used / e.kv_budget if e.kv_budget else 0.0,
            "gen_throughput": self.runner.gen_throughput(),
            "utilization": self.runner.num_running / e.cfg.max_running_requests,
        }
        return json_response({
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "version": SERVER_VERSION,
            "accelerator": None,
            "num_accelerators": 1,
            "loads": [load],
        })

    async def iteration_log(self, request: web.Request) -> web.Response:
        """Per-step records (phase, batch size, KV tokens, duration) after ``?since=seq``."""
        try:
            since = int(request.query.get("since", "0"))
        except ValueError:
            return error_response(400, "since: expected an integer", "since")
        recs = [r.to_dict() for r in list(self.runner.engine.iterations) if r.seq > since]
        last = recs[-1]["seq"] if recs else since
        return json_response({"records": recs, "last_seq": last})

    async def update_weight_version(self, request: web.Request) -> web.Response:
        try:
            body = await self._body(request)
        except ParamError as exc:
            return error_response(400, str(exc), exc.param)
        new = body.get("new_version")
        if not isinstance(new, str) or not new:
            return error_response(400, "new_version is required (a string)", "new_version")
        if body.get("abort_all_requests"):
            await self.runner.abort(abort_all=True)
        self.runner.weight_version = new
        return json_response({"success": True, "new_version": new,
                                  "message": f"Weight version updated to {new}"})

    async def get_weight_version(self, request: web.Request) -> web.Response:
        return json_response({"weight_version": self.runner.weight_version})

    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        """Load a checkpoint directory (``TinyDecoder.save``) into the served model.

        As SGLang: unless generation is paused, new requests wait and the running ones finish
        first (or are aborted with ``abort_all_requests``); ``weight_version`` is set when given.
        """
        try:
            body = await self._body(request)
        except ParamError as exc:
            return error_response(400, str(exc), exc.param)
        path = body.get("model_path")
        version = body.get("weight_version")
        bad = next((k for k in body if k not in _UPDATE_FROM_DISK_KEYS), None)
        if bad is not None:
            return error_response(400, f"unknown field `{bad}`", bad)
        if not isinstance(path, str) or not path:
            return error_response(400, "model_path is required (a checkpoint directory)",
                                  "model_path")
        if version is not None and not isinstance(version, str):
            return error_response(400, "weight_version: expected a string", "weight_version")
        if body.get("load_format") not in (None, "auto", "aprilsim"):
            return error_response(400, f"load_format {body['load_format']!r} is not supported",
                                  "load_format")
        if not os.path.isdir(path):
            return json_response({"success": False, "num_paused_requests": 0,
                                      "message": f"Failed to update weights: no checkpoint "
                                                 f"directory at {path}"}, status=400)
        if body.get("abort_all_requests"):
            await self.runner.abort(abort_all=True)
        self._updating.set()
        try:
            if not self.runner.paused:
                await self.runner.wait_idle()
            await self.runner.load_weights(path)
        except Exception as exc:  # a bad checkpoint: the old weights stay, the server serves
            log.warning("update_weights_from_disk failed: %s", exc)
            return json_response({"success": False, "num_paused_requests": 0,
                                      "message": f"Failed to update weights: {exc}"}, status=400)
        finally:
            self._updating.clear()
        msg = "Succeeded to update model weights."
        if version is not None:
            self.runner.weight_version = version
            msg += f" Weight version updated to {version}."
        return json_response({"success": True, "message": msg, "num_paused_requests": 0})

    async def pause_generation(self, request: web.Request) -> web.Response:
        try:
            body = await self._body(request)
            mode = body.get("mode", "abort")
            await self.runner.pause(mode)
        except ParamError as exc:
            return error_response(400, str(exc), exc.param)
        except ValueError as exc:
            return error_response(400, str(exc), "mode")
        return json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(self, request: web.Request) -> web.Response:
        try:
            await self._body(request)
        except ParamError as exc:
            return error_response(400, str(exc), exc.param)
        self.runner.resume()
        return json_response({"message": "Generation continued successfully.",
                                  "status": "ok"})

    async def memory_occupation(self, request: web.Request) -> web.Response:
        if not self.cfg.enable_memory_saver:
            name = request.path.strip("/")
            return json_response({"error": {"message": f"{name} needs the memory saver: start "
                                            "the server with --enable-memory-saver"}}, status=400)
        try:
            body = await self._body(request)
            tags = body.get("tags")
            if tags is not None and (not isinstance(tags, list)
                                     or not all(isinstance(t, str) for t in tags)):
                raise ParamError("tags", "tags: expected a list of strings")
            if request.path.startswith("/release"):
                await self.runner.release_memory(tags)
            else:
                await self.runner.resume_memory(tags)
        except ValueError as exc:
            return json_response({"error": {"message": str(exc)}}, status=400)
        return json_response(None)

    async def flush_cache(self, request: web.Request) -> web.Response:
        return web.Response(status=200)  # no prefix cache: nothing to flush


_UPDATE_FROM_DISK_KEYS = frozenset({
    "model_path", "load_format", "abort_all_requests", "weight_version", "is_async",
    "torch_empty_cache", "keep_pause", "recapture_cuda_graph", "token_step", "flush_cache",
    "manifest", "rid",
})
