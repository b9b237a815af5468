"""Tiny blocking HTTP helpers for the bundled-server tests (stdlib only)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request


def call(url: str, path: str, body: object = None, method: str | None = None,
         raw: bytes | None = None, headers: dict | None = None,
         timeout: float = 30) -> tuple[int, object]:
    """``(status, parsed JSON or text)``; never raises for an HTTP error status."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(url + path, data=data,
                                 method=method or ("POST" if data else "GET"),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, payload = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, payload = e.code, e.read()
    try:
        return status, json.loads(payload) if payload else None
    except ValueError:
        return status, payload.decode(errors="replace")


def stream(url: str, path: str, body: dict, timeout: float = 30) -> list[dict]:
    """The ``data:`` objects of an SSE response, up to ``[DONE]`` (which must come)."""
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    out: list[dict] = []
    with urllib.request.urlopen(req, timeout=timeout) as r:
        assert r.status == 200
        for line in r:
            line = line.strip()
            if not line:
                continue
            assert line.startswith(b"data: "), line
            if line == b"data: [DONE]":
                return out
            out.append(json.loads(line[6:]))
    raise AssertionError("stream ended without [DONE]")


def internal(url: str) -> dict:
    """The engine's internal state from /server_info."""
    return call(url, "/server_info")[1]["internal_states"][0]
