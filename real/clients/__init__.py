"""Engine clients: :class:`real.protocol.Engine` over the HTTP APIs of live engines.

- :mod:`.sglang_wire` / :mod:`.sglang`: SGLang's native API (one server, many, or sglang-router);
- :mod:`.vllm_wire` / :mod:`.vllm`: vLLM's OpenAI-compatible server;
- :mod:`.http`: what both share (retry backoff, request ids, error bodies, SSE lines);
- :mod:`.connect`: the client for a URL (``vllm+http://`` or SGLang), vocabulary probes, iteration
  stamps.

The wire modules do no I/O, so the contract tests check them against the engines' own schemas.
"""
