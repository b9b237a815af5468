"""SGLang's ``/generate`` request and response shapes, for the bundled server.

:func:`parse_generate` turns a request body into an :class:`EngineRequest`, validating it as SGLang
0.5.23 does (``sglang/api/v1/api_types.py`` for the shape, ``sampling_params.py`` for the values,
``tokenizer_manager.py`` for lengths). Every SGLang field that would change the output and is not
implemented is refused with a :class:`ParamError` naming it, never silently ignored: batches,
multimodal inputs, LoRA, hidden states, ``token_ids_logprob``. Unknown top-level fields are
ignored, as SGLang ignores them (``bench_serving --extra-request-body`` adds its own keys); they
are listed in :attr:`GenerateOptions.ignored` and logged once per name by the server.

:class:`ResponseBuilder` renders ``text``, ``output_ids`` and ``meta_info`` (log-probs in SGLang's
``[logprob, token_id, text]`` triples) for one request, cumulative or incremental.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from .engine import EngineRequest, Finished
from .sampling import ParamError, _is_int, parse_sampling_params
from .tokenizer import TextCodec

# Fields this server implements.
SUPPORTED = frozenset({
    "rid", "text", "input_ids", "sampling_params", "stream", "return_logprob",
    "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs", "token_ids_logprob",
    "priority",  # honoured with --enable-priority-scheduling (higher first), else ignored
})
# Fields with no effect here whatever their value (cache keys, routing hints, metrics labels).
HARMLESS = frozenset({
    "extra_key", "cache_salt", "routing_key", "custom_labels", "log_metrics", "no_logs",
    "conversation_id", "external_trace_header", "received_time", "session_id",
    "model",  # sglang-router adds the model name to every request it forwards
})
# SGLang fields this server does not implement: accepted only at their off value (None, False,
# 0, empty), else refused by name.
NOT_IMPLEMENTED = frozenset({
    "input_embeds", "image_data", "video_data", "audio_data", "mm_hashes", "mm_content_hashes",
    "use_audio_in_video", "video_config", "watermark", "return_sampling_mask",
    "sampling_logprobs_mode", "return_flat_raw_top_logprobs",
    "return_flat_raw_output_top_logprobs", "return_hidden_states", "return_routed_experts",
    "routed_experts_start_len", "return_indexer_topk", "modalities", "session_params", "lora_path",
    "lora_id", "custom_logit_processor", "positional_embed_overrides", "bootstrap_host",
    "bootstrap_port", "bootstrap_room", "bootstrap_pair_key", "decode_tp_size", "routed_dp_rank",
    "data_parallel_rank", "disagg_prefill_dp_rank", "http_worker_ipc", "background",
    "require_reasoning", "max_thinking_tokens", "return_bytes", "return_entropy",
    "return_prompt_token_ids", "need_wait_for_mm_inputs", "num_items_assigned", "encoder_urls",
    "max_dynamic_patch", "min_dynamic_patch", "image_max_dynamic_patch",
    "video_max_dynamic_patch", "images_config", "mm_processor_kwargs",
    "multi_item_delimiter_indices", "token_indices_to_pool", "kv_hints",
})


@dataclass(frozen=True)
class GenerateOptions:
    """Response options of one /generate request."""

    stream: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    ignored: tuple[str, ...] = ()  # unknown top-level fields (SGLang ignores them too)


def _off(v: object) -> bool:
    return v is None or v is False or v == 0 or v == "" or v == [] or v == {}


def _typed(body: dict, key: str, kind: type, default):
    v = body.get(key)
    if v is None:
        return default
    ok = isinstance(v, bool) if kind is bool else _is_int(v) if kind is int else isinstance(v, kind)
    if not ok:
        raise ParamError(key, f"{key}: expected {kind.__name__}, got {v!r}")
    return v


def parse_prompt(body: dict, codec: TextCodec | None) -> list[int]:
    """The prompt ids from ``text`` or ``input_ids`` (exactly one, one prompt)."""
    text, ids = body.get("text"), body.get("input_ids")
    if text is not None and ids is not None:
        raise ParamError("text", "Either text or input_ids should be provided, not both.")
    if text is None and ids is None:
        raise ParamError("input_ids", "Either text or input_ids should be provided.")
    if text is not None:
        if isinstance(text, list):
            raise ParamError("text", "text: batched requests (a list) are not supported")
        if not isinstance(text, str):
            raise ParamError("text", f"text: expected a string, got {text!r}")
        if codec is None:
            raise ParamError("text", "text prompts need a tokenizer (server started without one)")
        ids = codec.encode(text)
        if not ids:
            raise ParamError("text", "text encodes to no tokens")
        return ids
    if not isinstance(ids, list):
        raise ParamError("input_ids", "input_ids: expected a list of token ids")
    if ids and isinstance(ids[0], list):
        raise ParamError("input_ids", "input_ids: batched requests (a list of lists) are not "
                                      "supported")
    if not all(_is_int(t) for t in ids):
        raise ParamError("input_ids", "input_ids: expected a list of integers")
    return list(ids)


def parse_generate(body: object, vocab_size: int,
                   codec: TextCodec | None) -> tuple[EngineRequest, GenerateOptions]:
    """Validate a /generate body; :class:`ParamError` (HTTP 400) names what is wrong."""
    if not isinstance(body, dict):
        raise ParamError("body", "request body must be a JSON object")
    ignored: list[str] = []
    for key, v in body.items():
        if key in SUPPORTED or key in HARMLESS:
            continue
        if key in NOT_IMPLEMENTED:
            if not _off(v):
                raise ParamError(key, f"{key} is not supported by this engine")
            continue
        ignored.append(key)
    if body.get("token_ids_logprob") is not None:
        raise ParamError("token_ids_logprob", "token_ids_logprob is not supported by this engine")
    rid = body.get("rid")
    if rid is not None and not isinstance(rid, str):
        raise ParamError("rid", "rid: expected a string (batched requests are not supported)")
    ids = parse_prompt(body, codec)
    spec = parse_sampling_params(body.get("sampling_params"), vocab_size, codec is not None)
    opts = GenerateOptions(
        stream=_typed(body, "stream", bool, False),
        return_logprob=_typed(body, "return_logprob", bool, False),
        top_logprobs_num=_typed(body, "top_logprobs_num", int, 0),
        return_text_in_logprobs=_typed(body, "return_text_in_logprobs", bool, False),
        ignored=tuple(ignored),
    )
    start = _typed(body, "logprob_start_len", int, -1)
    if start < -1:
        raise ParamError("logprob_start_len", f"logprob_start_len must be >= -1, got {start}")
    if opts.top_logprobs_num < 0:
        raise ParamError("top_logprobs_num", "top_logprobs_num must be >= 0")
    if opts.top_logprobs_num > vocab_size:
        raise ParamError("top_logprobs_num", f"top_logprobs_num must be <= {vocab_size}")
    priority = body.get("priority")
    if priority is not None and not _is_int(priority):
        raise ParamError("priority", "priority: expected an integer")
    req = EngineRequest(
        rid=rid or uuid.uuid4().hex, prompt_ids=ids, max_new_tokens=spec.max_new_tokens,
        spec=spec, return_logprob=opts.return_logprob, priority=int(priority or 0),
        logprob_start_len=start if opts.return_logprob else -1,
        top_logprobs_num=opts.top_logprobs_num if opts.return_logprob else 0,
    )
    return req, opts


class ResponseBuilder:
    """Renders one request's ``/generate`` objects (chunks or the final response)."""

    def __init__(self, req: EngineRequest, opts: GenerateOptions, codec: TextCodec | None,
                 incremental: bool) -> None:
        self.req, self.opts, self.codec, self.incremental = req, opts, codec, incremental
        self.sent_ids = 0  # output ids already sent (incremental mode)
        self.sent_text = ""
        self.sent_input = False
        # incremental detokenization (as SGLang's detokenizer): text up to read_offset is final
        self._surr = self._read = 0
        self._committed = ""

    def _decode(self, ids: list[int]) -> str:
        assert self.codec is not None
        spec = self.req.spec
        return self.codec.decode(ids, skip_special_tokens=spec.skip_special_tokens
                                 if spec is not None else True)

    def text(self, ids: list[int], fin: Finished | None) -> str:
        """The output text: incremental while streaming (a trailing partial UTF-8 character is
        held back; cost per chunk independent of the output length), a full decode at the end
        (with a matched stop string trimmed unless ``no_stop_trim``)."""
        if self.codec is None:
            return ""
        if fin is None:
            surr_text = self._decode(ids[self._surr:self._read])
            new_text = self._decode(ids[self._surr:])
            if len(new_text) > len(surr_text) and not new_text.endswith("\ufffd"):
                self._committed += new_text[len(surr_text):]
                self._surr, self._read = self._read, len(ids)
            return self._committed
        spec = self.req.spec
        text = self._decode(ids)
        matched = (fin.reason.get("matched") if fin is not None else None)
        if isinstance(matched, str) and spec is not None and not spec.no_stop_trim:
            cut = text.find(matched)
            if cut >= 0:
                text = text[:cut]
        return text

    def _triples(self, pairs) -> list:
        out = []
        for lp, tid in pairs:
            tt = self.codec.token_text(tid) if (self.opts.return_text_in_logprobs
                                                and self.codec) else None
            out.append([lp, tid, tt])
        return out

    def _logprobs(self, n_out: int, lo: int) -> dict:
        r = self.req
        meta: dict = {}
        inp = r.input_logprobs or []
        send_input = not self.incremental or not self.sent_input
        in_ids = r.prompt_ids[max(r.logprob_start_len, 0):] if r.logprob_start_len >= 0 else []
        meta["input_token_logprobs"] = self._triples(zip(inp, in_ids)) if send_input else []
        meta["output_token_logprobs"] = self._triples(
            zip(r.output_logprobs[lo:n_out], r.output_ids[lo:n_out]))
        if r.top_logprobs_num > 0:
            tops = r.input_top_logprobs or []
            meta["input_top_logprobs"] = ([None if t is None else self._triples(t) for t in tops]
                                          if send_input else [])
            meta["output_top_logprobs"] = [self._triples(t)
                                           for t in r.output_top_logprobs[lo:n_out]]
        self.sent_input = True
        return meta

    def render(self, ids: list[int], fin: Finished | None, weight_version: str,
               e2e: float | None) -> dict:
        """The object for the output so far (``ids``: every output id of the request)."""
        n = len(ids)
        lo = self.sent_ids if self.incremental else 0
        full_text = self.text(ids, fin)
        if self.incremental:
            text = full_text[len(self.sent_text):] if full_text.startswith(self.sent_text) \
                else full_text
            chunk_ids = ids[lo:]
            if fin is not None and fin.queued:  # SGLang repeats the last id (or none)
                chunk_ids = ids[-1:]
        else:
            text, chunk_ids = full_text, list(ids)
        meta: dict = {"id": self.req.rid, "finish_reason": None if fin is None else fin.reason}
        if fin is None or not fin.queued:
            meta["prompt_tokens"] = len(self.req.prompt_ids)
        meta["completion_tokens"] = n
        meta["cached_tokens"] = 0
        meta["weight_version"] = weight_version
        if e2e is not None:
            meta["e2e_latency"] = e2e
        if self.opts.return_logprob:
            meta.update(self._logprobs(n, lo))
        self.sent_ids, self.sent_text = n, full_text
        return {"text": text, "output_ids": chunk_ids, "meta_info": meta}
