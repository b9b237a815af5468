"""Live engines behind one async protocol, for running aprilsim's schedulers for real.

- :mod:`real.protocol`: the :class:`~real.protocol.Engine` protocol and its request/result types;
- :mod:`real.samples`: requests built from :class:`aprilsim.types.Sample` (replay mode);
- :mod:`real.clients.sglang_wire` / :mod:`real.clients.sglang`: SGLang's native HTTP API (one server, many,
  or sglang-router in front of them);
- :mod:`real.clients.vllm_wire` / :mod:`real.clients.vllm`: vLLM's OpenAI-compatible server
  (:class:`~real.clients.vllm.VLLMEngine`);
- :mod:`real.torch_engine`: the bundled continuous-batching engine on a small torch transformer,
  in-process (:class:`~real.torch_engine.local.LocalEngine`) or behind an SGLang-compatible HTTP
  server (``python -m real.serve``).

``aprilsim`` never imports ``real``; ``real`` imports only aprilsim's types.
"""

from .protocol import (
    Engine,
    GenerateRequest,
    GenerateResult,
    Progress,
    SamplingParams,
    ServerInfo,
    Timings,
    resume_request,
)
from .samples import request_from_sample

__all__ = [
    "Engine",
    "GenerateRequest",
    "GenerateResult",
    "Progress",
    "SamplingParams",
    "ServerInfo",
    "Timings",
    "request_from_sample",
    "resume_request",
]
