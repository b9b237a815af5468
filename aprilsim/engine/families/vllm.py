"""vLLM's rules, as far as they are modelled today: the `vllm` family (a placeholder).

Today's approximation: SGLang's admission and retraction (`SGLangRules`) with vLLM's three
observable differences: a preempted request goes back to the *head* of the waiting queue (V1's
`Scheduler._preempt_request` prepends it), an aborted request is freed when the engine core next
reads its input queue, between steps (0 more decode steps, assumed), and its prefix cache (on by
default in V1) serves whole KV blocks only (`CacheConfig.DEFAULT_BLOCK_SIZE` 16 on GPU; the CPU
backend sets 128 unless `--block-size` is given). vLLM V1's own step scheduling (one token
budget shared by decodes and prefill chunks in the same step) is `vllm_steps.VllmSteps`, to be
wired in as this family's rules: a mixed-step family (`Rules.mixed_steps`, `Rules.plan_step`,
`Rules.stretch`) without touching the engines' callers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from aprilsim.engine.families.sglang import SGLangRules, check_params

if TYPE_CHECKING:
    from aprilsim.engine.families.protocol import Rules, Spec


@dataclass(frozen=True)
class VLLMFamily:
    """vLLM V1 (approximated): preempted requests to the head, aborts between steps, a prefix
    cache of 16-token blocks."""

    retract_to: str = "head"
    abort_steps: int = 0
    cache_block: int = 16

    def __post_init__(self) -> None:
        check_params(type(self), (), {"retract_to": self.retract_to,
                                       "abort_steps": self.abort_steps,
                                       "cache_block": self.cache_block})

    @property
    def name(self) -> str:
        """The registered name."""
        return "vllm"

    @property
    def live_prefix_cache(self) -> str:
        """vLLM V1's prefix caching is on by default and keeps blocks past their requests."""
        return "lru"

    def rules(self, spec: Spec) -> Rules:
        """SGLang-shaped rules with vLLM's parameters, for one engine of `spec`."""
        return SGLangRules(spec, "vllm", self.retract_to, self.abort_steps, self.cache_block)
