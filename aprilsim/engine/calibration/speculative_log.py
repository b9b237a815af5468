"""Fit speculative decoding's acceptance from logs that report accepted tokens.

Two sources, both giving the mean tokens a verify step emits per request (bonus token included)
and the draft length k, from which p solves E(k, p) = accept length (`speculative.fit_acceptance`):

* SGLang 0.5.23's decode log line (``scheduler_components/metrics_reporter.py``)::

      Decode batch, #running-req: 32, #token: 41000, token usage: 0.05, accept len: 2.61,
          accept rate: 0.40, cuda graph: True, gen throughput (token/s): 2650.12, #queue-req: 0

  ``accept len`` is generated tokens per request per verify step over the log window, ``accept
  rate`` the correct drafts over (request-steps x draft tokens per round), so k =
  (accept len - 1) / accept rate unless given. Windows are weighted by ``#running-req``.
* vLLM's Prometheus counters (``/metrics``, ``v1/spec_decode/metrics.py``):
  ``vllm:spec_decode_num_drafts_total``, ``..._num_draft_tokens_total`` and
  ``..._num_accepted_tokens_total``; accept length = 1 + accepted / drafts, k = draft tokens /
  drafts. Counters with several label sets (engines) are summed.

The fit is the "model" acceptance (`[speculative]` of the preset file: one p for every request,
as a draft model gives; add `staleness` to have it fall as the policy moves); the logs carry no
per-group or per-prompt information to fit "group" or "history". `range_note` says where the
measured accept length stands against the published figures for RL rollouts.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path

from aprilsim.engine.speculative import fit_acceptance
from aprilsim.engine.speculative_spec import PUBLISHED

_ACCEPT = re.compile(r"accept len:\s*([0-9.eE+-]+)")
_RATE = re.compile(r"accept rate:\s*([0-9.eE+-]+)")
_RUNNING = re.compile(r"#running-req:\s*(\d+)")
_PROM = re.compile(r"^(vllm:spec_decode_num_(?:drafts|draft_tokens|accepted_tokens)_total)"
                   r"(?:\{[^}]*\})?\s+([0-9.eE+-]+)\s*$", re.M)


@dataclass(frozen=True)
class SpeculativeFit:
    """The fitted acceptance: draft length k, the measured accept length, p, and the evidence."""

    k: int
    accept_len: float
    p: float
    steps: float  # request-steps (SGLang: the windows' #running-req summed; vLLM: drafts)
    source: str

    def preset(self) -> dict[str, object]:
        """The preset file's `[speculative]` table (a draft model's acceptance, k fixed)."""
        return {"acceptance": "model", "p": self.p, "k_max": self.k}

    def range_note(self) -> str:
        """Where the measured accept length stands against the published RL figures."""
        (lo, hi), source = PUBLISHED["model"]
        where = ("within" if lo <= self.accept_len <= hi else
                 "above" if self.accept_len > hi else "below")
        return (f"accept length {self.accept_len:.2f} is {where} the published {lo:.2f}-"
                f"{hi:.2f} ({source})")

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _fit(k: int | None, accept_len: float, steps: float, source: str,
         k_seen: float | None) -> SpeculativeFit:
    if k is None:
        if k_seen is None or not k_seen > 0:
            raise ValueError(f"{source}: the draft length is not in the log; give --draft-tokens")
        k = max(1, round(k_seen))
    return SpeculativeFit(k, accept_len, fit_acceptance(k, accept_len), steps, source)


def fit_from_sglang_lines(lines: list[str], k: int | None = None,
                          source: str = "SGLang log") -> SpeculativeFit | None:
    """The fit over the decode lines that report ``accept len`` (None when none does)."""
    w_sum = acc_sum = drafts_sum = rate_w = 0.0
    for line in lines:
        if "Decode batch" not in line:
            continue
        m = _ACCEPT.search(line)
        if m is None:
            continue
        run = _RUNNING.search(line)
        w = float(run.group(1)) if run else 1.0
        acc = float(m.group(1))
        if w <= 0 or acc <= 0:
            continue
        w_sum += w
        acc_sum += w * acc
        r = _RATE.search(line)
        if r is not None and float(r.group(1)) > 0:
            drafts_sum += w * (acc - 1.0) / float(r.group(1))
            rate_w += w
    if not w_sum:
        return None
    return _fit(k, acc_sum / w_sum, w_sum, source, drafts_sum / rate_w if rate_w else None)


def fit_from_vllm_metrics(text: str, k: int | None = None,
                          source: str = "vLLM /metrics") -> SpeculativeFit | None:
    """The fit from vLLM's spec-decode counters (None when they are absent or zero)."""
    got: dict[str, float] = {}
    for name, value in _PROM.findall(text):
        got[name] = got.get(name, 0.0) + float(value)
    drafts = got.get("vllm:spec_decode_num_drafts_total", 0.0)
    if drafts <= 0 or "vllm:spec_decode_num_accepted_tokens_total" not in got:
        return None
    accept_len = 1.0 + got["vllm:spec_decode_num_accepted_tokens_total"] / drafts
    k_seen = got.get("vllm:spec_decode_num_draft_tokens_total", 0.0) / drafts
    return _fit(k, accept_len, drafts, source, k_seen)


def fit_speculative_file(path: str | Path, k: int | None = None) -> SpeculativeFit:
    """The fit from a file holding either source; ValueError when it reports no accepted tokens."""
    p = Path(path)
    try:
        text = p.read_text(errors="replace")
    except OSError as e:
        raise ValueError(f"--speculative-log {p}: {e.strerror or e}") from None
    if k is not None and k < 1:
        raise ValueError(f"--draft-tokens must be >= 1, got {k}")
    fit = fit_from_vllm_metrics(text, k, f"vLLM /metrics {p}") or fit_from_sglang_lines(
        text.splitlines(), k, f"SGLang log {p}")
    if fit is None:
        raise ValueError(f"--speculative-log {p}: no 'accept len' decode line (SGLang) and no "
                         "vllm:spec_decode_num_drafts_total counter (vLLM)")
    return fit
