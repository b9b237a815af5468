"""Sampling parameters of a /generate request: SGLang's validation rules, and the sampler.

:func:`parse_sampling_params` accepts exactly what SGLang 0.5.23 accepts (its JSON schema:
``sglang/api/v1/api_types.py``; its value rules: ``SamplingParams.__post_init__`` / ``verify`` /
``normalize`` in ``sglang/srt/sampling/sampling_params.py``) and raises :class:`ParamError`, a
``ValueError`` naming the parameter, for anything else. Parameters this engine does not implement
(grammars, beam search, watermarks, ``n`` > 1, ...) are refused with a 400 that names them
instead of being silently ignored; ``custom_params`` and ``spaces_between_special_tokens``
(slime sends both) are accepted because they change nothing here.

:func:`sample_next` applies penalties, logit bias, temperature, top-k, top-p and min-p, and
returns the token and its log-prob as SGLang reports it (``log_softmax(logits / temperature)``,
before top-k/top-p/min-p filtering; greedy requests use temperature 1). When the server restricts
what the model may emit (:meth:`real.torch_engine.engine.BatchEngine.restrict_output`), the
masked ids are at -inf in ``logits`` before any of this, so the log-probs (and top log-probs)
are those of the masked distribution, the one actually sampled.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

SAMPLING_EPS = 1e-6
TOP_K_ALL = 1 << 30
MAX_STOP_COUNT = 32

# Every key of sglang.api.v1.SamplingParams (unknown keys are rejected, as SGLang's schema does).
SAMPLING_KEYS = frozenset({
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k",
    "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n",
    "json_schema", "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens",
    "spaces_between_special_tokens", "no_stop_trim", "stream_interval", "logit_bias",
    "sampling_seed", "custom_params", "beam_width", "watermark", "choice",
})
# Known but not implemented: accepted only at their "off" value, else refused by name.
UNSUPPORTED_UNLESS_OFF: dict[str, Callable[[object], bool]] = {
    "stop_regex": lambda v: v is None or v == [],
    "json_schema": lambda v: not v,
    "regex": lambda v: not v,
    "ebnf": lambda v: not v,
    "structural_tag": lambda v: not v,
    "beam_width": lambda v: v is None or v == 1,
    "watermark": lambda v: v is None,
    "choice": lambda v: v is None or v == [],
    "n": lambda v: v is None or v == 1,
}


class ParamError(ValueError):
    """An invalid or unsupported request parameter; ``param`` names it (HTTP 400)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass
class SamplingSpec:
    """Validated, normalized sampling parameters of one request."""

    max_new_tokens: int = 128
    temperature: float = 1.0  # 0 (greedy) is stored as temperature 1 + top_k 1, as SGLang does
    top_p: float = 1.0
    top_k: int = TOP_K_ALL
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_new_tokens: int = 0
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    stop_token_ids: tuple[int, ...] = ()
    stop_strs: tuple[str, ...] = ()
    logit_bias: dict[int, float] = field(default_factory=dict)
    seed: int | None = None
    stream_interval: int | None = None

    @property
    def greedy(self) -> bool:
        return self.top_k == 1

    @property
    def needs_penalties(self) -> bool:
        return bool(self.frequency_penalty or self.presence_penalty
                    or self.repetition_penalty != 1.0)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: object) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool))


def _get(sp: dict, key: str, kind: str, default):
    v = sp.get(key)
    if v is None:
        return default
    if kind == "int" and not _is_int(v):
        raise ParamError(key, f"sampling_params.{key}: expected an integer, got {v!r}")
    if kind == "float" and not _is_num(v):
        raise ParamError(key, f"sampling_params.{key}: expected a number, got {v!r}")
    if kind == "bool" and not isinstance(v, bool):
        raise ParamError(key, f"sampling_params.{key}: expected a boolean, got {v!r}")
    return float(v) if kind == "float" else v


def parse_sampling_params(sp: object, vocab_size: int, has_tokenizer: bool) -> SamplingSpec:
    """Validate a ``sampling_params`` object as SGLang does; ParamError names the culprit."""
    if sp is None:
        sp = {}
    if isinstance(sp, list):
        raise ParamError("sampling_params", "sampling_params: batches (lists) are not supported")
    if not isinstance(sp, dict):
        raise ParamError("sampling_params", "sampling_params: expected an object")
    for key in sp:
        if key not in SAMPLING_KEYS:
            raise ParamError(key, f"sampling_params: unknown field `{key}`")
    for key, is_off in UNSUPPORTED_UNLESS_OFF.items():
        if key in sp and not is_off(sp[key]):
            raise ParamError(key, f"sampling_params.{key} is not supported by this engine")
    # Accepted with no effect here, as in SGLang: custom_params feed a custom logit processor
    # (refused above when one is named), and the bundled byte-level tokenizer never puts
    # spaces between special tokens, whatever spaces_between_special_tokens says.
    cp = sp.get("custom_params")
    if cp is not None and not isinstance(cp, dict):
        raise ParamError("custom_params", "sampling_params.custom_params: expected an object")
    _get(sp, "spaces_between_special_tokens", "bool", True)
    s = SamplingSpec(
        max_new_tokens=_get(sp, "max_new_tokens", "int", 128),
        temperature=_get(sp, "temperature", "float", 1.0),
        top_p=_get(sp, "top_p", "float", 1.0),
        top_k=_get(sp, "top_k", "int", -1),
        min_p=_get(sp, "min_p", "float", 0.0),
        frequency_penalty=_get(sp, "frequency_penalty", "float", 0.0),
        presence_penalty=_get(sp, "presence_penalty", "float", 0.0),
        repetition_penalty=_get(sp, "repetition_penalty", "float", 1.0),
        min_new_tokens=_get(sp, "min_new_tokens", "int", 0),
        ignore_eos=_get(sp, "ignore_eos", "bool", False),
        skip_special_tokens=_get(sp, "skip_special_tokens", "bool", True),
        no_stop_trim=_get(sp, "no_stop_trim", "bool", False),
        seed=_get(sp, "sampling_seed", "int", None),
        stream_interval=_get(sp, "stream_interval", "int", None),
    )
    # __post_init__: temperature ~0 means greedy; top_k -1 means the whole vocabulary.
    if 0 <= s.temperature < SAMPLING_EPS:
        s.temperature, s.top_k = 1.0, 1
    if s.top_k == -1:
        s.top_k = TOP_K_ALL
    _verify(s, sp, vocab_size)
    stop = sp.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(x, str) for x in stops):
            raise ParamError("stop", "sampling_params.stop: expected a string or a list of strings")
        if len(stops) > MAX_STOP_COUNT:
            raise ParamError("stop", f"at most {MAX_STOP_COUNT} stop strings are allowed, "
                                     f"got {len(stops)}")
        if stops and not has_tokenizer:
            raise ParamError("stop", "sampling_params.stop needs a tokenizer")
        s.stop_strs = tuple(x for x in stops if x)
    ids = sp.get("stop_token_ids")
    if ids is not None:
        if not isinstance(ids, list) or not all(_is_int(t) for t in ids):
            raise ParamError("stop_token_ids",
                             "sampling_params.stop_token_ids: expected a list of integers")
        s.stop_token_ids = tuple(sorted(set(ids)))
    return s


# SGLang's ``SamplingParams.verify`` range checks, in its order: (field, holds, message)
_RANGES: tuple[tuple[str, Callable[[SamplingSpec], bool], Callable[[SamplingSpec], str]], ...] = (
    ("temperature", lambda s: math.isfinite(s.temperature) and s.temperature >= 0.0,
     lambda s: f"temperature must be a non-negative finite number, got {s.temperature}."),
    ("top_p", lambda s: 0.0 < s.top_p <= 1.0, lambda s: f"top_p must be in (0, 1], got {s.top_p}."),
    ("min_p", lambda s: 0.0 <= s.min_p <= 1.0,
     lambda s: f"min_p must be in [0, 1], got {s.min_p}."),
    ("top_k", lambda s: s.top_k >= 1,
     lambda s: f"top_k must be -1 (disable) or at least 1, got {s.top_k}."),
    ("frequency_penalty", lambda s: -2.0 <= s.frequency_penalty <= 2.0,
     lambda s: f"frequency_penalty must be in [-2, 2], got {s.frequency_penalty}."),
    ("presence_penalty", lambda s: -2.0 <= s.presence_penalty <= 2.0,
     lambda s: f"presence_penalty must be in [-2, 2], got {s.presence_penalty}."),
    ("repetition_penalty", lambda s: 0.0 < s.repetition_penalty <= 2.0,
     lambda s: "repetition_penalty must be in (0, 2] (1.0 = no penalty), got "
               f"{s.repetition_penalty}."),
    ("min_new_tokens", lambda s: s.min_new_tokens >= 0,
     lambda s: f"min_new_tokens must be in [0, max_new_tokens], got {s.min_new_tokens}."),
    ("max_new_tokens", lambda s: s.max_new_tokens >= 0,
     lambda s: f"max_new_tokens must be at least 0, got {s.max_new_tokens}."),
    ("min_new_tokens", lambda s: s.min_new_tokens <= s.max_new_tokens,
     lambda s: f"min_new_tokens must be in [0, max_new_tokens({s.max_new_tokens})], got "
               f"{s.min_new_tokens}."),
    ("stream_interval", lambda s: s.stream_interval is None or s.stream_interval >= 1,
     lambda s: f"stream_interval must be at least 1, got {s.stream_interval}."),
)


def _verify(s: SamplingSpec, sp: dict, vocab_size: int) -> None:
    """SGLang's ``SamplingParams.verify``: same rules, same messages."""
    for name, holds, message in _RANGES:
        if not holds(s):
            raise ParamError(name, message(s))
    bias = sp.get("logit_bias")
    if bias:
        s.logit_bias.update(_logit_bias(bias, vocab_size))
    if s.seed is not None and not -(2**63) <= s.seed <= 2**63 - 1:
        raise ParamError("sampling_seed",
                         f"sampling_seed must be in [-2**63, 2**63 - 1], got {s.seed}.")


def _logit_bias(bias: object, vocab_size: int) -> dict[int, float]:
    """``logit_bias`` read and checked as SGLang does: token ids in the vocabulary, finite
    values."""
    if not isinstance(bias, dict):
        raise ParamError("logit_bias", "sampling_params.logit_bias: expected an object")
    out: dict[int, float] = {}
    for key, val in bias.items():
        try:
            tid = int(key)
        except ValueError:
            raise ParamError("logit_bias", f"logit_bias keys must be token ids, got {key!r}"
                             ) from None
        if not 0 <= tid < vocab_size:
            raise ParamError("logit_bias", f"logit_bias must has keys in [0, "
                                           f"{vocab_size - 1}], got {key}.")
        if not _is_num(val) or not math.isfinite(val):
            raise ParamError("logit_bias", f"logit_bias values must be finite numbers, "
                                           f"got {val!r}")
        out[tid] = float(val)
    return out


def adjust_logits(logits: torch.Tensor, s: SamplingSpec, prompt_ids: list[int],
                  output_ids: list[int], block_ids: tuple[int, ...],
                  vocab_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Penalties, logit bias, the output vocabulary mask and the ids blocked by min_new_tokens,
    on one request's [V] row. ``vocab_mask`` is additive (0 where allowed, -inf elsewhere), added
    after the bias, so no bias brings back a masked token."""
    logits = logits.float().clone()
    if s.needs_penalties and (output_ids or s.repetition_penalty != 1.0):
        v = logits.shape[-1]
        out = torch.tensor(output_ids, dtype=torch.long) if output_ids else None
        if out is not None and (s.frequency_penalty or s.presence_penalty):
            counts = torch.bincount(out, minlength=v).to(logits.dtype)
            logits -= s.frequency_penalty * counts + s.presence_penalty * (counts > 0)
        if s.repetition_penalty != 1.0:
            seen = torch.tensor(sorted(set(prompt_ids) | set(output_ids)), dtype=torch.long)
            vals = logits[seen]
            logits[seen] = torch.where(vals > 0, vals / s.repetition_penalty,
                                       vals * s.repetition_penalty)
    for tid, b in s.logit_bias.items():
        logits[tid] += b
    if vocab_mask is not None:
        logits += vocab_mask
    if block_ids:
        logits[list(block_ids)] = -float("inf")
    return logits


def sample_next(logits: torch.Tensor, s: SamplingSpec,
                generator: torch.Generator | None) -> tuple[int, torch.Tensor]:
    """Pick the next token from one request's adjusted [V] logits.

    Returns ``(token, logprobs)``: ``logprobs`` is ``log_softmax(logits / temperature)`` over the
    vocabulary, which is what SGLang returns in ``output_token_logprobs``.
    """
    logprobs = torch.log_softmax(logits / s.temperature, dim=-1)
    if s.greedy:
        return int(logits.argmax()), logprobs
    probs = logprobs.exp()
    if s.top_k < probs.shape[-1]:
        kth = probs.topk(s.top_k).values[-1]
        probs = torch.where(probs < kth, torch.zeros_like(probs), probs)
    if s.top_p < 1.0:
        sorted_p, order = probs.sort(descending=True)
        cum = sorted_p.cumsum(-1) - sorted_p
        sorted_p[cum > s.top_p * sorted_p.sum()] = 0.0
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    if s.min_p > 0.0:
        probs = torch.where(probs < s.min_p * probs.max(), torch.zeros_like(probs), probs)
    if not bool(torch.isfinite(probs).all()) or float(probs.sum()) <= 0.0:
        return int(logits.argmax()), logprobs
    tok = int(torch.multinomial(probs, 1, generator=generator))
    return tok, logprobs
