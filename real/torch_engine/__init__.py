"""The bundled engine: a small torch transformer with continuous batching and a real KV cache.

- :mod:`.model`: the decoder and its slot-based KV pool;
- :mod:`.engine`: :class:`BatchEngine`, synchronous continuous batching (SGLang's admission
  reserve and retraction, prefill, decode, stop/length/abort, log-probs, iteration records);
- :mod:`.sampling`: SGLang's sampling-parameter validation and the sampler;
- :mod:`.tokenizer`: the bundled byte-level BPE, generated deterministically;
- :mod:`.generate_api`: ``/generate`` request parsing and response rendering;
- :mod:`.http_body`: request bodies and strict JSON, shared by the two HTTP modules below;
- :mod:`.openai_api`: the minimal OpenAI-compatible endpoints (mounted by the server, which it
  sees through a protocol: the two never import each other);
- :mod:`.runner`: :class:`EngineRunner`, the asyncio step loop;
- :mod:`.local`: :class:`LocalEngine`, the runner behind the :class:`real.protocol.Engine`
  protocol, in-process (no HTTP);
- :mod:`.http_server`: the SGLang-compatible HTTP server (``python -m real.serve``).
"""

from __future__ import annotations

from .engine import BatchEngine, EngineConfig, EngineRequest, Finished
from .model import ModelConfig, TinyDecoder


def build_engine(
    model_cfg: ModelConfig | None = None,
    engine_cfg: EngineConfig | None = None,
    seed: int = 0,
    checkpoint: str | None = None,
) -> BatchEngine:
    """A BatchEngine on a random-init model (``seed``) or a checkpoint directory."""
    model = (TinyDecoder.load(checkpoint) if checkpoint
             else TinyDecoder.random(model_cfg or ModelConfig(), seed))
    return BatchEngine(model, engine_cfg)


__all__ = [
    "BatchEngine",
    "EngineConfig",
    "EngineRequest",
    "Finished",
    "ModelConfig",
    "TinyDecoder",
    "build_engine",
]
