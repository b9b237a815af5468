"""An aiohttp server for the bundled engine that speaks SGLang's native HTTP API (a subset).

The point is that :class:`real.sglang_http.SGLangClient` and the real sglang-router can be run
end to end in CI against a live engine, without a GPU. Endpoints and shapes follow SGLang 0.5.23
(``sglang/srt/entrypoints/http_server.py``):

- ``POST /generate``: ``input_ids`` (one prompt), ``sampling_params``, ``rid``, ``stream``.
  Streaming sends ``data: {json}\\n\\n`` per step and ``data: [DONE]``; ``output_ids`` are
  cumulative, or per-chunk deltas when started with ``incremental_streaming_output``.
  Validation errors are HTTP 400 with an error body; unknown sampling params are rejected.
- ``POST /abort_request``: ``{"rid": prefix, "abort_all": bool}``. A running request ends with
  its partial output and finish reason ``{"type": "abort"}``; a queued one with message
  "Abort in waiting queue" and no ``prompt_tokens`` in its meta_info, as SGLang does.
- ``GET /health``, ``/health_generate``, ``/server_info`` (+ ``/get_server_info``),
  ``/model_info`` (+ ``/get_model_info``), ``/v1/loads``; ``POST /update_weight_version``,
  ``/flush_cache``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from dataclasses import asdict, dataclass

from aiohttp import web

from .engine import EngineRequest, Finished
from .runner import EngineRunner, RequestHandle, TokenEvent

SERVER_VERSION = "aprilsim-torch-0.1"

# sglang.api.v1.SamplingParams fields: anything else is rejected (as SGLang does, with 400).
KNOWN_SAMPLING_KEYS = frozenset({
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k",
    "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n",
    "json_schema", "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens",
    "spaces_between_special_tokens", "no_stop_trim", "stream_interval", "logit_bias",
    "sampling_seed", "custom_params", "beam_width", "watermark", "choice",
})


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 30000
    incremental_streaming_output: bool = False
    model_path: str = "aprilsim/tiny-random"


def error_response(status: int, message: str) -> web.Response:
    """SGLang's legacy ErrorResponse shape (``object/message/type/param/code``)."""
    body = {"object": "error", "message": message, "type": _phrase(status), "param": None,
            "code": status}
    return web.json_response(body, status=status)


def _phrase(status: int) -> str:
    from http import HTTPStatus

    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return str(status)


def _parse_generate(body: object) -> EngineRequest:
    """Build an EngineRequest from a /generate body; ValueError on anything unsupported."""
    if not isinstance(body, dict):
        raise ValueError("request body must be a JSON object")
    ids = body.get("input_ids")
    if ids is None:
        raise ValueError("input_ids is required (this engine has no tokenizer)")
    if not isinstance(ids, list) or not ids or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in ids
    ):
        raise ValueError("input_ids must be a non-empty list of integers (batches unsupported)")
    sp = body.get("sampling_params") or {}
    if not isinstance(sp, dict):
        raise ValueError("sampling_params must be an object (batches unsupported)")
    unknown = sorted(set(sp) - KNOWN_SAMPLING_KEYS)
    if unknown:
        raise ValueError(f"unknown field `{unknown[0]}` in sampling_params")
    rid = body.get("rid")
    if rid is not None and not isinstance(rid, str):
        raise ValueError("rid must be a string (batches unsupported)")

    def num(key: str, default, kind):
        v = sp.get(key)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"sampling_params.{key} must be a number")
        if kind is int and not isinstance(v, int):
            raise ValueError(f"sampling_params.{key} must be an integer")
        return kind(v)

    stop_ids = sp.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(isinstance(t, int) for t in stop_ids):
        raise ValueError("sampling_params.stop_token_ids must be a list of integers")
    return EngineRequest(
        rid=rid or uuid.uuid4().hex,
        prompt_ids=list(ids),
        max_new_tokens=num("max_new_tokens", 128, int),
        ignore_eos=bool(sp.get("ignore_eos") or False),
        stop_token_ids=tuple(stop_ids),
        temperature=num("temperature", 1.0, float),
        top_p=num("top_p", 1.0, float),
        top_k=num("top_k", -1, int),
        seed=sp.get("sampling_seed"),
    )


class EngineHTTPServer:
    """Routes SGLang-native endpoints onto an :class:`EngineRunner`."""

    def __init__(self, runner: EngineRunner, cfg: ServerConfig) -> None:
        self.runner = runner
        self.cfg = cfg
        self.started = time.time()
        self.total_requests = 0
        self.app = web.Application(client_max_size=64 * 1024 * 1024)
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
        r.add_post("/update_weight_version", self.update_weight_version)
        r.add_route("*", "/flush_cache", self.flush_cache)

    async def _on_startup(self, app: web.Application) -> None:
        self.runner.start()

    async def _on_cleanup(self, app: web.Application) -> None:
        await self.runner.close()

    # ---- /generate -------------------------------------------------------------------------
    def _meta(self, h: RequestHandle, f: Finished | None, n_out: int) -> dict:
        meta: dict = {"id": h.request.rid, "finish_reason": None if f is None else f.reason}
        if f is None or not f.queued:
            meta["prompt_tokens"] = len(h.request.prompt_ids)
        meta["completion_tokens"] = n_out
        meta["cached_tokens"] = 0
        meta["weight_version"] = self.runner.weight_version
        if f is not None:
            meta["e2e_latency"] = time.monotonic() - h.submitted
        return meta

    async def generate(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
            req = _parse_generate(body)
            handle = self.runner.submit(req)
            self.total_requests += 1
        except (ValueError, json.JSONDecodeError) as exc:
            return error_response(400, str(exc))
        except RuntimeError as exc:
            return error_response(503, str(exc))
        if not body.get("stream"):
            return await self._generate_once(handle)
        return await self._generate_stream(request, handle)

    async def _next_batch(self, handle: RequestHandle) -> tuple[list[int], Finished | None]:
        """Wait for at least one event, then drain what is queued (one chunk per engine step)."""
        new: list[int] = []
        ev = await handle.events.get()
        while True:
            if isinstance(ev, Finished):
                return new, ev
            assert isinstance(ev, TokenEvent)
            new.append(ev.token)
            try:
                ev = handle.events.get_nowait()
            except asyncio.QueueEmpty:
                return new, None

    async def _generate_once(self, handle: RequestHandle) -> web.Response:
        while True:
            _, fin = await self._next_batch(handle)
            if fin is not None:
                ids = fin.output_ids
                return web.json_response(
                    {"text": "", "output_ids": ids, "meta_info": self._meta(handle, fin, len(ids))}
                )

    async def _generate_stream(self, request: web.Request, handle: RequestHandle) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        incremental = self.cfg.incremental_streaming_output
        out: list[int] = []
        try:
            while True:
                new, fin = await self._next_batch(handle)
                out += new
                if fin is not None:
                    ids = fin.output_ids
                    if incremental:
                        # SGLang: a queued abort repeats the last token (or none); normal ends send
                        # the last delta. completion_tokens is the authority.
                        chunk_ids = new if not fin.queued else ids[-1:]
                    else:
                        chunk_ids = ids
                    chunk = {"text": "", "output_ids": chunk_ids,
                             "meta_info": self._meta(handle, fin, len(ids))}
                    await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                    break
                chunk = {"text": "", "output_ids": new if incremental else list(out),
                         "meta_info": self._meta(handle, None, len(out))}
                await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            # The client went away: abort its request as SGLang does, then stop.
            if handle.finished is None:
                with contextlib.suppress(Exception):
                    await asyncio.shield(self.runner.abort(handle.request.rid))
            raise
        return resp

    # ---- control -------------------------------------------------------------------------
    async def abort_request(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return error_response(400, "body must be JSON")
        if not isinstance(body, dict):
            return error_response(400, "body must be a JSON object")
        rid = body.get("rid") or ""
        abort_all = bool(body.get("abort_all", False))
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
            "tokenizer_path": "",
            "max_context_length": e.max_context,
            "max_total_num_tokens": e.kv_budget,
            "max_running_requests": e.cfg.max_running_requests,
            "max_prefill_tokens": e.cfg.max_prefill_tokens,
            "version": SERVER_VERSION,
            "internal_states": [{"max_running_requests": e.cfg.max_running_requests,
                                 "total_requests": self.total_requests,
                                 "max_total_num_tokens": e.kv_budget,
                                 "last_gen_throughput": self.runner.gen_throughput()}],
            "host": self.cfg.host,
            "port": self.cfg.port,
            "incremental_streaming_output": self.cfg.incremental_streaming_output,
            "disaggregation_mode": "null",
            "device": str(e.device),
            "skip_tokenizer_init": True,
            "model_config": asdict(e.model.cfg),
            "startup_time": self.started,
        }

    async def server_info(self, request: web.Request) -> web.Response:
        return web.json_response(self._info())

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response({
            "model_path": self.cfg.model_path,
            "served_model_name": self.cfg.model_path,
            "tokenizer_path": "",
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
            "num_total_tokens": used + sum(len(r.prompt_ids) for r in e.waiting),
            "max_total_num_tokens": e.kv_budget,
            "max_running_requests": e.cfg.max_running_requests,
            "token_usage": used / e.kv_budget if e.kv_budget else 0.0,
            "gen_throughput": self.runner.gen_throughput(),
            "utilization": self.runner.num_running / e.cfg.max_running_requests,
        }
        return web.json_response({
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "version": SERVER_VERSION,
            "accelerator": None,
            "num_accelerators": 1,
            "loads": [load],
        })

    async def update_weight_version(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
            new = body["new_version"]
        except (json.JSONDecodeError, KeyError, TypeError):
            return error_response(400, "new_version is required")
        if body.get("abort_all_requests"):
            await self.runner.abort(abort_all=True)
        self.runner.weight_version = str(new)
        return web.json_response({"success": True, "new_version": str(new),
                                  "message": f"Weight version updated to {new}"})

    async def flush_cache(self, request: web.Request) -> web.Response:
        return web.Response(status=200)  # no prefix cache: nothing to flush
