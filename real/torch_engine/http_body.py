"""Request bodies and strict JSON of the bundled HTTP server (and its OpenAI routes).

A body is read within the server's read timeout, decoded (gzip/deflate/identity), bounded in size
(:data:`MAX_BODY_BYTES`) and nesting (:data:`MAX_JSON_DEPTH`) and checked for lone surrogates;
every JSON written is strict (non-finite numbers become ``null``). Shared by
:mod:`.http_server` and :mod:`.openai_api`, which import it and not each other.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import zlib

import aiohttp
from aiohttp import web

from .sampling import ParamError

READ_TIMEOUT_KEY = web.AppKey("read_timeout_s", float)
MAX_JSON_DEPTH = 64  # deeper bodies get a 400 (no SGLang request nests past 5)
MAX_BODY_BYTES = 64 * 1024 * 1024  # also the most a compressed body may inflate to
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
# U+D800..U+DFFF written as raw bytes (ED A0..BF xx): invalid UTF-8, which json.loads on bytes
# still decodes (it uses "surrogatepass"), so a lone surrogate reaches the tokenizer
_SURROGATE_BYTES = re.compile(rb"\xed[\xa0-\xbf]")


class BodyError(Exception):
    """A request body the server cannot read: ``status`` (400, 408, 413, 415) and a message;
    ``gone``: the client disconnected while sending it (nobody reads the answer)."""

    def __init__(self, status: int, message: str, gone: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.gone = gone


def strict_bool(body: dict, key: str, default: bool = False) -> bool:
    """``body[key]`` as a JSON boolean: ParamError (400) for anything else (the string "yes" or
    "false", 1), where ``bool()`` would have read "false" as true."""
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ParamError(key, f"{key}: expected true or false, got {value!r}"[:200])
    return value


def _finite(obj: object) -> object:
    """``obj`` with every non-finite float replaced by None (strict JSON has no NaN)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def dumps(obj: object) -> str:
    """Strict JSON: a non-finite number anywhere is written as ``null``, never as bare NaN."""
    try:
        return json.dumps(obj, allow_nan=False)
    except ValueError:
        return json.dumps(_finite(obj), allow_nan=False)


def json_response(body: object, status: int = 200) -> web.Response:
    return web.json_response(body, status=status, dumps=dumps)


def _depth_ok(raw: bytes, limit: int) -> bool:
    """True when brackets in ``raw`` nest at most ``limit`` deep (strings skipped)."""
    depth = 0
    in_str = esc = False
    for b in raw:
        if in_str:
            if esc:
                esc = False
            elif b == 0x5C:  # backslash
                esc = True
            elif b == 0x22:
                in_str = False
        elif b == 0x22:
            in_str = True
        elif b in (0x5B, 0x7B):
            depth += 1
            if depth > limit:
                return False
        elif b in (0x5D, 0x7D):
            depth -= 1
    return True


def _lone_surrogate(obj: object) -> str | None:
    """The first string (key or value) of ``obj`` that is not valid Unicode, else None."""
    stack = [obj]
    while stack:
        o = stack.pop()
        if isinstance(o, str):
            try:
                o.encode("utf-8")
            except UnicodeEncodeError:
                return o
        elif isinstance(o, dict):
            stack.extend(o.keys())
            stack.extend(o.values())
        elif isinstance(o, list):
            stack.extend(x for x in o if isinstance(x, (str, list, dict)))
    return None


def decode_body(raw: bytes, encoding: str) -> bytes:
    """Undo ``Content-Encoding`` (gzip, deflate, identity; listed order); BodyError otherwise."""
    codings = [c.strip().lower() for c in encoding.split(",") if c.strip()]
    for coding in reversed(codings):
        if coding == "identity":
            continue
        if coding not in ("gzip", "x-gzip", "deflate"):
            raise BodyError(415, f"Content-Encoding {coding!r} is not supported (use gzip, "
                                 "deflate or identity)")
        wbits = 16 + zlib.MAX_WBITS if coding != "deflate" else zlib.MAX_WBITS
        try:
            d = zlib.decompressobj(wbits)
            out = d.decompress(raw, MAX_BODY_BYTES + 1)
            if len(out) > MAX_BODY_BYTES or d.unconsumed_tail:
                raise BodyError(413, f"request body inflates past {MAX_BODY_BYTES} bytes")
            if not d.eof:
                raise zlib.error("truncated stream")
        except zlib.error as exc:
            if coding == "deflate":  # raw deflate without the zlib header, as some clients send
                try:
                    out = zlib.decompress(raw, -zlib.MAX_WBITS)
                except zlib.error:
                    raise BodyError(400, f"request body is not valid {coding}: {exc}") from None
            else:
                raise BodyError(400, f"request body is not valid {coding}: {exc}") from None
        raw = out
    return raw


async def read_body(request: web.Request) -> bytes:
    """The request's body, decoded; BodyError (408) when it does not arrive in time. The app
    must be served with ``auto_decompress=False`` (``real.serve`` does), or aiohttp decodes
    first."""
    timeout = request.app.get(READ_TIMEOUT_KEY) or 0.0
    timeout = timeout if timeout > 0 else None
    try:
        raw = await asyncio.wait_for(request.read(), timeout)
    except asyncio.TimeoutError:
        raise BodyError(408, f"request body not received within {timeout:g} s") from None
    except web.HTTPRequestEntityTooLarge as exc:
        raise BodyError(413, exc.text or "request body too large") from None
    except aiohttp.ClientPayloadError as exc:
        raise BodyError(400, f"request body could not be read: {exc}") from None
    except ConnectionResetError:  # an ordinary client disconnect: no ERROR, no traceback
        raise BodyError(400, "client disconnected while sending the body", gone=True) from None
    encoding = request.headers.get("Content-Encoding", "")
    return decode_body(raw, encoding) if encoding else raw


async def read_json(request: web.Request, required: bool = True) -> object:
    """The request's JSON body; ParamError (400) when it is not JSON, BodyError (4xx) when it
    cannot be read (timeout, encoding, nesting past MAX_JSON_DEPTH, lone surrogates)."""
    raw = await read_body(request)
    if not raw.strip():
        if required:
            raise ParamError("body", "request body must be JSON")
        return {}
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and not _depth_ok(raw, MAX_JSON_DEPTH):
        raise ParamError("body", f"request body nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        body = json.loads(raw)
    except RecursionError:
        raise ParamError("body", "request body nests too deep") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ParamError("body", f"request body is not valid JSON: {exc}") from None
    if _SURROGATE_ESCAPE.search(raw) or _SURROGATE_BYTES.search(raw):  # only then can a
        # string be invalid Unicode
        bad = _lone_surrogate(body)
        if bad is not None:
            raise ParamError("body", f"request body has a string with a lone surrogate: "
                                     f"{bad!r}"[:200])
    return body
