"""Engine adapters by URL, for the runner's ``--engines`` (and anything else that takes URLs).

``vllm+http://host:8000`` -> :class:`real.vllm_http.VLLMEngine`; ``sglang+http://...`` or a plain
``http(s)://`` URL -> :class:`real.sglang_http.SGLangClient` (SGLang, sglang-router, or the
bundled ``python -m real.serve``).
"""

from __future__ import annotations

from .protocol import Engine

KINDS = ("sglang", "vllm")


def split_engine_url(spec: str) -> tuple[str, str]:
    """``(kind, url)`` of ``[kind+]http(s)://...``; the kind defaults to ``sglang``."""
    spec = spec.strip()
    head, plus, rest = spec.partition("+")
    if plus and head in KINDS and rest.startswith(("http://", "https://")):
        return head, rest.rstrip("/")
    return "sglang", spec.rstrip("/")


def connect(spec: str) -> Engine:
    """The adapter for ``spec`` (see :func:`split_engine_url`); no I/O until first used."""
    kind, url = split_engine_url(spec)
    if kind == "vllm":
        from .vllm_http import VLLMEngine

        return VLLMEngine(url)
    from .sglang_http import SGLangClient

    return SGLangClient(url)
