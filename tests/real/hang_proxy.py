"""A fault proxy whose first ``n`` generate streams go silent after a few chunks (a timeout)."""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp import web
from fault_proxy import FaultProxy, Faults


class HangProxy(FaultProxy):
    """Forwards everything; the first ``n`` /generate streams stop after ``after_chunks`` chunks
    and hold the connection open for ``hang_s`` (the client's read timeout fires first)."""

    def __init__(self, upstream: str, n: int, after_chunks: int = 3, hang_s: float = 2.0) -> None:
        super().__init__(upstream, Faults())
        self.n, self.after_chunks, self.hang_s = n, after_chunks, hang_s
        self.hung = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.path != "/generate" or self.hung >= self.n:
            return await super().handle(request)
        self.hung += 1
        body = await request.read()
        async with self._session.post(self.upstream + "/generate", data=body,
                                      headers={"Content-Type": "application/json"}) as up:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            chunks = 0
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                async for line in up.content:
                    if not line.strip():
                        continue
                    await resp.write(line + b"\n")
                    chunks += 1
                    if chunks >= self.after_chunks:
                        break
                await asyncio.sleep(self.hang_s)
            return resp
