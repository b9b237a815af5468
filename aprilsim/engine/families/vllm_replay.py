"""`VllmSteps` behind the trace driver: replays a recorded vLLM workload and compares each step."""

from __future__ import annotations

from itertools import chain
from typing import Any

from aprilsim.engine.families.trace_driver import Agreement, replay
from aprilsim.engine.families.traces import StepRecord, Trace
from aprilsim.engine.families.vllm_steps import VllmConfig, VllmSteps
from aprilsim.engine.families.workloads import (
    OUTPUT_SRC_BASE,
    STOP_TOKEN,
    STRIDE,
    TABLE_MASK,
    EngineLimits,
    token_table,
)

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
        self.table = token_table()
        # rid -> (its outputs' table offset, the output index of its stop token or -1):
        # `workloads.output_token`, unrolled
        self.outs: dict[int, tuple[int, int]] = {}

    def add(self, rid: int, prompt: list[int], max_tokens: int, target: int) -> None:
        stop_at = target - 1 if target < max_tokens else -1
        self.outs[rid] = ((OUTPUT_SRC_BASE + rid) * STRIDE, stop_at)
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
        table, outs = self.table, self.outs
        sampled = {}
        for rid, i in plan.samples:
            base, stop_at = outs[rid]
            sampled[rid] = STOP_TOKEN if i == stop_at else table[(base + i) & TABLE_MASK]
        finished = m.update(sampled)
        return StepRecord(tuple(chain.from_iterable(plan.scheduled)),
                          tuple(sorted(plan.preempted)), tuple(finished),
                          tuple(chain.from_iterable(plan.admitted)), m.num_free_blocks)


def replay_trace(trace: Trace) -> Agreement:
    """Replay one recorded vLLM trace through `VllmSteps`; every step compared."""
    return replay(trace, ModelAdapter(vllm_config(trace.engine)))
