"""The bundled engine behind the :class:`real.protocol.Engine` protocol, in-process (no HTTP).

Useful for runners and benchmarks that want the live engine without a server; the HTTP path
(``python -m real.serve`` + :class:`real.clients.sglang.SGLangClient`) gives the same results.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from aprilsim.types import FinishReason

from ..clients.http import RidFactory
from ..clients.sglang_wire import parse_finish_reason
from ..protocol import (
    GenerateRequest,
    GenerateResult,
    Progress,
    ProgressCallback,
    ServerInfo,
    Timings,
    replay_finish_reason,
    stream_via_generate,
)
from .engine import BatchEngine, EngineRequest, Finished
from .runner import EngineRunner, TokenEvent


class LocalEngine:
    """An :class:`~real.protocol.Engine` driving a :class:`BatchEngine` in this process.

    Call :meth:`start` inside the event loop before use (``async with`` does it).
    """

    def __init__(self, engine: BatchEngine, weight_version: str = "default") -> None:
        self.runner = EngineRunner(engine, weight_version)
        self.new_rid = RidFactory()

    async def __aenter__(self) -> LocalEngine:
        self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def start(self) -> None:
        self.runner.start()

    async def close(self) -> None:
        await self.runner.close()

    def stream(self, request: GenerateRequest) -> AsyncIterator[Progress | GenerateResult]:
        return stream_via_generate(self, request)

    async def generate(
        self, request: GenerateRequest, on_progress: ProgressCallback | None = None
    ) -> GenerateResult:
        rid = self.new_rid()
        timings = Timings(submitted=time.monotonic())
        s = request.sampling
        ereq = EngineRequest(
            rid=rid, prompt_ids=list(request.prompt_ids),
            max_new_tokens=request.tokens_to_generate, ignore_eos=request.replay,
            stop_token_ids=() if request.replay else tuple(s.stop_token_ids),
            temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, seed=s.seed,
            priority=request.priority,
        )
        try:
            handle = self.runner.submit(ereq)
            timings.accepted = time.monotonic()  # queued on the engine (no HTTP in between)
        except (ValueError, RuntimeError) as exc:
            timings.finished = time.monotonic()
            return GenerateResult(rid, request, [], FinishReason.ABORT, timings, error=str(exc))
        output: list[int] = []
        while True:
            ev = await handle.events.get()
            if isinstance(ev, TokenEvent):
                if timings.first_token is None:
                    timings.first_token = time.monotonic()
                output.append(ev.token)
                if on_progress is not None:
                    on_progress(Progress(rid, (ev.token,), len(output)))
                continue
            assert isinstance(ev, Finished)
            timings.finished = time.monotonic()
            fin = parse_finish_reason(ev.reason)
            assert fin is not None
            code = fin.status_code
            error = fin.message if code is not None and code >= 400 else None
            reason = replay_finish_reason(request, len(ev.output_ids), fin.reason)
            return GenerateResult(
                rid, request, list(ev.output_ids), reason, timings, error=error,
                prompt_tokens=None if ev.queued else ev.prompt_tokens,
                abort_message=fin.message if fin.reason is FinishReason.ABORT else None,
                weight_version=self.runner.weight_version, worker="local",
            )

    async def abort_all(self) -> None:
        await self.runner.abort(abort_all=True)

    async def health(self) -> bool:
        return self.runner.alive

    async def server_info(self) -> ServerInfo:
        e = self.runner.engine
        return ServerInfo(
            max_running_requests=e.cfg.max_running_requests, kv_capacity_tokens=e.kv_budget,
            max_context_length=e.max_context, version="aprilsim-torch-local", workers=("local",),
        )

    async def weight_version(self) -> str | None:
        return self.runner.weight_version
