"""A loopback HTTP proxy in front of a bundled server that injects faults into /generate.

Faults apply to the first ``n`` /generate requests it sees (counted in ``seen``):

- ``status_503``: answer 503 with an SGLang-style error body instead of forwarding;
- ``cut_after``: forward the stream but end it after that many chunks, with no final chunk;
- ``error_chunk``: after one forwarded chunk, send ``data: {"error": {...}}`` with this code.

Everything else (``/server_info``, ``/abort_request``, ``/v1/loads``...) is forwarded unchanged.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass

import aiohttp
from aiohttp import web


@dataclass
class Faults:
    n: int = 0
    status_503: bool = False
    cut_after: int | None = None
    error_chunk: int | None = None
    seen: int = 0


class FaultProxy:
    def __init__(self, upstream: str, faults: Faults) -> None:
        self.upstream = upstream
        self.faults = faults
        self.app = web.Application()
        self.app.router.add_route("*", "/{tail:.*}", self.handle)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.url = ""

    async def __aenter__(self) -> FaultProxy:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self._session = aiohttp.ClientSession()
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc) -> None:
        await self._runner.cleanup()
        await self._session.close()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        target = self.upstream + request.path_qs
        faulty = False
        if request.path == "/generate":
            self.faults.seen += 1
            faulty = self.faults.seen <= self.faults.n
        if faulty and self.faults.status_503:
            return web.json_response({"error": {"message": "Service overloaded", "code": 503}},
                                     status=503)
        async with self._session.request(request.method, target, data=body,
                                         headers={"Content-Type": "application/json"}) as up:
            if request.path != "/generate" or up.content_type != "text/event-stream":
                return web.Response(body=await up.read(), status=up.status,
                                    content_type=up.content_type)
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            chunks = 0
            async for line in up.content:
                if not line.strip():
                    continue
                await resp.write(line + b"\n")
                chunks += 1
                if faulty and self.faults.cut_after is not None and chunks >= self.faults.cut_after:
                    break  # the stream just ends: no final chunk, no [DONE]
                if faulty and self.faults.error_chunk is not None:
                    err = {"error": {"message": "injected failure",
                                     "code": self.faults.error_chunk}}
                    await resp.write(b"data: " + json.dumps(err).encode() + b"\n\n")
                    break
            # Closing `up` early drops the upstream connection; the server aborts that request.
            await resp.write_eof()
            return resp
