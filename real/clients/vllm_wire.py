"""vLLM's OpenAI-compatible wire format: the payloads we build and the responses we read, no I/O.

Kept apart from :mod:`real.clients.vllm` so that the contract tests can check every payload and
every parser against the shapes vLLM documents. Shapes follow vLLM 0.33.0 (the PyPI wheel):

- ``POST /v1/completions`` body (``entrypoints/openai/completion/protocol.py``,
  ``CompletionRequest``): ``prompt`` as a list of token ids, ``max_tokens``, ``temperature``,
  ``top_p``, ``top_k``, ``seed``, ``stop_token_ids``, and vLLM's extra sampling params
  ``ignore_eos`` and ``min_tokens``; ``stream: true`` with ``stream_options.include_usage``; the
  generated ids come back through ``return_token_ids`` (vLLM >= 0.10.2), or, for older servers,
  through ``logprobs`` + ``return_tokens_as_token_ids`` (tokens spelled ``"token_id:<id>"``);
  ``return_weight_versions`` labels the final chunk with the weights that sampled the output.
- A stream chunk (``CompletionStreamResponse``): ``{"id", "object", "created", "model",
  "choices": [{"index", "text", "logprobs", "finish_reason", "stop_reason", "token_ids",
  "prompt_token_ids", "weight_versions"}]}``; ``token_ids`` are the *new* ids of the chunk (output
  kind DELTA), ``prompt_token_ids`` come in the first chunk only; after the chunk with the
  ``finish_reason`` comes one with ``"choices": []`` and ``usage`` (``prompt_tokens``,
  ``completion_tokens``, ``total_tokens``), then ``data: [DONE]``. A failure inside the stream is a
  chunk ``{"error": {"message", "type", "param", "code"}}`` (``ErrorResponse``) before ``[DONE]``.
- Finish reasons (``vllm/v1/engine/__init__.py`` ``FINISH_REASON_STRINGS``): ``stop``,
  ``length``, ``abort``, ``error``, ``repetition``.
- ``GET /metrics`` (Prometheus text, ``vllm/v1/metrics/loggers.py``): gauges
  ``vllm:num_requests_running``, ``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc``
  (0..1), labelled ``model_name`` and ``engine`` (one per data-parallel engine), and the info gauge
  ``vllm:cache_config_info`` whose labels are the cache config (``num_gpu_blocks``,
  ``block_size``, ...).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from aprilsim.types import FinishReason

from ..protocol import GenerateRequest
from .http import (
    ParsedFinish,
    StreamError,
    is_retryable_status,
    parse_error_body,
    parse_sse_line,
)

__all__ = [
    "IDS_VIA",
    "MetricsLoad",
    "ParsedFinish",
    "StreamError",
    "VChunk",
    "completion_payload",
    "is_retryable_status",
    "parse_error_body",
    "parse_finish",
    "parse_metrics",
    "parse_sse_line",
    "parse_stream_chunk",
]

#: How generated ids are asked for: ``return_token_ids`` (vLLM >= 0.10.2) or logprobs spelled as
#: ids.
IDS_VIA = ("token_ids", "logprobs")
TOKEN_ID_PREFIX = "token_id:"


def completion_payload(req: GenerateRequest, model: str | None, request_id: str,
                       ids_via: str = "token_ids") -> dict:
    """The streamed ``/v1/completions`` body for ``req``.

    Temperature is always explicit (vLLM would otherwise take the model's generation config).
    Replay mode sets ``ignore_eos`` and ``min_tokens = max_tokens``: ``ignore_eos`` alone does not
    stop a server-default ``stop_token_ids`` (vLLM merges those into every request), while
    ``min_tokens`` masks every stop token until the count is reached.
    """
    if ids_via not in IDS_VIA:
        raise ValueError(f"ids_via must be one of {IDS_VIA}, got {ids_via!r}")
    n = req.tokens_to_generate
    if n < 1:
        raise ValueError("vLLM needs max_tokens >= 1; a request with nothing to generate is not "
                         "sent")
    s = req.sampling
    body: dict = {
        "prompt": [int(t) for t in req.prompt_ids],
        "max_tokens": n,
        "temperature": float(s.temperature),
        "top_p": float(s.top_p),
        "top_k": int(s.top_k),
        "stream": True,
        "stream_options": {"include_usage": True},
        "request_id": request_id,
        "return_weight_versions": True,
    }
    if model is not None:
        body["model"] = model
    if s.seed is not None:
        body["seed"] = int(s.seed)
    if req.replay:
        body["ignore_eos"] = True
        body["min_tokens"] = n
    elif s.stop_token_ids:
        body["stop_token_ids"] = [int(t) for t in s.stop_token_ids]
    if ids_via == "token_ids":
        body["return_token_ids"] = True
    else:
        body["logprobs"] = 0
        body["return_tokens_as_token_ids"] = True
    return body


_FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORT,
           # repetition detection ends a response early, like a stop string
           "repetition": FinishReason.STOP}


def parse_finish(value: object) -> ParsedFinish | None:
    """A choice's ``finish_reason`` -> ParsedFinish (None while the request runs).

    ``error`` (vLLM turns it into an error chunk, but be safe) and unknown values become ABORT
    with a message and status 500, so that the client retries them.
    """
    if value is None:
        return None
    if isinstance(value, str) and value in _FINISH:
        return ParsedFinish(_FINISH[value], None, None, value)
    return ParsedFinish(FinishReason.ABORT, f"engine finish_reason {value!r}", 500, value)


@dataclass
class VChunk:
    """One parsed ``data:`` object of a ``/v1/completions`` stream.

    ``new_ids`` is None when the chunk carried no ids at all (neither ``token_ids`` nor logprob
    tokens), which is only harmless when it also carried no text.
    """

    new_ids: list[int] | None
    text: str
    finish: ParsedFinish | None
    stop_reason: int | str | None
    prompt_ids: list[int] | None
    prompt_tokens: int | None
    completion_tokens: int | None
    weight_version: str | None
    is_usage: bool
    raw: dict = field(repr=False)


def _ids_from_logprobs(logprobs: object) -> list[int] | None:
    if not isinstance(logprobs, dict) or not isinstance(logprobs.get("tokens"), list):
        return None
    out = []
    for tok in logprobs["tokens"]:
        if not isinstance(tok, str) or not tok.startswith(TOKEN_ID_PREFIX):
            raise StreamError(f"logprob token {tok!r} is not spelled as an id "
                              "(is return_tokens_as_token_ids honoured?)", None)
        out.append(int(tok[len(TOKEN_ID_PREFIX):]))
    return out


def _int_list(v: object, what: str) -> list[int]:
    if not isinstance(v, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                          for t in v):
        raise StreamError(f"{what} is not a list of ints: {v!r}"[:300], None)
    return list(v)


def parse_stream_chunk(obj: object) -> VChunk:
    """Parse a decoded ``data:`` object; raises StreamError for an error chunk or a bad shape."""
    if not isinstance(obj, dict):
        raise StreamError(f"stream chunk is not an object: {obj!r}"[:300], None)
    if "error" in obj:
        err = obj["error"]
        if isinstance(err, dict):
            code = err.get("code")
            raise StreamError(str(err.get("message", err)), code if isinstance(code, int) else None)
        raise StreamError(str(err), None)
    usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else {}
    pt, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
    choices = obj.get("choices")
    if not isinstance(choices, list) or len(choices) > 1:
        raise StreamError(f"expected at most one choice, got {choices!r}"[:300], None)
    common = dict(prompt_tokens=pt if isinstance(pt, int) else None,
                  completion_tokens=ct if isinstance(ct, int) else None, raw=obj)
    if not choices:
        return VChunk(new_ids=[], text="", finish=None, stop_reason=None, prompt_ids=None,
                      weight_version=None, is_usage=bool(usage), **common)
    ch = choices[0]
    if not isinstance(ch, dict) or ch.get("index", 0) != 0:
        raise StreamError(f"unexpected choice {ch!r}"[:300], None)
    if ch.get("token_ids") is not None:
        ids: list[int] | None = _int_list(ch["token_ids"], "token_ids")
    else:
        ids = _ids_from_logprobs(ch.get("logprobs"))
    prompt = ch.get("prompt_token_ids")
    spans = ch.get("weight_versions")
    version = None
    if isinstance(spans, list) and spans and isinstance(spans[-1], dict):
        v = spans[-1].get("version")
        version = None if v is None else str(v)
    return VChunk(
        new_ids=ids, text=ch.get("text") or "", finish=parse_finish(ch.get("finish_reason")),
        stop_reason=ch.get("stop_reason"),
        prompt_ids=None if prompt is None else _int_list(prompt, "prompt_token_ids"),
        weight_version=version, is_usage=False, **common,
    )


# ---- Prometheus /metrics --------------------------------------------------------------------

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


def _labels(text: str) -> dict[str, str]:
    out = {}
    for m in _LABEL.finditer(text or ""):
        out[m.group(1)] = m.group(2).replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
    return out


def iter_samples(text: str):
    """``(name, labels, value)`` of every sample line of a Prometheus text exposition."""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        yield m.group(1), _labels(m.group(2)), value


@dataclass(frozen=True)
class MetricsLoad:
    """What ``/metrics`` says about load, summed over the server's engines (DP ranks).

    ``kv_cache_usage`` is the mean of the engines' ``vllm:kv_cache_usage_perc`` (0..1);
    ``kv_capacity_tokens`` = sum of ``num_gpu_blocks * block_size`` from ``vllm:cache_config_info``
    (None when absent); ``kv_used_tokens`` combines the two per engine; ``block_size`` the KV
    block size its engines share (None when absent or not shared), the prefix cache's grain.
    """

    running: int
    waiting: int
    kv_cache_usage: float | None
    kv_capacity_tokens: int | None
    kv_used_tokens: int | None
    engines: int
    block_size: int | None = None  # the KV block size (``block_size`` of cache_config_info)

    def as_loads(self) -> dict:
        """The keys of :meth:`real.clients.sglang.SGLangClient.loads`, for code that reads
        either."""
        return {"num_running_reqs": self.running, "num_waiting_reqs": self.waiting,
                "num_used_tokens": self.kv_used_tokens, "kv_cache_usage": self.kv_cache_usage}


def parse_metrics(text: str) -> MetricsLoad | None:
    """Load from a ``/metrics`` body; None when it has no ``vllm:num_requests_running``."""
    running: dict[str, float] = {}
    waiting: dict[str, float] = {}
    usage: dict[str, float] = {}
    capacity: dict[str, int] = {}
    blocks: set[int] = set()
    for name, labels, value in iter_samples(text):
        eng = labels.get("engine", "")
        if name == "vllm:num_requests_running":
            running[eng] = running.get(eng, 0.0) + value
        elif name == "vllm:num_requests_waiting":
            waiting[eng] = waiting.get(eng, 0.0) + value
        elif name == "vllm:kv_cache_usage_perc":
            usage[eng] = value
        elif name == "vllm:cache_config_info" and value == 1.0:
            try:
                block = int(labels["block_size"])
                blocks.add(block)
                capacity[eng] = int(labels["num_gpu_blocks"]) * block
            except (KeyError, ValueError):
                pass
    if not running:
        return None
    cap = sum(capacity.values()) if capacity else None
    used = None
    if usage and capacity and set(usage) <= set(capacity):
        used = int(round(sum(u * capacity[e] for e, u in usage.items())))
    return MetricsLoad(
        running=int(sum(running.values())), waiting=int(sum(waiting.values())),
        kv_cache_usage=sum(usage.values()) / len(usage) if usage else None,
        kv_capacity_tokens=cap, kv_used_tokens=used, engines=len(running),
        block_size=blocks.pop() if len(blocks) == 1 else None,
    )


# vLLM's engine-side counters (V1 /metrics; the histograms' _sum/_count), as summed over engines
COUNTERS = {
    "vllm:iteration_tokens_total_count": "iterations",
    "vllm:iteration_tokens_total_sum": "iteration_tokens",
    "vllm:inter_token_latency_seconds_sum": "itl_sum_s",
    "vllm:inter_token_latency_seconds_count": "itl_count",
    "vllm:request_prefill_time_seconds_sum": "prefill_sum_s",
    "vllm:request_prefill_time_seconds_count": "prefill_count",
    "vllm:request_decode_time_seconds_sum": "decode_sum_s",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:generation_tokens_total": "generation_tokens",
    "vllm:prefix_cache_queries_total": "prefix_queries",
    "vllm:prefix_cache_hits_total": "prefix_hits",
    "vllm:num_preemptions_total": "preemptions",
}


def parse_counters(text: str) -> dict[str, float]:
    """vLLM's engine-side counters in a ``/metrics`` body (:data:`COUNTERS`, by short name),
    summed over engines; names it lacks are left out. The histograms' times are the engine
    core's own timestamps: they do not include the API server's delivery delays."""
    out: dict[str, float] = {}
    for name, _labels, value in iter_samples(text):
        key = COUNTERS.get(name)
        if key is not None:
            out[key] = out.get(key, 0.0) + value
    return out


def counter_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """``after - before`` for the counters both hold."""
    return {k: after[k] - before[k] for k in after if k in before}
