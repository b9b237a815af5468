"""SGLang's native wire format: the payloads we build and the responses we read, without I/O.

Kept apart from the HTTP client so that the contract tests can check every payload against
SGLang's own schema and every parser against recorded/served responses.

Shapes follow SGLang 0.5.23 (``sglang/api/v1/api_types.py``, ``srt/entrypoints/http_server.py``):

- ``/generate`` body: ``input_ids``, ``sampling_params``, ``rid``, ``stream``.
- A stream chunk: ``{"text", "output_ids", "meta_info": {"id", "finish_reason",
  "prompt_tokens", "completion_tokens", ...}}``; ``output_ids`` are cumulative unless the server
  runs with ``--incremental-streaming-output`` (then each chunk carries only new ids; a request
  aborted in the waiting queue repeats the last id). ``meta_info.completion_tokens`` is the
  running total in both modes, which is what lets :class:`StreamAccumulator` check itself.
- An error chunk: ``{"error": {"message", "code", ...}}``; error bodies come as
  ``{"object": "error", "message", "code"}``, ``{"error": "..."}``, ``{"error": {...}}``,
  ``{"detail": ...}`` or plain text.
"""

from __future__ import annotations

from dataclasses import dataclass

from aprilsim.types import FinishReason

from ..protocol import GenerateRequest
from .http import (  # shared with vLLM's wire format; named here for SGLang's callers
    RID_PREFIX,
    ParsedFinish,
    RidFactory,
    StreamError,
    is_retryable_status,
    parse_error_body,
    parse_sse_line,
)

__all__ = ["ABORT_ALL_PAYLOAD", "RID_PREFIX", "ParsedFinish", "RidFactory", "StreamAccumulator",
           "StreamChunk", "StreamError", "abort_payload", "generate_payload", "is_retryable_status",
           "parse_chunk", "parse_error_body", "parse_finish_reason", "parse_sse_line"]


def generate_payload(req: GenerateRequest, rid: str, stream: bool = True) -> dict:
    """The /generate body for ``req``. Temperature is always explicit; replay sets ignore_eos."""
    s = req.sampling
    sp: dict = {
        "max_new_tokens": req.tokens_to_generate,
        "temperature": float(s.temperature),
        "top_p": float(s.top_p),
        "top_k": int(s.top_k),
    }
    if req.replay:
        sp["ignore_eos"] = True
    elif s.stop_token_ids:
        sp["stop_token_ids"] = [int(t) for t in s.stop_token_ids]
    if s.seed is not None:
        sp["sampling_seed"] = int(s.seed)
    body = {
        "input_ids": [int(t) for t in req.prompt_ids],
        "sampling_params": sp,
        "rid": rid,
        "stream": stream,
    }
    if req.priority:  # SGLang: higher values first unless --schedule-low-priority-values-first
        body["priority"] = int(req.priority)
    return body


ABORT_ALL_PAYLOAD = {"rid": "", "abort_all": True}


def abort_payload(rid: str) -> dict:
    return {"rid": rid, "abort_all": False}


# ---- responses ------------------------------------------------------------------------------


def parse_finish_reason(value: object) -> ParsedFinish | None:
    """``meta_info.finish_reason`` -> ParsedFinish (None while the request runs).

    Accepts SGLang's dict form (``{"type": "stop" | "length" | "abort", ...}``) and, leniently,
    the OpenAI-style string form.
    """
    if value is None:
        return None
    if isinstance(value, str):
        kind, msg, code = value, None, None
    elif isinstance(value, dict):
        kind = str(value.get("type", ""))
        msg = value.get("message")
        code = value.get("status_code")
    else:
        return ParsedFinish(FinishReason.ABORT, f"unexpected finish_reason {value!r}", None, value)
    table = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORT}
    reason = table.get(kind, FinishReason.ABORT)
    if kind not in table:
        msg = msg or f"unknown finish_reason type {kind!r}"
    return ParsedFinish(reason, msg, code if isinstance(code, int) else None, value)


@dataclass
class StreamChunk:
    """One parsed ``data:`` line of a /generate stream."""

    output_ids: list[int]
    completion_tokens: int | None
    finish: ParsedFinish | None
    prompt_tokens: int | None
    weight_version: str | None
    rid: str | None
    raw: dict


def parse_chunk(obj: object) -> StreamChunk:
    """Parse a decoded ``data:`` JSON object; raises StreamError for an error chunk."""
    if not isinstance(obj, dict):
        raise StreamError(f"stream chunk is not an object: {obj!r}"[:300], None)
    if "error" in obj:
        err = obj["error"]
        if isinstance(err, dict):
            code = err.get("code")
            raise StreamError(str(err.get("message", err)), code if isinstance(code, int) else None)
        raise StreamError(str(err), None)
    meta = obj.get("meta_info") or {}
    ids = obj.get("output_ids") or []
    ct = meta.get("completion_tokens")
    pt = meta.get("prompt_tokens")
    return StreamChunk(
        output_ids=[int(t) for t in ids],
        completion_tokens=ct if isinstance(ct, int) else None,
        finish=parse_finish_reason(meta.get("finish_reason")),
        prompt_tokens=pt if isinstance(pt, int) else None,
        weight_version=meta.get("weight_version"),
        rid=meta.get("id"),
        raw=obj,
    )


class StreamAccumulator:
    """Rebuilds a response's output ids from cumulative or incremental chunks.

    ``incremental`` is what the server said (``/server_info``); ``completion_tokens`` in each
    chunk is used to check it, and to pick the right reading when the flag is unknown or wrong.
    The final chunk is the authority: its ids (cumulative) or the accumulated ids cut to its
    ``completion_tokens`` (incremental; a queued abort may repeat the last id).
    """

    def __init__(self, incremental: bool | None = None) -> None:
        self.incremental = incremental
        self.ids: list[int] = []

    def _reading(self, chunk: StreamChunk) -> bool:
        """True if this chunk should be read as incremental."""
        n = chunk.completion_tokens
        as_inc = len(self.ids) + len(chunk.output_ids)
        as_cum = len(chunk.output_ids)
        if n is not None:
            if as_inc == n and as_cum != n:
                return True
            if as_cum == n and as_inc != n:
                return False
            if as_inc == n:  # nothing accumulated yet: both readings agree
                return bool(self.incremental)
            if chunk.finish is not None and self.incremental and as_inc > n:
                return True  # incremental final that repeats the last id (queued abort)
        if self.incremental is not None:
            return self.incremental
        # Unknown and unchecked: cumulative if it extends what we have, else incremental.
        return not (as_cum >= len(self.ids) and chunk.output_ids[: len(self.ids)] == self.ids)

    def feed(self, chunk: StreamChunk) -> list[int]:
        """Apply ``chunk``; returns the ids that are new since the previous chunk."""
        before = len(self.ids)
        if self._reading(chunk):
            merged = self.ids + chunk.output_ids
            if chunk.finish is not None and chunk.completion_tokens is not None:
                merged = merged[: max(chunk.completion_tokens, before)]
            self.ids = merged
        else:
            if chunk.finish is None and len(chunk.output_ids) < before:
                return []  # a stale cumulative chunk never shrinks the output mid-stream
            self.ids = list(chunk.output_ids)
        return self.ids[before:] if len(self.ids) > before else []
