"""Engine adapters by URL, for the runner's ``--engines`` (and anything else that takes URLs).

``vllm+http://host:8000`` -> :class:`real.clients.vllm.VLLMEngine`; ``sglang+http://...`` or a plain
``http(s)://`` URL -> :class:`real.clients.sglang.SGLangClient` (SGLang, sglang-router, or the
bundled ``python -m real.serve``).
"""

from __future__ import annotations

from ..protocol import Engine

KINDS = ("sglang", "vllm")


def split_engine_url(spec: str) -> tuple[str, str]:
    """``(kind, url)`` of ``[kind+]http(s)://...``; the kind defaults to ``sglang``."""
    spec = spec.strip()
    head, plus, rest = spec.partition("+")
    if plus and head in KINDS and rest.startswith(("http://", "https://")):
        return head, rest.rstrip("/")
    return "sglang", spec.rstrip("/")


def connect(spec: str) -> Engine:
    """The adapter for ``spec`` (see :func:`split_engine_url`); no I/O until first used."""
    kind, url = split_engine_url(spec)
    if kind == "vllm":
        from .vllm import VLLMEngine

        return VLLMEngine(url)
    from .sglang import SGLangClient

    return SGLangClient(url)


# ------------------------------------------------------------------------------ probes
VOCAB_WORDS = ("vocab", "token id", "input_ids")  # what a 400 for an out-of-range id names
PROBE_TOP = 1 << 19  # the largest vocabulary the probe looks for (524,288 ids)


def reported_vocab(info) -> int | None:
    """The vocabulary an engine's server info states: the bundled server's
    ``/server_info`` ``model_config.vocab_size`` (SGLang and vLLM state none)."""
    raw = getattr(info, "raw", None) or {}
    for body in raw.get("workers") or ():
        v = (body.get("model_config") or {}).get("vocab_size") if isinstance(body, dict) else None
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


async def _accepts(engine: Engine, token_id: int) -> bool:
    """True when the engine generates from the one-token prompt ``[token_id]``; False when it
    refuses the id (a 400 naming the vocabulary); raises for any other failure."""
    from ..protocol import GenerateRequest

    res = await engine.generate(GenerateRequest(prompt_ids=(token_id,), max_new_tokens=1,
                                                replay_len=1))
    if not res.error:
        return True
    if any(w in res.error.lower() for w in VOCAB_WORDS):
        return False
    raise ValueError(f"the vocabulary probe failed: {res.error}")


async def probe_vocab(engine: Engine, low: int = 3) -> int:
    """The engine's vocabulary found by asking: the smallest id it refuses as a one-token
    prompt (doubling, then bisection; about 2 log2(V) one-token requests). Works on every
    engine that refuses out-of-range ids with a 400 (vLLM, SGLang, the bundled server)."""
    if not await _accepts(engine, low):
        raise ValueError(f"the engine refuses token id {low}: cannot probe its vocabulary")
    ok, hi = low, 2 * low + 30
    while await _accepts(engine, hi - 1):
        ok, hi = hi - 1, 2 * hi
        if hi > PROBE_TOP:
            raise ValueError(f"the engine accepts token id {ok}: no vocabulary limit found "
                             f"below {PROBE_TOP}; give --vocab-size")
    hi -= 1  # refused
    while hi - ok > 1:  # ok is accepted, hi is refused: the vocabulary is in (ok, hi]
        mid = (ok + hi) // 2
        if await _accepts(engine, mid):
            ok = mid
        else:
            hi = mid
    return ok + 1


async def engine_vocab(engine: Engine, given: int | None = None) -> tuple[int, str]:
    """(vocabulary size, where it came from): ``given`` (--vocab-size), else what the server
    states, else :func:`probe_vocab`."""
    if given:
        return int(given), "--vocab-size"
    v = reported_vocab(await engine.server_info())
    if v:
        return v, "the server's /server_info"
    return await probe_vocab(engine), "probed (the smallest token id the server refuses)"


# ------------------------------------------------------------------------------ stream stamps
class Stamped:
    """An engine whose requests' token arrivals are recorded (:class:`StreamLog` each, on the
    monotonic clock), so that its iterations can be rebuilt (:mod:`aprilsim.validate.reconstruct`)
    where it logs none. Everything else is the wrapped engine's."""

    def __init__(self, inner: Engine) -> None:
        from aprilsim.validate.reconstruct import StreamLog

        self.inner = inner
        self.logs: list = []
        self._log = StreamLog

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    async def generate(self, request, on_progress=None):
        import time

        lg = self._log(submitted=time.monotonic(), input_tokens=len(request.prompt_ids))
        self.logs.append(lg)

        def progress(p) -> None:
            lg.events.append((time.monotonic(), max(len(p.new_ids), 1)))
            if on_progress is not None:
                on_progress(p)
        try:
            return await self.inner.generate(request, progress)
        finally:
            lg.finished = time.monotonic()

    def stream(self, request):
        from ..protocol import stream_via_generate

        return stream_via_generate(self, request)

    async def abort_all(self) -> None:
        await self.inner.abort_all()

    async def health(self) -> bool:
        return await self.inner.health()

    async def server_info(self):
        return await self.inner.server_info()

    async def weight_version(self):
        return await self.inner.weight_version()

    async def close(self) -> None:
        await self.inner.close()

    def take(self) -> list:
        """The logs recorded so far, and a fresh start."""
        out, self.logs = self.logs, []
        return out


class StampedSync(Stamped):
    """A :class:`Stamped` engine that also syncs weights (the wrapped one does)."""

    async def update_weights(self, version: str, path: str | None = None) -> None:
        await self.inner.update_weights(version, path)

    async def pause(self) -> bool:
        return await self.inner.pause()

    async def resume(self) -> bool:
        return await self.inner.resume()


def stamped(engine: Engine) -> Stamped:
    """``engine`` with its token arrivals recorded (weight sync kept where it has it)."""
    from ..protocol import WeightSync

    return StampedSync(engine) if isinstance(engine, WeightSync) else Stamped(engine)


def unwrap(engine):
    """The engine under any :class:`Stamped` wrapper."""
    while isinstance(engine, Stamped):
        engine = engine.inner
    return engine


# ------------------------------------------------------------------------------ families
BUNDLED_VERSION_PREFIX = "aprilsim-torch"  # the bundled engine's server version, HTTP or in-process


def engine_family(engine, version: str | None = None) -> str:
    """The family whose rules an engine follows (``aprilsim.engine.families``, by name):
    ``"bundled"`` when its server version says so (``python -m real.serve`` behind the SGLang
    client, or in-process), else the client's own ``family`` (``"vllm"``), else ``"sglang"``."""
    if (version or "").startswith(BUNDLED_VERSION_PREFIX):
        return "bundled"
    return getattr(unwrap(engine), "family", None) or "sglang"

