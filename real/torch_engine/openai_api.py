"""A minimal OpenAI-compatible API over the bundled engine: enough for generic clients.

``/v1/models``, ``/v1/completions`` and ``/v1/chat/completions`` (streaming too, with
``stream_options.include_usage``). Requests are translated into a ``/generate`` body and go
through the same validation; OpenAI fields this engine does not implement (``logprobs``, ``echo``,
``n`` > 1, ``tools``, ``response_format`` other than text, ...) are refused with a 400 naming
them. The chat template is a plain ``<|role|>\\ncontent\\n`` concatenation ending in
``<|assistant|>\\n`` (the bundled model has no trained template).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING

from aiohttp import web

from .generate_api import ResponseBuilder
from .sampling import ParamError

if TYPE_CHECKING:
    from .http_server import EngineHTTPServer

_COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "stop", "seed", "n",
           "stream", "stream_options", "presence_penalty", "frequency_penalty",
           "repetition_penalty", "logit_bias", "user", "ignore_eos", "min_tokens",
           "stop_token_ids", "skip_special_tokens", "no_stop_trim", "logprobs", "rid"}
COMPLETION_KEYS = _COMMON | {"prompt", "echo", "suffix", "best_of"}
CHAT_KEYS = _COMMON | {"messages", "max_completion_tokens", "top_logprobs", "tools",
                       "tool_choice", "response_format", "parallel_tool_calls"}
# OpenAI name -> SGLang sampling param
_SAMPLING_MAP = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
                 "min_p": "min_p", "stop": "stop", "seed": "sampling_seed",
                 "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
                 "repetition_penalty": "repetition_penalty", "logit_bias": "logit_bias",
                 "ignore_eos": "ignore_eos", "min_tokens": "min_new_tokens",
                 "stop_token_ids": "stop_token_ids", "skip_special_tokens": "skip_special_tokens",
                 "no_stop_trim": "no_stop_trim"}
_FINISH = {"stop": "stop", "length": "length", "abort": "abort"}


def openai_error(status: int, message: str, param: str | None = None) -> web.Response:
    return web.json_response({"object": "error", "message": message, "type": "BadRequestError"
                              if status == 400 else "InternalServerError", "param": param,
                              "code": status}, status=status)


def chat_prompt(messages: object) -> str:
    """The bundled chat template; ParamError on a malformed ``messages``."""
    if not isinstance(messages, list) or not messages:
        raise ParamError("messages", "messages: expected a non-empty list")
    parts = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ParamError("messages", "messages: each message needs a role")
        content = m.get("content")
        if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
            if not all(isinstance(c, dict) and c.get("type") == "text"
                       and isinstance(c.get("text"), str) for c in content):
                raise ParamError("messages", "messages: only text content is supported")
            content = "".join(c["text"] for c in content)
        if not isinstance(content, str):
            raise ParamError("messages", "messages: content must be a string")
        parts.append(f"<|{m['role']}|>\n{content}\n")
    return "".join(parts) + "<|assistant|>\n"


class OpenAIRoutes:
    """The OpenAI endpoints of one :class:`EngineHTTPServer`."""

    def __init__(self, server: EngineHTTPServer) -> None:
        self.server = server

    def register(self, router: web.UrlDispatcher) -> None:
        router.add_get("/v1/models", self.models)
        router.add_get("/v1/models/{model:.*}", self.model)
        router.add_post("/v1/completions", self.completions)
        router.add_post("/v1/chat/completions", self.chat)

    @property
    def name(self) -> str:
        return self.server.cfg.model_path

    def _card(self) -> dict:
        return {"id": self.name, "object": "model", "created": int(self.server.started),
                "owned_by": "sglang", "root": self.name, "parent": None,
                "max_model_len": self.server.runner.engine.max_context}

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self._card()]})

    async def model(self, request: web.Request) -> web.Response:
        if request.match_info["model"] != self.name:
            return web.json_response({"error": {
                "message": f"The model '{request.match_info['model']}' does not exist",
                "type": "invalid_request_error", "param": "model",
                "code": "model_not_found"}}, status=404)
        return web.json_response(self._card())

    def _generate_body(self, body: dict, keys: set[str], prompt: object,
                       max_tokens_keys: tuple[str, ...]) -> dict:
        for k in body:
            if k not in keys:
                raise ParamError(k, f"unknown field `{k}`")
        refuse = {"logprobs": not body.get("logprobs"), "echo": not body.get("echo"),
                  "suffix": not body.get("suffix"), "n": body.get("n") in (None, 1),
                  "best_of": body.get("best_of") in (None, 1), "tools": not body.get("tools"),
                  "tool_choice": body.get("tool_choice") in (None, "none", "auto"),
                  "top_logprobs": not body.get("top_logprobs"),
                  "response_format": body.get("response_format") in (None, {"type": "text"})}
        for k, ok in refuse.items():
            if k in body and not ok:
                raise ParamError(k, f"{k} is not supported by this engine")
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise ParamError("model", "model: expected a string")
        sp: dict = {}
        for k in max_tokens_keys:
            if body.get(k) is not None:
                sp["max_new_tokens"] = body[k]
        sp.setdefault("max_new_tokens", 16 if max_tokens_keys == ("max_tokens",) else 128)
        for k, v in _SAMPLING_MAP.items():
            if body.get(k) is not None:
                sp[v] = body[k]
        so = body.get("stream_options")
        if so is not None and not isinstance(so, dict):
            raise ParamError("stream_options", "stream_options: expected an object")
        out: dict = {"sampling_params": sp, "stream": bool(body.get("stream", False))}
        if isinstance(prompt, str):
            out["text"] = prompt
        else:
            out["input_ids"] = prompt
        if body.get("rid") is not None:
            out["rid"] = body["rid"]
        return out

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def _serve(self, request: web.Request, chat: bool) -> web.StreamResponse:
        from .http_server import read_json

        try:
            body = await read_json(request)
            if not isinstance(body, dict):
                raise ParamError("body", "request body must be a JSON object")
            if chat:
                gen = self._generate_body(body, CHAT_KEYS, chat_prompt(body.get("messages")),
                                          ("max_tokens", "max_completion_tokens"))
            else:
                prompt = body.get("prompt")
                if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
                    prompt = prompt[0]
                if prompt is None or (isinstance(prompt, list) and prompt
                                      and not isinstance(prompt[0], int)):
                    raise ParamError("prompt", "prompt: expected a string or a list of token "
                                               "ids (batches are not supported)")
                gen = self._generate_body(body, COMPLETION_KEYS, prompt, ("max_tokens",))
            handle, opts = await self.server.submit(gen)
        except ParamError as exc:
            return openai_error(400, str(exc), exc.param)
        except ValueError as exc:
            return openai_error(400, str(exc))
        except RuntimeError as exc:
            return openai_error(503, str(exc))
        builder = ResponseBuilder(handle.request, opts, self.server.codec, incremental=True)
        rid = handle.request.rid
        ident = ("chatcmpl-" if chat else "cmpl-") + rid
        created = int(time.time())
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        if not opts.stream:
            fin = await self.server.wait_finished(handle)
            code = fin.reason.get("status_code")
            if fin.reason.get("type") == "abort" and isinstance(code, int) and code >= 400:
                return openai_error(code, str(fin.reason.get("message", "")))
            text = builder.text(fin.output_ids, fin)
            choice: dict = {"index": 0, "logprobs": None,
                            "finish_reason": _FINISH.get(fin.reason.get("type"), "stop"),
                            "matched_stop": fin.reason.get("matched")}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            return web.json_response({
                "id": ident, "object": "chat.completion" if chat else "text_completion",
                "created": created, "model": self.name, "choices": [choice],
                "usage": self._usage(handle.request, len(fin.output_ids))})
        return await self._stream(request, handle, builder, chat, ident, created, include_usage)

    @staticmethod
    def _usage(req, n_out: int) -> dict:
        return {"prompt_tokens": len(req.prompt_ids), "completion_tokens": n_out,
                "total_tokens": len(req.prompt_ids) + n_out}

    async def _stream(self, request: web.Request, handle, builder: ResponseBuilder, chat: bool,
                      ident: str, created: int, include_usage: bool) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        obj = "chat.completion.chunk" if chat else "text_completion"

        async def send(choice: dict, usage: dict | None = None) -> None:
            chunk = {"id": ident, "object": obj, "created": created, "model": self.name,
                     "choices": [choice] if choice else []}
            if usage is not None:
                chunk["usage"] = usage
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")

        out: list[int] = []
        try:
            await resp.prepare(request)
            if chat:
                await send({"index": 0, "delta": {"role": "assistant", "content": ""},
                            "finish_reason": None, "logprobs": None})
            while True:
                new, fin = await self.server.next_events(handle)
                out += new
                ids = fin.output_ids if fin is not None else list(out)
                delta = builder.render(ids, fin, self.server.runner.weight_version, None)["text"]
                finish = None if fin is None else _FINISH.get(fin.reason.get("type"), "stop")
                if chat:
                    choice = {"index": 0, "delta": {"content": delta} if delta else {},
                              "finish_reason": finish, "logprobs": None}
                else:
                    choice = {"index": 0, "text": delta, "finish_reason": finish,
                              "logprobs": None}
                await send(choice)
                if fin is not None:
                    if include_usage:
                        await send({}, self._usage(handle.request, len(fin.output_ids)))
                    break
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            await self.server._abort_on_disconnect(handle)
            raise
        return resp
