"""What the HTTP engine clients share: retry backoff, request ids, error bodies, SSE lines.

SGLang's and vLLM's adapters (:mod:`.sglang`, :mod:`.vllm`) and their wire modules both use these;
none of them does I/O.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import uuid
from dataclasses import dataclass

from aprilsim.types import FinishReason

__all__ = ["RID_PREFIX", "ParsedFinish", "RetryPolicy", "RidFactory", "StreamError",
           "is_retryable_status", "parse_error_body", "parse_sse_line"]


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded exponential backoff: attempt k waits ``initial * multiplier**(k-1)`` (capped)."""

    max_attempts: int = 4
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 2.0
    multiplier: float = 2.0

    def backoff(self, attempt: int) -> float:
        return min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** (attempt - 1))


RID_PREFIX = "aprilsim"


class RidFactory:
    """Request ids that are never prefixes of one another.

    SGLang aborts by prefix (``req.rid.startswith(rid)``), so an id that prefixes another would
    abort both. Every id has the same length (fixed-width session tag and counter), and distinct
    strings of equal length are never prefixes of each other.
    """

    def __init__(self, session: str | None = None) -> None:
        # A 12-hex-digit tag: random per factory, or derived from a caller's session name.
        raw = uuid.uuid4().hex if session is None else hashlib.sha1(session.encode()).hexdigest()
        self.session = raw[:12]
        self._counter = itertools.count()

    def __call__(self) -> str:
        n = next(self._counter)
        if n >= 10**12:
            raise OverflowError("request id counter exhausted")
        return f"{RID_PREFIX}-{self.session}-{n:012d}"


@dataclass(frozen=True)
class ParsedFinish:
    """A finish reason: ours, plus what the engine said about it."""

    reason: FinishReason
    message: str | None = None
    status_code: int | None = None
    raw: object = None


def parse_error_body(status: int, body: bytes | str) -> str:
    """A readable message from any of SGLang's error body shapes (lenient; key on status)."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, ValueError):
        obj = None
    msg = None
    if isinstance(obj, dict):
        err = obj.get("error")
        if isinstance(err, dict):
            msg = err.get("message") or json.dumps(err)
        elif isinstance(err, str):
            msg = err
        elif isinstance(obj.get("message"), str):
            msg = obj["message"]
        elif "detail" in obj:
            msg = json.dumps(obj["detail"]) if not isinstance(obj["detail"], str) else obj["detail"]
    if msg is None:
        msg = text.strip()[:500] or "<empty body>"
    return f"HTTP {status}: {msg}"


def is_retryable_status(status: int) -> bool:
    """5xx and 429 are worth another try; other 4xx are the request's fault."""
    return status >= 500 or status == 429


class StreamError(Exception):
    """An error chunk inside a stream; ``code`` keys retryability."""

    def __init__(self, message: str, code: int | None) -> None:
        super().__init__(message)
        self.code = code


def parse_sse_line(line: bytes) -> object | None:
    """One SSE line -> decoded JSON, the string ``"[DONE]"``, or None for blanks/comments."""
    line = line.strip()
    if not line or line.startswith(b":"):
        return None
    if not line.startswith(b"data:"):
        return None
    data = line[5:].strip()
    if data == b"[DONE]":
        return "[DONE]"
    return json.loads(data)
