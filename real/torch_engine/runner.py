"""The asyncio driver of a :class:`BatchEngine`: one step loop, per-request event queues.

Steps run in a single worker thread so that the event loop stays responsive (HTTP streaming,
aborts, health checks) while torch computes. Every mutation of the engine (add, abort, weight
load, memory release) is applied between steps: commands are queued and applied by the loop, and
exclusive operations run in the same one-thread executor as the steps.

Each submitted request gets a :class:`RequestHandle` whose queue receives ``TokenEvent`` (one per
generated token, in order) and finally one ``Finished``.

The loop cannot die of a request: a failure inside one request's sampling fails that request
(:class:`BatchEngine` handles it), and any other exception in a step is logged with its traceback,
ends the requests of that batch with an error finish reason (HTTP 500 semantics), and the loop
goes on serving. Generation can be paused (SGLang's ``pause_generation`` modes) and the engine's
memory released and resumed (``release_memory_occupation``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import traceback
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from .engine import BatchEngine, EngineRequest, Finished
from .model import TinyDecoder

log = logging.getLogger(__name__)
T = TypeVar("T")
MEMORY_TAGS = ("kv_cache", "weights")


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

    def __init__(self, engine: BatchEngine, weight_version: str = "default",
                 iteration_log: str | Path | None = None) -> None:
        self.engine = engine
        self.weight_version = weight_version
        self._handles: dict[str, RequestHandle] = {}
        self._adds: deque[EngineRequest] = deque()
        self._aborts: deque[tuple[str, bool, asyncio.Future]] = deque()
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()  # held by a step (with its commands) or an exclusive op
        self._task: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine-step")
        self._closed = False
        self._recent: deque[tuple[float, int]] = deque(maxlen=64)  # (step end time, tokens)
        self.error: BaseException | None = None
        self.step_errors = 0
        self.paused = False
        self.released: set[str] = set()
        self._weights_backup: dict | None = None
        self._iteration_log = Path(iteration_log) if iteration_log else None
        self._logged_seq = 0

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

    async def exclusive(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` in the step thread, between two steps (engine state is safe to change)."""
        async with self._lock:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    async def pause(self, mode: str = "abort") -> None:
        """SGLang's pause_generation: "abort" ends every request, "retract" moves the running
        ones back to the queue (their KV freed), "in_place" keeps them as they are."""
        if mode not in ("abort", "retract", "in_place"):
            raise ValueError(f"mode must be abort, retract or in_place, got {mode!r}")
        self.paused = True
        if mode == "abort":
            await self.abort(abort_all=True)
        elif mode == "retract":
            await self.exclusive(self.engine.retract_all)

    def resume(self) -> None:
        self.paused = False
        self._wake.set()

    async def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no request is in flight; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._handles or self.engine.has_work:
            if deadline is not None and time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.01)
        return True

    async def load_weights(self, path: str) -> None:
        """Load a checkpoint directory (TinyDecoder.save) into the served model."""
        def load() -> None:
            model = TinyDecoder.load(path)
            if "weights" in self.released:  # weights are off the device: update the host copy
                if model.cfg != self.engine.model.cfg:
                    raise ValueError(f"checkpoint config {model.cfg} does not match the served "
                                     f"model {self.engine.model.cfg}")
                self._weights_backup = {k: v.detach().clone()
                                        for k, v in model.state_dict().items()}
            else:
                self.engine.load_weights(model)

        await self.exclusive(load)

    async def release_memory(self, tags: list[str] | None) -> None:
        """Free the KV cache and/or move the weights out (colocated training); no generation
        runs until :meth:`resume_memory` brings them back. Running requests are retracted."""
        tags = list(tags or MEMORY_TAGS)
        bad = [t for t in tags if t not in MEMORY_TAGS]
        if bad:
            raise ValueError(f"unknown memory tag {bad[0]!r} (known: {', '.join(MEMORY_TAGS)})")

        def release() -> None:
            e = self.engine
            if "kv_cache" in tags and "kv_cache" not in self.released:
                e.retract_all()
                e.pool.drop()
            if "weights" in tags and "weights" not in self.released:
                self._weights_backup = {k: v.detach().to("cpu", copy=True)
                                        for k, v in e.model.state_dict().items()}
                e.model.to("meta")
            self.released.update(tags)

        await self.exclusive(release)

    async def resume_memory(self, tags: list[str] | None) -> None:
        tags = list(tags or MEMORY_TAGS)
        bad = [t for t in tags if t not in MEMORY_TAGS]
        if bad:
            raise ValueError(f"unknown memory tag {bad[0]!r} (known: {', '.join(MEMORY_TAGS)})")

        def resume() -> None:
            e = self.engine
            if "weights" in tags and "weights" in self.released:
                e.model.to_empty(device=e.device)
                e.model.load_state_dict(self._weights_backup or {})
                e.model.to(dtype=e.dtype)
                self._weights_backup = None
            if "kv_cache" in tags and "kv_cache" in self.released:
                e.pool.restore()
            self.released.difference_update(tags)

        await self.exclusive(resume)
        self._wake.set()

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

    @property
    def can_step(self) -> bool:
        return not self.paused and not self.released

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
            except ValueError as exc:  # raced with validation; report as a 400
                self._finish(Finished(req.rid, [], len(req.prompt_ids),
                                      {"type": "abort", "message": str(exc), "status_code": 400}))
            except Exception as exc:
                log.error("adding request %s failed:\n%s", req.rid, traceback.format_exc())
                self._finish(Finished(req.rid, [], len(req.prompt_ids),
                                      {"type": "abort", "message": f"Internal server error: {exc}",
                                       "status_code": 500}))
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
                try:
                    async with self._lock:
                        self._apply_commands()
                        runnable = self.engine.has_work and self.can_step
                        if runnable:
                            out = await loop.run_in_executor(self._executor, self.engine.step)
                    if not runnable:
                        self._wake.clear()
                        if self._adds or self._aborts or (self.engine.has_work and self.can_step):
                            continue
                        await self._wake.wait()
                        continue
                except Exception as exc:  # a bug in a step: fail its batch, keep serving
                    async with self._lock:
                        await self._recover(exc)
                    continue
                for rid, tok in out.new_tokens.items():
                    h = self._handles.get(rid)
                    if h is not None:
                        h.events.put_nowait(TokenEvent(tok))
                for f in out.finished:
                    self._finish(f)
                if out.kind == "decode":
                    self._recent.append((time.monotonic(), len(out.new_tokens)))
                if self._iteration_log is not None:
                    self._write_iterations()
        except BaseException as exc:  # cancelled or interpreter exit: end every request
            self.error = exc
            raise
        finally:
            self._abort_everything("engine stopped")

    async def _recover(self, exc: Exception) -> None:
        self.step_errors += 1
        log.error("engine step failed; failing its batch and continuing:\n%s",
                  "".join(traceback.format_exception(exc)))
        message = f"Internal server error: {type(exc).__name__}: {exc}"
        try:
            batch = [r.rid for r in self.engine.running]
            for rid in batch:
                f = self.engine.fail(rid, message)
                if f is not None:
                    self._finish(f)
        except Exception:  # the engine state itself is broken: fail everything in flight
            log.error("could not fail the batch cleanly:\n%s", traceback.format_exc())
            for rid in list(self._handles):
                h = self._handles[rid]
                self._finish(Finished(rid, list(h.request.output_ids), len(h.request.prompt_ids),
                                      {"type": "abort", "message": message, "status_code": 500}))
        await asyncio.sleep(0)

    def _write_iterations(self) -> None:
        assert self._iteration_log is not None
        recs = [r for r in self.engine.iterations if r.seq > self._logged_seq]
        if not recs:
            return
        with self._iteration_log.open("a") as fh:
            for r in recs:
                fh.write(json.dumps(r.to_dict()) + "\n")
        self._logged_seq = recs[-1].seq

    def _abort_everything(self, message: str) -> None:
        with contextlib.suppress(Exception):
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
