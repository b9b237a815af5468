"""A minimal OpenAI-compatible API over the bundled engine: enough for generic clients.

``/v1/models``, ``/v1/completions`` and ``/v1/chat/completions`` (streaming too, with
``stream_options.include_usage``). Requests are translated into a ``/generate`` body and go
through the same validation. Every field of SGLang 0.5.23's ``CompletionRequest`` and
``ChatCompletionRequest`` (``sglang/srt/entrypoints/openai/protocol.py``) is accepted, as
sglang-router adds SGLang's extension fields at their defaults to every call: fields with no
effect here (routing, cache keys, reasoning switches of a model without reasoning, multimodal
options without media) whatever their value, and fields this engine does not implement
(``logprobs``, ``echo``, ``n`` > 1, ``tools``, grammars, ``return_hidden_states``, ...) only at
their default, else a 400 naming them. Unknown fields are ignored, as SGLang's pydantic models
ignore them (logged once per name). The chat template is a plain ``<|role|>\\ncontent\\n``
concatenation ending in ``<|assistant|>\\n`` (the bundled model has no trained template);
``continue_final_message`` continues the last assistant message instead, and ``input_ids``
bypasses the template, as in SGLang.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol

from aiohttp import web

from .engine import Finished
from .generate_api import GenerateOptions, ResponseBuilder
from .http_body import dumps, json_response, read_json, strict_bool
from .runner import EngineRunner, RequestHandle
from .sampling import ParamError, _is_int
from .tokenizer import TextCodec


class RouteHost(Protocol):
    """What the OpenAI routes use of the server that mounts them (``EngineHTTPServer``); a
    protocol, so that this module and the server's do not import each other."""

    cfg: Any  # ServerConfig: model_path
    runner: EngineRunner
    codec: TextCodec | None
    started: float

    def note_ignored(self, keys: tuple[str, ...] | list[str], where: str) -> None: ...
    async def submit(self, body: object) -> tuple[RequestHandle, GenerateOptions]: ...
    async def wait_finished(self, handle: RequestHandle) -> Finished: ...
    async def next_events(self, handle: RequestHandle,
                          at_least: int = 1) -> tuple[list[int], Finished | None]: ...
    async def abort_on_disconnect(self, handle: RequestHandle) -> None: ...

_COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "stop", "seed", "n",
           "stream", "stream_options", "presence_penalty", "frequency_penalty",
           "repetition_penalty", "logit_bias", "user", "ignore_eos", "min_tokens",
           "stop_token_ids", "skip_special_tokens", "no_stop_trim", "logprobs", "rid"}
COMPLETION_KEYS = _COMMON | {"prompt", "echo", "suffix", "best_of"}
CHAT_KEYS = _COMMON | {"messages", "max_completion_tokens", "top_logprobs", "tools",
                       "tool_choice", "response_format", "parallel_tool_calls",
                       "continue_final_message", "input_ids"}
# SGLang extension fields with no effect on this engine's output, whatever their value: routing
# and disaggregation hints of a single non-PD worker, cache/metrics keys, scheduling priority,
# reasoning switches (the bundled model has no reasoning parser), multimodal options (no media
# is accepted), and custom_params (only read by a custom logit processor, refused below).
NO_EFFECT = frozenset({
    "routed_dp_rank", "disagg_prefill_dp_rank", "data_parallel_rank", "extra_key", "cache_salt",
    "priority", "custom_labels", "session_id", "custom_params", "separate_reasoning",
    "stream_reasoning", "reasoning_effort", "reasoning", "thinking", "task",
    "chat_template_kwargs", "max_dynamic_patch", "min_dynamic_patch", "use_audio_in_video",
    "images_config", "video_config", "mm_processor_kwargs", "return_flat_raw_top_logprobs_b64",
    "parallel_tool_calls",
})
# SGLang fields that would change the output and are not implemented here: accepted at their
# default only (the value sglang-router sends), else refused by name.
_OFF = (None, False, 0, "", [], {})
DEFAULT_ONLY: dict[str, tuple] = {k: _OFF for k in (
    "return_hidden_states", "return_routed_experts", "routed_experts_start_len",
    "return_cached_tokens_details", "return_spec_tokens_details", "return_prompt_token_ids",
    "return_token_ids", "return_meta_info", "return_input_ids_in_sglext",
    "return_output_ids_in_sglext", "return_sampling_mask", "sampling_logprobs_mode",
    "return_flat_raw_output_top_logprobs", "json_schema", "regex", "ebnf", "stop_regex",
    "lora_path", "session_params", "custom_logit_processor", "watermark", "bootstrap_host",
    "bootstrap_port", "bootstrap_room", "logprobs", "echo", "suffix", "tools", "top_logprobs")}
DEFAULT_ONLY.update({"n": (None, 1), "best_of": (None, 1),
                     "tool_choice": (None, "none", "auto"),
                     "response_format": (None, {"type": "text"})})
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
    return json_response({"object": "error", "message": message, "type": "BadRequestError"
                              if status == 400 else "InternalServerError", "param": param,
                              "code": status}, status=status)


def chat_prompt(messages: object, continue_final: bool = False) -> str:
    """The bundled chat template; ParamError on a malformed ``messages``. ``continue_final``
    (SGLang's ``continue_final_message``): the last message, an assistant's, is continued
    instead of a new assistant turn being opened."""
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
    if continue_final:
        if messages[-1].get("role") != "assistant":
            raise ParamError("continue_final_message", "continue_final_message needs the last "
                                                       "message to be the assistant's")
        return "".join(parts)[:-1]  # no closing newline: the model continues the message
    return "".join(parts) + "<|assistant|>\n"


class OpenAIRoutes:
    """The OpenAI endpoints of one server (``EngineHTTPServer``, seen as a :class:`RouteHost`)."""

    def __init__(self, server: RouteHost) -> None:
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
        return json_response({"object": "list", "data": [self._card()]})

    async def model(self, request: web.Request) -> web.Response:
        if request.match_info["model"] != self.name:
            return json_response({"error": {
                "message": f"The model '{request.match_info['model']}' does not exist",
                "type": "invalid_request_error", "param": "model",
                "code": "model_not_found"}}, status=404)
        return json_response(self._card())

    def _generate_body(self, body: dict, keys: set[str], prompt: object,
                       max_tokens_keys: tuple[str, ...]) -> dict:
        ignored = []
        for k, v in body.items():
            if k in DEFAULT_ONLY:
                if not any(type(v) is type(d) and v == d for d in DEFAULT_ONLY[k]):
                    raise ParamError(k, f"{k} is not supported by this engine (only its "
                                        f"default is accepted), got {v!r}"[:300])
            elif k not in keys and k not in NO_EFFECT:
                ignored.append(k)
        self.server.note_ignored(ignored, "/v1")
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
        strict_bool(so or {}, "include_usage")  # the string "false" is no false
        out: dict = {"sampling_params": sp, "stream": strict_bool(body, "stream")}
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
        try:
            body = await read_json(request)
            if not isinstance(body, dict):
                raise ParamError("body", "request body must be a JSON object")
            if chat:
                cont = body.get("continue_final_message", False)
                if not isinstance(cont, bool):
                    raise ParamError("continue_final_message",
                                     "continue_final_message: expected a boolean")
                ids = body.get("input_ids")
                if ids is not None and not (isinstance(ids, list) and ids
                                            and all(_is_int(t) for t in ids)):
                    raise ParamError("input_ids", "input_ids: expected a non-empty list of "
                                                  "token ids")
                text = chat_prompt(body.get("messages"), cont)  # validated even with input_ids
                gen = self._generate_body(body, CHAT_KEYS, ids if ids is not None else text,
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
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))  # checked
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
            return json_response({
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
            await resp.write(b"data: " + dumps(chunk).encode() + b"\n\n")

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
            await self.server.abort_on_disconnect(handle)
            raise
        return resp
