"""What a live command is asked to do, as typed values: where the engines are and how to run.

``aprilsim run`` and ``aprilsim validate`` build these from their flags and hand them to the
library (:mod:`real.runner.api`, :mod:`real.validate`); a script builds them directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

# imports nothing heavy: the click commands import it to parse their flags before any run

DEFAULT_PROGRESS_DEADLINE_S = 60.0  # no token for this long while holding requests: health check
DEFAULT_STALLED_AFTER = 3  # consecutive healthy deadlines without a token: then treated as dead
EXIT_ENGINES_GONE, EXIT_INTERRUPTED = 1, 130  # `aprilsim run`'s exit codes besides 0 and 2
LOCAL_MAX_LEN = 64  # --local scales the scenario so that max_response_len is about this


def local_scale(max_response_len: int) -> float:
    """The default length scale of ``--local``: max_response_len becomes about LOCAL_MAX_LEN."""
    return min(1.0, LOCAL_MAX_LEN / max_response_len)


@dataclass(frozen=True)
class EngineTarget:
    """The engines of a run: ``local`` bundled ones started in this process, a list of engine
    URLs (``vllm+http://...`` for vLLM, else SGLang or ``python -m real.serve``), or one
    sglang-router URL; exactly one of the three.

    ``vocab_size``: the engines' vocabulary (default: what the server states, else probed).
    ``progress_deadline_s``: an engine holding requests that streams nothing this long is
    health-checked (0: never); ``stalled_after`` such deadlines in a row answered healthy, still
    without a token, and it is treated as dead (0: never). ``local_step_s`` pads every step of
    the local engines (tests).
    """

    local: int | None = None
    engines: tuple[str, ...] = ()
    router: str | None = None
    vocab_size: int | None = None
    progress_deadline_s: float = DEFAULT_PROGRESS_DEADLINE_S
    stalled_after: int = DEFAULT_STALLED_AFTER
    local_step_s: float = 0.0

    def __post_init__(self) -> None:
        given = sum((self.local is not None, bool(self.engines), self.router is not None))
        if given != 1:
            raise ValueError("give exactly one of --local N, --engines URL,... or --router URL")
        if self.local is not None and self.local < 1:
            raise ValueError(f"local: {self.local} engines; give at least 1")

    @classmethod
    def from_flags(cls, *, local: int | None = None, engines: str | None = None,
                   router: str | None = None, **rest) -> EngineTarget:
        """From the command's flags: ``engines`` is one comma-separated string."""
        urls = tuple(u.strip() for u in (engines or "").split(",") if u.strip())
        if engines is not None and not urls:
            raise ValueError("--engines: no URL given")
        return cls(local=local, engines=urls, router=router, **rest)

    @property
    def urls(self) -> tuple[str, ...]:
        """The URLs the run connects to (none for local engines)."""
        return self.engines or ((self.router,) if self.router else ())


@dataclass(frozen=True)
class FreeMode:
    """Free mode: prompts from a file, lengths from EOS, rewards from a verifier (default toy)."""

    prompts: Path
    reward: str | None = None  # module:function(prompt, output_ids, sample), or "toy"
    eos_ids: tuple[int, ...] = (2,)
    lengths_out: Path | None = None  # observed lengths as JSONL, for `aprilsim fit`


@dataclass(frozen=True)
class RunOptions:
    """``aprilsim run``'s options: the engines, the length scale, the workload seed, sampling
    temperature, free mode (else replay), a trainer callable (module:function(groups, step))
    instead of the modelled sleep, weights loaded on every update, and the trace/timeline files
    per scheduler (``{scheduler: {"trace" | "timeline": path}}``)."""

    target: EngineTarget
    scale: float = 1.0
    seed: int | None = None
    temperature: float = 1.0
    free: FreeMode | None = None
    trainer: str | None = None
    checkpoint: str | None = None
    outputs: dict[str, dict[str, Path]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0.0 < self.scale <= 1.0:
            raise ValueError(f"scale {self.scale}: must lie in (0, 1]")


__all__ = ["DEFAULT_PROGRESS_DEADLINE_S", "DEFAULT_STALLED_AFTER", "EXIT_ENGINES_GONE",
           "EXIT_INTERRUPTED", "LOCAL_MAX_LEN",
           "EngineTarget", "FreeMode", "RunOptions", "local_scale"]
