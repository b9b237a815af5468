"""`VllmSteps` behind the trace driver: replays a recorded vLLM workload and compares each step."""

from __future__ import annotations

from typing import Any

from aprilsim.engine.families.trace_driver import Agreement, replay
from aprilsim.engine.families.traces import StepRecord, Trace
from aprilsim.engine.families.vllm_steps import VllmConfig, VllmSteps
from aprilsim.engine.families.workloads import STOP_TOKEN, EngineLimits, output_token

BLOCK_SIZE = 16


def vllm_engine(limits: EngineLimits) -> dict[str, Any]:
    """vLLM's configuration for a workload's limits (the trace's ``engine``): KV blocks of 16
    tokens plus vLLM's null block."""
    return {"num_blocks": limits.kv_tokens // BLOCK_SIZE + 1, "block_size": BLOCK_SIZE,
            "max_num_seqs": limits.max_running,
            "max_num_batched_tokens": limits.step_tokens,
            "max_model_len": limits.max_model_len,
            "enable_prefix_caching": limits.prefix_caching, "watermark": limits.watermark,
            "scheduler_reserve_full_isl": limits.reserve_full_prompt}


def vllm_config(engine: dict[str, Any]) -> VllmConfig:
    """The model's config from a trace's ``engine``."""
    return VllmConfig(**engine)


class ModelAdapter:
    """`VllmSteps` as the driver's `EngineAdapter`, with the stub model's outputs."""

    def __init__(self, config: VllmConfig) -> None:
        self.model = VllmSteps(config)
        self.caps: dict[int, tuple[int, int]] = {}  # rid -> (max_tokens, target)

    def add(self, rid: int, prompt: list[int], max_tokens: int, target: int) -> None:
        self.caps[rid] = (max_tokens, target)
        self.model.add(rid, prompt, max_tokens, STOP_TOKEN)

    def abort(self, rid: int) -> tuple[list[int], int] | None:
        m = self.model
        if rid not in m.requests:
            return None
        got = (list(m.tokens(rid)), m.num_output(rid))
        m.abort(rid)
        return got

    def has_work(self) -> bool:
        return self.model.has_work()

    def step(self) -> StepRecord:
        m = self.model
        plan = m.schedule()
        sampled = {}
        for rid in plan.samples:
            cap, target = self.caps[rid]
            sampled[rid] = output_token(rid, m.num_output(rid), target, cap)
        finished = m.update(sampled)
        return StepRecord(tuple(x for p in plan.scheduled for x in p),
                          tuple(sorted(plan.preempted)), tuple(finished),
                          tuple(x for p in plan.admitted for x in p), m.num_free_blocks)


def replay_trace(trace: Trace) -> Agreement:
    """Replay one recorded vLLM trace through `VllmSteps`; every step compared."""
    return replay(trace, ModelAdapter(vllm_config(trace.engine)))
