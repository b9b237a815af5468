"""Live engines behind one async protocol, for running aprilsim's schedulers for real.

- :mod:`real.protocol`: the :class:`~real.protocol.Engine` protocol and its request/result types;
- :mod:`real.samples`: requests built from :class:`aprilsim.types.Sample` (replay mode);
- :mod:`real.clients`: engine clients: SGLang's native HTTP API (:mod:`real.clients.sglang`; one
  server, many, or sglang-router in front of them), vLLM's OpenAI-compatible server
  (:class:`~real.clients.vllm.VLLMEngine`), what they share (:mod:`real.clients.http`) and the
  client for a URL (:func:`real.clients.connect.connect`);
- :mod:`real.torch_engine`: the bundled continuous-batching engine on a small torch transformer,
  in-process (:class:`~real.torch_engine.local.LocalEngine`) or behind an SGLang-compatible HTTP
  server (``python -m real.serve``);
- :mod:`real.runner`: the live driver of the rollout core and ``aprilsim run`` as a library
  (:mod:`real.runner.api`); :mod:`real.validate` and :mod:`real.calibrate`: the live side of
  ``aprilsim validate`` and ``aprilsim calibrate``.

``aprilsim`` never imports ``real`` (but for its lazily loaded commands); ``real`` imports
aprilsim's library, never its command group.
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
