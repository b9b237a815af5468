"""In-process bundled engines for the runner (``aprilsim run --local N``), with pause and weight
sync.

:class:`LocalWorker` wraps :class:`real.torch_engine.local.LocalEngine` (the Engine protocol) and
adds what the runner needs around a weight update (:class:`real.protocol.WeightSync`) without
touching the engine: pausing gates the engine's step (the step loop idles between steps, in-flight
requests keep their KV and continue on resume), a checkpoint load runs on the engine's own step
thread (so it never overlaps a step), and the version label is the runner's.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from real.torch_engine import EngineConfig, ModelConfig, TinyDecoder, build_engine
from real.torch_engine.engine import BatchEngine, StepOutput
from real.torch_engine.local import LocalEngine


class _PausableEngine:
    """A BatchEngine seen through a gate: ``step`` idles while ``paused`` (everything else
    forwards)."""

    def __init__(self, engine: BatchEngine) -> None:
        self.__dict__["_engine"] = engine
        self.__dict__["paused"] = False

    def __getattr__(self, name: str):
        return getattr(self._engine, name)

    def __setattr__(self, name: str, value) -> None:
        if name == "paused":
            self.__dict__["paused"] = value
        else:
            setattr(self._engine, name, value)

    def step(self) -> StepOutput:
        if self.paused:
            time.sleep(0.002)  # the runner loop calls again; aborts and adds still apply between
            return StepOutput("idle")
        return self._engine.step()


@dataclass(frozen=True)
class LocalSpec:
    """What ``--local`` starts: a tiny random model and the engine limits (CPU-sized)."""

    vocab_size: int = 512
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    max_context: int = 1024
    max_running_requests: int = 64
    min_step_seconds: float = 0.0
    seed: int = 0
    enable_priority_scheduling: bool = True  # Submit.priority orders admission (SGLang's flag)


class LocalWorker:
    """One bundled engine in this process: Engine + WeightSync + a load report."""

    def __init__(self, spec: LocalSpec, name: str = "local") -> None:
        model_cfg = ModelConfig(vocab_size=spec.vocab_size, d_model=spec.d_model,
                                n_layers=spec.n_layers, n_heads=spec.n_heads,
                                max_context=spec.max_context)
        engine_cfg = EngineConfig(max_running_requests=spec.max_running_requests,
                                  min_step_seconds=spec.min_step_seconds,
                                  enable_priority_scheduling=spec.enable_priority_scheduling)
        self.engine = build_engine(model_cfg, engine_cfg, seed=spec.seed)
        self._gate = _PausableEngine(self.engine)
        self.inner = LocalEngine(self.engine)
        self.inner.runner.engine = self._gate  # type: ignore[assignment]
        self.name = name
        self.vocab_size = spec.vocab_size

    # ---- Engine --------------------------------------------------------------------------
    def start(self) -> None:
        self.inner.start()

    async def generate(self, request, on_progress=None):
        return await self.inner.generate(request, on_progress)

    def stream(self, request):
        return self.inner.stream(request)

    async def abort_all(self) -> None:
        await self.inner.abort_all()

    async def health(self) -> bool:
        return await self.inner.health()

    async def server_info(self):
        return await self.inner.server_info()

    async def weight_version(self) -> str | None:
        return await self.inner.weight_version()

    async def close(self) -> None:
        self._gate.paused = False
        await self.inner.close()

    # ---- WeightSync ----------------------------------------------------------------------
    async def update_weights(self, version: str, path: str | None = None) -> None:
        if path is not None:
            state = TinyDecoder.load(path).state_dict()
            runner = self.inner.runner
            loop = asyncio.get_running_loop()
            # the step thread is single: loading there cannot overlap a forward pass
            await loop.run_in_executor(runner._executor, self.engine.model.load_state_dict, state)
        self.inner.runner.weight_version = str(version)

    async def pause(self) -> bool:
        self._gate.paused = True
        return True

    async def resume(self) -> bool:
        self._gate.paused = False
        return True

    # ---- load report ---------------------------------------------------------------------
    def load(self) -> tuple[int, int]:
        """(running requests, KV tokens held) right now."""
        return len(self.engine.running), self.engine.used_tokens


async def start_local(n: int, spec: LocalSpec) -> list[LocalWorker]:
    """Start ``n`` in-process engines (same seed: the same model, as data-parallel replicas)."""
    workers = [LocalWorker(spec, name=f"local-{i}") for i in range(n)]
    for w in workers:
        w.start()
    return workers
