"""A test-only description of vLLM's OpenAI-compatible shapes that aprilsim's vLLM adapter uses.

Written for aprilsim (not copied) from the vLLM 0.33.0 wheel's pydantic models, which cannot be
loaded without importing vLLM itself (they import ``vllm.envs``, ``vllm.config``,
``vllm.sampling_params`` ...):

- ``vllm/entrypoints/openai/completion/protocol.py``: ``CompletionRequest`` (the fields below,
  their types and the ``mode="before"`` validators mirrored in :func:`check_request`),
  ``CompletionLogProbs``, ``CompletionResponseStreamChoice``, ``CompletionStreamResponse``;
- ``vllm/entrypoints/generate/base/protocol.py``: ``StreamOptions``;
- ``vllm/entrypoints/serve/engine/protocol.py``: ``UsageInfo``, ``ErrorInfo``, ``ErrorResponse``,
  ``ModelCard``, ``ModelList``; ``vllm/outputs.py``: ``WeightVersionSpan``;
- ``vllm/v1/engine/__init__.py``: ``FINISH_REASON_STRINGS``; ``vllm/v1/metrics/loggers.py``: the
  gauge names and their ``model_name``/``engine`` labels.

Stricter than vLLM on purpose: vLLM accepts (and silently ignores) unknown request fields, so a
misspelt field would pass unnoticed there; here every struct forbids unknown fields, ``prompt``
must be token ids (the only form the adapter sends) and ``finish_reason`` one of vLLM's strings.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

NonNegInt = Annotated[int, msgspec.Meta(ge=0)]
FinishReasonStr = Literal["stop", "length", "abort", "error", "repetition"]


class Strict(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    pass


class StreamOptions(Strict):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class CompletionRequest(Strict):
    prompt: Annotated[list[NonNegInt], msgspec.Meta(min_length=1)]
    model: str | None = None
    echo: bool | None = False
    logprobs: int | None = None
    max_tokens: int | None = 16
    n: int = 1
    seed: int | None = None
    stop: list[str] | str | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    request_id: str | None = None
    return_tokens_as_token_ids: bool | None = None
    return_token_ids: bool | None = None
    return_weight_versions: bool = False


class ContractError(ValueError):
    """A body vLLM would reject (HTTP 400) or a shape it never sends."""


def check_request(body: dict) -> CompletionRequest:
    """Decode ``body`` and apply the checks vLLM makes before or while building SamplingParams."""
    try:
        req = msgspec.convert(body, CompletionRequest, strict=True)
    except msgspec.ValidationError as exc:
        raise ContractError(str(exc)) from exc
    if req.stream_options is not None and not req.stream:
        raise ContractError("Stream options can only be defined when `stream=True`.")
    if req.logprobs is not None and req.logprobs < 0 and req.logprobs != -1:
        raise ContractError("`logprobs` must be a positive value or -1.")
    if req.max_tokens is not None and req.max_tokens < 1:
        raise ContractError("max_tokens must be at least 1")
    if req.min_tokens < 0 or (req.max_tokens is not None and req.min_tokens > req.max_tokens):
        raise ContractError("min_tokens must be in [0, max_tokens]")
    if req.top_k is not None and req.top_k < -1:
        raise ContractError("top_k must be 0 (disable), or at least 1")
    if req.temperature is not None and req.temperature < 0:
        raise ContractError("temperature must be non-negative")
    if req.top_p is not None and not 0 < req.top_p <= 1:
        raise ContractError("top_p must be in (0, 1]")
    return req


class CompletionLogProbs(Strict):
    text_offset: list[int] = []
    token_logprobs: list[float | None] = []
    tokens: list[str] = []
    top_logprobs: list[dict[str, float] | None] = []


class WeightVersionSpan(Strict):
    version: str
    start: int
    end: int


class CompletionResponseStreamChoice(Strict):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: FinishReasonStr | None = None
    stop_reason: int | str | None = None
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    weight_versions: list[WeightVersionSpan] | None = None


class UsageInfo(Strict):
    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: int | None = 0
    prompt_tokens_details: dict | None = None
    completion_tokens_details: dict | None = None


class CompletionStreamResponse(Strict):
    id: str
    model: str
    choices: list[CompletionResponseStreamChoice]
    object: str = "text_completion"
    created: int = 0
    usage: UsageInfo | None = None
    system_fingerprint: str | None = None
    metrics: dict | None = None
    kv_transfer_params: dict | None = None


class ErrorInfo(Strict):
    message: str
    type: str
    code: int
    param: str | None = None


class ErrorResponse(Strict):
    error: ErrorInfo


class ModelCard(Strict):
    id: str
    object: str = "model"
    created: int = 0
    owned_by: str = "vllm"
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None
    permission: list[dict] = []


class ModelList(Strict):
    object: str = "list"
    data: list[ModelCard] = []


def check(obj: object, kind: type) -> object:
    try:
        return msgspec.convert(obj, kind, strict=True)
    except msgspec.ValidationError as exc:
        raise ContractError(f"{kind.__name__}: {exc}") from exc


METRIC_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc")


def check_metrics(text: str) -> None:
    """Every gauge the adapter reads is there, typed gauge, labelled model_name and engine."""
    from real.clients.vllm_wire import iter_samples

    samples = list(iter_samples(text))
    for name in METRIC_GAUGES:
        if f"# TYPE {name} gauge" not in text:
            raise ContractError(f"{name} is not declared as a gauge")
        rows = [lab for n, lab, _ in samples if n == name]
        if not rows or not all({"model_name", "engine"} <= set(lab) for lab in rows):
            raise ContractError(f"{name} missing or without model_name/engine labels")
    info = [lab for n, lab, v in samples if n == "vllm:cache_config_info" and v == 1.0]
    if not info or not all({"num_gpu_blocks", "block_size", "engine"} <= set(lab) for lab in info):
        raise ContractError("vllm:cache_config_info missing or without num_gpu_blocks/block_size")
