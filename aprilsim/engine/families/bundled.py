"""The bundled torch engine's rules (`real/torch_engine`): the `bundled` family.

It schedules as SGLang 0.5.23 does (`real/torch_engine/engine.py`: FCFS admission under
`PrefillAdder`'s reserve, the decaying new-token ratio, retraction of the fewest-generated
requests appended to the queue), so its rules are `SGLangRules` with its own parameters: no
prefix cache at all, and an abort that lands between steps (its asyncio driver applies aborts
between two `BatchEngine.step` calls, never during one: the step in flight completes, no more).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from aprilsim.engine.families.sglang import SGLangRules, check_params

if TYPE_CHECKING:
    from aprilsim.engine.families.protocol import Rules, Spec


@dataclass(frozen=True)
class BundledFamily:
    """The bundled engine: retracted requests appended (as SGLang), aborts applied between steps
    (0 more decode steps), token-level grain (moot: it keeps no prefix cache)."""

    retract_to: str = "tail"
    abort_steps: int = 0
    cache_block: int = 1

    def __post_init__(self) -> None:
        check_params(type(self), (), {"retract_to": self.retract_to,
                                       "abort_steps": self.abort_steps,
                                       "cache_block": self.cache_block})

    @property
    def name(self) -> str:
        """The registered name."""
        return "bundled"

    @property
    def live_prefix_cache(self) -> str:
        """The bundled engine keeps no prefix cache."""
        return "none"

    @property
    def live_accept_is_arrival(self) -> bool:
        """The bundled server answers after it queued the request on its engine."""
        return True

    def rules(self, spec: Spec) -> Rules:
        """SGLang's rules with the bundled engine's parameters, for one engine of `spec`."""
        return SGLangRules(spec, "bundled", self.retract_to, self.abort_steps, self.cache_block)
