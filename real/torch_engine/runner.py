"""The asyncio driver of a :class:`BatchEngine`: one step loop, per-request event queues.

Steps run in a single worker thread so that the event loop stays responsive (HTTP streaming,
aborts, health checks) while torch computes. Every mutation of the engine (add, abort) is queued
and applied by the loop *between* steps, so the engine itself needs no locks.

Each submitted request gets a :class:`RequestHandle` whose queue receives ``TokenEvent`` (one per
generated token, in order) and finally one ``Finished``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from .engine import BatchEngine, EngineRequest, Finished


@dataclass(frozen=True)
class TokenEvent:
    token: int


@dataclass(eq=False)
class RequestHandle:
    """The caller's view of one request inside the runner."""

    request: EngineRequest
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    submitted: float = field(default_factory=time.monotonic)
    finished: Finished | None = None


class EngineRunner:
    """Owns a BatchEngine and drives it from asyncio."""

    def __init__(self, engine: BatchEngine, weight_version: str = "default") -> None:
        self.engine = engine
        self.weight_version = weight_version
        self._handles: dict[str, RequestHandle] = {}
        self._adds: deque[EngineRequest] = deque()
        self._aborts: deque[tuple[str, bool, asyncio.Future]] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine-step")
        self._closed = False
        self._recent: deque[tuple[float, int]] = deque(maxlen=64)  # (step end time, tokens)
        self.error: BaseException | None = None

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="engine-loop")

    async def close(self) -> None:
        self._closed = True
        self._wake.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._executor.shutdown(wait=True)

    @property
    def alive(self) -> bool:
        return self._task is not None and not self._task.done() and self.error is None

    # ---- commands --------------------------------------------------------------------------
    def submit(self, req: EngineRequest) -> RequestHandle:
        """Queue ``req``; raises ValueError for a request the engine can never serve."""
        if self._closed or not self.alive:
            raise RuntimeError("engine is not running")
        if req.rid in self._handles:
            raise ValueError(f"duplicate request id {req.rid!r}")
        self.engine.validate(req)
        handle = RequestHandle(req)
        self._handles[req.rid] = handle
        self._adds.append(req)
        self._wake.set()
        return handle

    async def abort(self, rid: str = "", abort_all: bool = False) -> int:
        """Abort by id prefix or everything; returns how many requests it ended."""
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._aborts.append((rid, abort_all, fut))
        self._wake.set()
        return await fut

    # ---- state -----------------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self.engine.running)

    @property
    def num_waiting(self) -> int:
        return len(self.engine.waiting) + len(self._adds)

    @property
    def num_in_flight(self) -> int:
        return len(self._handles)

    def gen_throughput(self) -> float:
        """Decode tokens/s over the recent steps."""
        if len(self._recent) < 2:
            return 0.0
        span = self._recent[-1][0] - self._recent[0][0]
        toks = sum(n for _, n in list(self._recent)[1:])
        return toks / span if span > 0 else 0.0

    # ---- the loop --------------------------------------------------------------------------
    def _apply_commands(self) -> None:
        while self._adds:
            req = self._adds.popleft()
            try:
                self.engine.add(req)
            except ValueError as exc:  # raced with validation; report as an abort
                self._finish(Finished(req.rid, [], len(req.prompt_ids),
                                      {"type": "abort", "message": str(exc), "status_code": 400}))
        while self._aborts:
            rid, abort_all, fut = self._aborts.popleft()
            ended = self.engine.abort(rid, abort_all)
            for f in ended:
                self._finish(f)
            if not fut.done():
                fut.set_result(len(ended))

    def _finish(self, f: Finished) -> None:
        handle = self._handles.pop(f.rid, None)
        if handle is not None:
            handle.finished = f
            handle.events.put_nowait(f)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while not self._closed:
                self._apply_commands()
                if not self.engine.has_work:
                    self._wake.clear()
                    if self._adds or self._aborts:
                        continue
                    await self._wake.wait()
                    continue
                out = await loop.run_in_executor(self._executor, self.engine.step)
                for rid, tok in out.new_tokens.items():
                    h = self._handles.get(rid)
                    if h is not None:
                        h.events.put_nowait(TokenEvent(tok))
                for f in out.finished:
                    self._finish(f)
                if out.kind == "decode":
                    self._recent.append((time.monotonic(), len(out.new_tokens)))
        except BaseException as exc:  # the engine died: end every request with its partial
            self.error = exc
            raise
        finally:
            self._abort_everything("engine stopped")

    def _abort_everything(self, message: str) -> None:
        for f in self.engine.abort(abort_all=True):
            self._finish(f)
        for rid in list(self._handles):
            h = self._handles[rid]
            self._finish(Finished(rid, list(h.request.output_ids), len(h.request.prompt_ids),
                                  {"type": "abort", "message": message, "status_code": 503}))
        while self._aborts:
            _, _, fut = self._aborts.popleft()
            if not fut.done():
                fut.set_result(0)
