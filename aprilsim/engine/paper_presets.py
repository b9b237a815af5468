"""Engine presets for the APRIL paper's setups: each a roofline estimate, derived in the open.

The APRIL repository's scripts (RLsys-Foundation/APRIL `scripts/partial_rollout/`) run Qwen3-4B and
DeepSeek-R1-Distill-Qwen-1.5B on 8 AMD MI300X (`HIP_VISIBLE_DEVICES=0,...,7`, a ROCm image) as 4
SGLang engines of TP 2, with `--sglang-mem-fraction-static 0.6`. None of these numbers is a
measurement: each is `estimate(model, gpu, tp)`, with the model's shape from its published config
and the GPU's from its datasheet, and efficiencies stated below. Calibrate against your own engine
with `aprilsim calibrate` to replace them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# plain numbers, no EngineSpec: aprilsim.engine.cost builds the specs from them (no import cycle)
Spec = dict[str, Any]


@dataclass(frozen=True)
class ModelShape:
    """What decode cost depends on: parameters, layers, KV heads, head size, attention width."""

    name: str
    params: float  # all weights, embeddings included
    layers: int
    kv_heads: int
    head_dim: int
    q_width: int  # query heads x head size (causal prefill attention)
    source: str


@dataclass(frozen=True)
class GpuShape:
    """A GPU's datasheet figures and the efficiencies an estimate assumes on it."""

    name: str
    hbm_bytes_s: float
    bf16_flops: float
    memory_bytes: float
    weight_eff: float  # share of HBM bandwidth reached reading weights in decode
    kv_eff: float  # ... reading KV in decode attention
    matmul_eff: float  # share of dense bf16 FLOP/s in decode matmuls
    overhead_s: float  # per iteration: launches, TP all-reduce, sampling, scheduler
    source: str


QWEN3_4B = ModelShape(
    "Qwen3-4B", 4.0e9, 36, 8, 128, 32 * 128,
    "Qwen/Qwen3-4B config.json: 36 layers, 32 query / 8 KV heads of 128, 4.0e9 parameters",
)
R1_DISTILL_QWEN_1_5B = ModelShape(
    "DeepSeek-R1-Distill-Qwen-1.5B", 1.78e9, 28, 2, 128, 12 * 128,
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B config.json (Qwen2.5-Math-1.5B): 28 layers, 12 "
    "query / 2 KV heads of 128, hidden 1536, untied embeddings: 1.78e9 parameters",
)
H100_SXM = GpuShape(
    "H100 SXM", 3.35e12, 989e12, 80e9, 0.8, 0.7, 0.5, 3.0e-3,
    "NVIDIA H100 SXM datasheet: 3.35 TB/s HBM3, 989 TFLOP/s dense bf16, 80 GB; the efficiencies "
    "of the qwen3-4b-h100-tp2 preset",
)
MI300X = GpuShape(
    "MI300X", 5.3e12, 1307e12, 192e9, 0.6, 0.55, 0.4, 4.0e-3,
    "AMD Instinct MI300X datasheet: 5.3 TB/s HBM3, 1,307 TFLOP/s dense bf16, 192 GB; efficiencies "
    "assumed below the H100's (ROCm decode kernels and RCCL all-reduce reach less of the peak at "
    "small per-GPU shapes: weights 60 %, KV 55 %, matmuls 40 %, 4 ms per iteration), an estimate "
    "with no published SGLang decode profile for these models behind it",
)


def estimate(model: ModelShape, gpu: GpuShape, tp: int, *, mem_fraction: float,
             reserve_bytes: float, label: str) -> Spec:
    """A roofline engine spec (EngineSpec's fields): decode reads each GPU's weight shard and KV
    once per iteration; prefill is matmul- and attention-bound."""
    weights = 2.0 * model.params / tp  # bf16 bytes per GPU
    kv_heads = max(1, model.kv_heads // tp)  # a KV head is replicated when tp > kv_heads
    kv_bytes = 2 * model.layers * kv_heads * model.head_dim * 2  # K and V, bf16, per GPU
    flops_per_token = 2 * model.params / tp
    a = weights / (gpu.weight_eff * gpu.hbm_bytes_s) + gpu.overhead_s
    b = flops_per_token / (gpu.matmul_eff * gpu.bf16_flops) + 1.2e-5
    c = kv_bytes / (gpu.kv_eff * gpu.hbm_bytes_s)
    p1 = flops_per_token / ((gpu.matmul_eff + 0.1) * gpu.bf16_flops)
    p2 = (2 * 2 * model.layers * model.q_width / tp) / (gpu.matmul_eff * gpu.bf16_flops) / 2
    kv_capacity = int((gpu.memory_bytes * mem_fraction - weights - reserve_bytes) / kv_bytes)
    return dict(
        cost=dict(a=a, b=b, c=c, p0=0.01, p1=p1, p2=p2),
        kv_capacity=kv_capacity,
        max_running=256,
        new_token_ratio=0.1,
        tp=tp,
        label=label,
        kv_bytes_per_token=kv_bytes,
        source=(
            f"ESTIMATE (roofline, not a measurement): {model.name} (bf16) on {tp}x {gpu.name}, TP "
            f"{tp}; {model.source}; {gpu.source}; KV pool {mem_fraction:.0%} of "
            f"{gpu.memory_bytes / 1e9:.0f} GB minus weights and "
            f"{reserve_bytes / 1e9:.0f} GB; gives "
            f"a {a * 1e3:.1f} ms, b {b * 1e6:.0f} us, c {c:.2g} s/token, "
            f"{kv_capacity:,} KV tokens per engine"
        ),
    )


def paper_presets() -> dict[str, Spec]:
    """The APRIL scripts' setups (MI300X, mem fraction 0.6 as scripted) and their H100 twins."""
    mi = dict(mem_fraction=0.6, reserve_bytes=2e9)  # the scripts' --sglang-mem-fraction-static
    h100 = dict(mem_fraction=0.85, reserve_bytes=6e9)  # as qwen3-4b-h100-tp2
    return {
        "qwen3-4b-mi300x-tp2": estimate(QWEN3_4B, MI300X, 2, label="qwen3-4b-mi300x-tp2", **mi),
        "r1-distill-qwen-1.5b-mi300x-tp2": estimate(
            R1_DISTILL_QWEN_1_5B, MI300X, 2, label="r1-distill-qwen-1.5b-mi300x-tp2", **mi),
        "r1-distill-qwen-1.5b-h100-tp2": estimate(
            R1_DISTILL_QWEN_1_5B, H100_SXM, 2, label="r1-distill-qwen-1.5b-h100-tp2", **h100),
    }


def sglang_overrides(name: str) -> dict:
    """SGLang rules that differ by GPU: chunked prefill 16,384 on MI300-class memory (SGLang's
    memory_hook sets 16384 on B200/MI300, 8192 on 80-160 GB GPUs)."""
    return {"chunked_prefill_size": 16384} if "mi300x" in name else {}


# which preset a (model, GPU, TP) launch maps to; the importer reads this
MODEL_KEYS: dict[str, str] = {"qwen3-4b": "qwen3-4b", "qwen3-8b": "qwen3-8b",
                              "deepseek-r1-distill-qwen-1.5b": "r1-distill-qwen-1.5b"}
