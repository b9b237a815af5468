"""A small fake of vLLM's OpenAI-compatible server (aiohttp on 127.0.0.1) for the adapter tests.

It speaks the shapes of ``vllm_schema`` (and checks every request body against it): streamed
``/v1/completions`` with ``token_ids`` or ``token_id:N`` logprob tokens, the trailing usage chunk
and ``[DONE]``; ``/metrics`` in Prometheus text; ``/health``, ``/v1/models``, ``/version``; with
``dev=True`` the RL endpoints (``/weight_info``, ``/update_weight_version``, ``/collective_rpc``,
``/pause``, ``/resume``). A client that disconnects aborts its request, as in vLLM.

Generation is a deterministic chain: the next token is a function of the previous one (prompt
included), so a request resumed from prompt + partial output continues exactly where an
uninterrupted one would have gone: the tests can check that nothing was lost or duplicated.
Faults are queued per request in ``faults``: ``("status", code)``, ``("cut", n)`` (drop the
connection after n tokens), ``("hang", n)`` (go silent after n tokens), ``("error_chunk", n)``
(an ErrorResponse chunk with code 500 after n tokens), ``("finish", reason, n)`` (end with that
finish_reason after n tokens).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import vllm_schema as S
from aiohttp import web

MODEL = "fake/tiny-model"


def next_token(prev: int, vocab: int) -> int:
    return (prev * 17 + 3) % vocab


def chain(prompt: list[int], n: int, vocab: int) -> list[int]:
    """The n tokens an uninterrupted greedy run produces after ``prompt`` (ignoring EOS)."""
    out, prev = [], prompt[-1]
    for _ in range(n):
        prev = next_token(prev, vocab)
        out.append(prev)
    return out


@dataclass
class FakeVLLM:
    """Start with ``async with FakeVLLM(...) as fake:``; ``fake.url`` is its base URL."""

    vocab: int = 1000
    eos: int = 999
    step_s: float = 0.002
    max_running: int = 4
    dev: bool = False
    max_model_len: int = 4096
    num_gpu_blocks: int = 512
    block_size: int = 16
    bodies: list[dict] = field(default_factory=list)
    faults: list[tuple] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    healthy: bool = True
    running: int = 0
    waiting: int = 0
    kv_tokens: int = 0
    weight_version: str | None = None
    rpc_calls: list[dict] = field(default_factory=list)
    paused: bool = False

    async def __aenter__(self) -> FakeVLLM:
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/version", self._version)
        if self.dev:
            app.router.add_get("/weight_info", self._weight_info)
            app.router.add_post("/update_weight_version", self._update_version)
            app.router.add_post("/collective_rpc", self._rpc)
            app.router.add_post("/pause", self._pause)
            app.router.add_post("/resume", self._resume)
        self._sem = asyncio.Semaphore(self.max_running)
        self._resumed = asyncio.Event()
        self._runner = web.AppRunner(app, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc) -> None:
        await self._runner.cleanup()

    # ---- generation ------------------------------------------------------------------------
    @staticmethod
    def _error(status: int, message: str) -> web.Response:
        body = {"error": {"message": message, "type": "BadRequestError" if status < 500
                          else "ServiceUnavailableError", "param": None, "code": status}}
        S.check(body, S.ErrorResponse)
        return web.json_response(body, status=status)

    def _chunk(self, rid: str, req: S.CompletionRequest, ids: list[int], finish: str | None = None,
               prompt: list[int] | None = None, offset: int = 0) -> dict:
        choice: dict = {"index": 0, "text": "".join(f" t{t}" for t in ids),
                        "finish_reason": finish, "stop_reason": None}
        choice["token_ids"] = ids if req.return_token_ids else None
        if prompt is not None:
            choice["prompt_token_ids"] = prompt
        if req.logprobs is not None:
            choice["logprobs"] = {
                "text_offset": [offset + 3 * i for i in range(len(ids))],
                "token_logprobs": [-0.5] * len(ids),
                "tokens": [f"token_id:{t}" if req.return_tokens_as_token_ids else f" t{t}"
                           for t in ids],
                "top_logprobs": [None] * len(ids)}
        if finish is not None and req.return_weight_versions and self.weight_version is not None:
            choice["weight_versions"] = [{"version": self.weight_version, "start": 0,
                                          "end": offset + len(ids)}]
        obj = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": MODEL,
               "choices": [choice]}
        S.check(obj, S.CompletionStreamResponse)
        return obj

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        try:
            req = S.check_request(body)
        except S.ContractError as exc:
            return self._error(400, str(exc))
        fault = self.faults.pop(0) if self.faults else None
        if fault and fault[0] == "status":
            return self._error(fault[1], "injected failure")
        if self.paused:  # mode=keep: new requests wait for /resume
            await self._resumed.wait()
        if req.model not in (None, MODEL):
            return self._error(404, f"The model `{req.model}` does not exist.")
        bad = [t for t in req.prompt if not 0 <= t < self.vocab]
        if bad:  # vLLM's processor: "Token id N is out of vocabulary"
            return self._error(400, f"Token id {max(bad)} is out of vocabulary")
        if len(req.prompt) + (req.max_tokens or 16) > self.max_model_len:
            return self._error(400, "This model's maximum context length is exceeded")
        rid = f"cmpl-{req.request_id or 'x'}"
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        send = lambda obj: resp.write(f"data: {json.dumps(obj)}\n\n".encode())  # noqa: E731
        self.waiting += 1
        held = False
        generated = 0
        try:
            await self._sem.acquire()
            held = True
            self.waiting -= 1
            self.running += 1
            self.kv_tokens += len(req.prompt)
            prev, limit = req.prompt[-1], req.max_tokens or 16
            stops = set(req.stop_token_ids or ())
            finish = None
            while finish is None:
                await asyncio.sleep(self.step_s)
                if fault and fault[0] in ("cut", "hang", "error_chunk") and generated == fault[1]:
                    if fault[0] == "cut":
                        request.transport.close()
                        return resp
                    if fault[0] == "hang":
                        await asyncio.sleep(3600)
                    await send({"error": {"message": "Internal server error",
                                          "type": "InternalServerError",
                                          "param": None, "code": 500}})
                    await resp.write(b"data: [DONE]\n\n")
                    return resp
                if fault and fault[0] == "finish" and generated == fault[2]:
                    await send(self._chunk(rid, req, [], fault[1], offset=generated))
                    break
                tok = next_token(prev, self.vocab)
                prev = tok
                generated += 1
                self.kv_tokens += 1
                if generated >= limit:
                    finish = "length"
                elif generated >= req.min_tokens and ((tok == self.eos and not req.ignore_eos)
                                                      or tok in stops):
                    finish = "stop"
                first = req.prompt if generated == 1 and req.return_token_ids else None
                await send(self._chunk(rid, req, [tok], finish, prompt=first, offset=generated - 1))
            if req.stream_options and req.stream_options.include_usage:
                usage = {"id": rid, "object": "text_completion", "created": int(time.time()),
                         "model": MODEL,
                         "choices": [], "usage": {"prompt_tokens": len(req.prompt),
                                                  "completion_tokens": generated,
                                                  "total_tokens": len(req.prompt) + generated}}
                S.check(usage, S.CompletionStreamResponse)
                await send(usage)
            await resp.write(b"data: [DONE]\n\n")
            self.finished.append(rid)
            return resp
        except (asyncio.CancelledError, ConnectionError):
            self.aborted.append(rid)  # the client went away: vLLM aborts the request
            raise
        finally:
            if held:
                self._sem.release()
                self.running -= 1
                self.kv_tokens -= len(req.prompt) + generated
            else:
                self.waiting -= 1

    # ---- control ---------------------------------------------------------------------------
    async def _metrics(self, request: web.Request) -> web.Response:
        lab = f'engine="0",model_name="{MODEL}"'
        usage = min(1.0, self.kv_tokens / (self.num_gpu_blocks * self.block_size))
        text = "\n".join([
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{lab}}} {float(self.running)}",
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{{{lab}}} {float(self.waiting)}",
            "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc{{{lab}}} {usage}",
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
            "# TYPE vllm:cache_config_info gauge",
            f'vllm:cache_config_info{{block_size="{self.block_size}",cache_dtype="auto",engine="0",'
            f'num_gpu_blocks="{self.num_gpu_blocks}",prefix_caching_hash_algo="sha256"}} 1.0',
            "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{{{lab}}} 123.0",
            "",
        ])
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "0.33.0-fake"})

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.healthy else 503)

    async def _models(self, request: web.Request) -> web.Response:
        body = {"object": "list", "data": [{"id": MODEL, "object": "model", "created": 0,
                                            "owned_by": "vllm",
                                            "root": MODEL, "parent": None,
                                            "max_model_len": self.max_model_len, "permission": []}]}
        S.check(body, S.ModelList)
        return web.json_response(body)

    async def _weight_info(self, request: web.Request) -> web.Response:
        return web.json_response({"weight_version": self.weight_version})

    async def _update_version(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.weight_version = str(body["new_version"])
        return web.json_response({"success": True, "new_version": self.weight_version})

    async def _rpc(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.rpc_calls.append(body)
        return web.json_response({"results": [None]})

    async def _pause(self, request: web.Request) -> web.Response:
        assert request.query.get("mode") in ("abort", "wait", "keep")
        self.paused = True
        self._resumed.clear()
        return web.json_response({"status": "paused"})

    async def _resume(self, request: web.Request) -> web.Response:
        self.paused = False
        self._resumed.set()
        return web.json_response({"status": "resumed"})
