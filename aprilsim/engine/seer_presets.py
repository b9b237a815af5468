"""Engine presets for the Seer paper's setups (arXiv 2511.14617): each a roofline estimate.

Seer ran GRPO on 32 nodes of 8 H800 GPUs: Moonlight on 32 GPUs, Qwen2-VL-72B on 128, Kimi-K2 on
256 (its evaluation setup, as also reported by MarkTechPost, 2025-11-23). The paper does not give
the instance layout (GPUs per inference instance); the presets assume the smallest that holds the
model with room for long responses, as `experiments/seer_table.py` says beside its figures:

* `moonlight-16b-a3b-h800-tp1`: Moonlight-16B-A3B (MoE, 16B total, 3B active, 6 of 64 routed
  experts, 27 layers, MLA with a 512 + 64 latent; docs.nvidia.com Megatron-Bridge "Moonlight",
  the HF card) in bf16 on one H800 per instance.
* `qwen2-vl-72b-h800-tp4`: Qwen2-VL-72B (dense, 73.4B with the vision tower, 80 layers, 64
  query / 8 KV heads of 128; Qwen/Qwen2-VL-72B-Instruct config.json) in bf16, TP 4 (vLLM's
  Qwen2.5-VL-72B recipe serves it on 4 GPUs).
* `kimi-k2-h800-ep16`: Kimi-K2 (MoE, 1.04T total, 32.6B active, 8 of 384 routed experts, 61
  layers, MLA; arXiv 2507.20534) with FP8 weights and KV on 16 H800 (vLLM's Kimi-K2 recipe:
  "the smallest deployment unit for Kimi-K2 FP8 weights ... on H800 is a cluster with 16 GPUs",
  DP attention + expert parallelism).

A MoE decode step reads the weights of the experts its batch touches: with B tokens each routed to
k of E experts, a share 1 - (1 - k/E)^B of the routed weights, plus every non-routed weight
(attention, shared experts, embeddings). So the fixed part of a step depends on the batch (a
`TabulatedCost` f(B)), much cheaper in the tail (a few requests touch few experts) than at full
batch. Non-routed and routed parameters follow from the published totals: N + R = total,
N + R k/E = active. MLA holds one latent of 512 + 64 values per token and layer; with DP
attention each GPU holds its own requests' KV, so the instance's KV reads split over its GPUs.
Efficiencies as the H100 presets (weights 80 %, KV 70 % of 3.35 TB/s, matmuls 50 % of
989 TFLOP/s: H800 SXM has the H100's HBM3 and compute, NVIDIA datasheet), 3 ms per step. Expert
parallelism across nodes adds its two all-to-alls per MoE layer: DeepEP's low-latency kernels
on H800 with CX7 400 Gb/s take 118 us (dispatch) + 195 us (combine) at EP 16 for a 128-token
batch (github.com/deepseek-ai/DeepEP, README, "Low-latency kernels with pure RDMA"): 60 MoE
layers x 313 us = 18.8 ms per step for Kimi-K2, not overlapped with compute (DeepEP's
two-micro-batch overlap can hide part of it: not modelled).
"""

from __future__ import annotations

from dataclasses import dataclass

from aprilsim.engine.paper_presets import H100_SXM, GpuShape, ModelShape, Spec, estimate

H800_SXM = GpuShape(
    "H800 SXM", H100_SXM.hbm_bytes_s, H100_SXM.bf16_flops, H100_SXM.memory_bytes,
    H100_SXM.weight_eff, H100_SXM.kv_eff, H100_SXM.matmul_eff, H100_SXM.overhead_s,
    "NVIDIA H800 SXM: the H100 SXM's 3.35 TB/s HBM3, 989 TFLOP/s dense bf16 and 80 GB (NVLink cut "
    "to 400 GB/s); the qwen3-4b-h100-tp2 preset's efficiencies",
)

QWEN2_VL_72B = ModelShape(
    "Qwen2-VL-72B", 73.4e9, 80, 8, 128, 64 * 128,
    "Qwen/Qwen2-VL-72B-Instruct config.json: 80 layers, hidden 8192, 64 query / 8 KV heads of "
    "128; 73.4e9 parameters with the vision tower",
)


@dataclass(frozen=True)
class MoeShape:
    """What a MoE model's decode step costs depend on."""

    name: str
    total: float  # parameters
    active: float  # parameters per token
    experts: int  # routed experts per MoE layer
    top_k: int  # routed experts per token
    layers: int
    latent: int  # MLA: values cached per token and layer (kv_lora_rank + qk_rope_head_dim)
    q_width: int  # query heads x query-key head size (prefill attention)
    weight_bytes: float  # per parameter (bf16 2, fp8 1)
    kv_bytes: float  # per cached value
    source: str

    @property
    def routed(self) -> float:
        """Parameters of all routed experts: N + R = total, N + R k / E = active."""
        return (self.total - self.active) / (1.0 - self.top_k / self.experts)

    def touched(self, batch: int) -> float:
        """Expected share of the routed experts a batch of `batch` tokens reads."""
        return 1.0 - (1.0 - self.top_k / self.experts) ** batch


MOONLIGHT = MoeShape(
    "Moonlight-16B-A3B", 16.0e9, 3.0e9, 64, 6, 27, 512 + 64, 16 * 192, 2.0, 2.0,
    "moonshotai/Moonlight-16B-A3B (DeepseekV3 architecture): 16B total, 3B active, 27 layers, "
    "64 routed experts (6 per token), 16 heads, MLA latent 512 + 64; bf16",
)
KIMI_K2 = MoeShape(
    "Kimi-K2", 1.04e12, 32.6e9, 384, 8, 61, 512 + 64, 64 * 192, 1.0, 1.0,
    "Kimi K2 (arXiv 2507.20534; moonshotai/Kimi-K2-Instruct config.json): 1.04T total, 32.6B "
    "active, 61 layers, 384 routed experts (8 per token), 64 heads, MLA latent 512 + 64; FP8 "
    "weights and KV (vLLM's Kimi-K2 recipe)",
)


# DeepEP low-latency dispatch + combine at EP 16 on H800 (README): per MoE layer and step
DEEPEP_EP16_S = (118 + 195) * 1e-6


def _batches(max_running: int) -> list[int]:
    out, b = [], 1
    while b < max_running:
        out.append(b)
        b *= 2
    return [*out, max_running]


def estimate_moe(model: MoeShape, gpu: GpuShape, gpus: int, *, mem_fraction: float,
                 reserve_bytes: float, comm_s: float, label: str) -> Spec:
    """A roofline spec for a MoE model on `gpus` GPUs (DP attention + expert parallelism)."""
    hbm, flops = gpu.hbm_bytes_s, gpu.bf16_flops
    dense = (model.total - model.routed) * model.weight_bytes
    routed = model.routed * model.weight_bytes
    max_running = 256 * gpus
    bs = _batches(max_running)

    def f(b: int) -> float:
        read = (dense + routed * model.touched(b)) / gpus / (gpu.weight_eff * hbm)
        compute = 2 * model.active * b / gpus / (gpu.matmul_eff * flops)
        return gpu.overhead_s + comm_s + read + compute + 1.2e-5 * b / gpus

    kv_per_token = model.layers * model.latent * model.kv_bytes
    g = kv_per_token / gpus / (gpu.kv_eff * hbm)
    p1 = 2 * model.active / gpus / ((gpu.matmul_eff + 0.1) * flops)
    p2 = (2 * 2 * model.layers * model.q_width / gpus) / (gpu.matmul_eff * flops) / 2
    weights = model.total * model.weight_bytes
    kv_capacity = int((gpus * (gpu.memory_bytes * mem_fraction - reserve_bytes) - weights)
                      / kv_per_token)
    return dict(
        cost=dict(table_b=bs, table_f=[f(b) for b in bs], table_g=[g] * len(bs), p0=0.01,
                  p1=p1, p2=p2),
        kv_capacity=kv_capacity, max_running=max_running, new_token_ratio=0.1, tp=gpus,
        label=label, kv_bytes_per_token=kv_per_token,
        source=(
            f"ESTIMATE (roofline, not a measurement): {model.name} on {gpus}x {gpu.name} (DP "
            f"attention, expert parallelism); {model.source}; {gpu.source}; a step reads the "
            f"non-routed weights and the routed experts its batch touches (1 - (1 - k/E)^B): "
            f"f(1) {f(1) * 1e3:.1f} ms, f({max_running}) {f(max_running) * 1e3:.1f} ms, g "
            f"{g:.2g} s/token; KV pool {mem_fraction:.0%} of {gpu.memory_bytes / 1e9:.0f} GB "
            f"per GPU minus {reserve_bytes / 1e9:.0f} GB, minus the weights: {kv_capacity:,} "
            f"tokens per instance"
        ),
    )


def seer_presets() -> dict[str, Spec]:
    """The three Seer setups' engines (layouts as the module docstring assumes)."""
    return {
        "moonlight-16b-a3b-h800-tp1": estimate_moe(
            MOONLIGHT, H800_SXM, 1, mem_fraction=0.85, reserve_bytes=6e9, comm_s=0.0,
            label="moonlight-16b-a3b-h800-tp1"),
        "qwen2-vl-72b-h800-tp4": estimate(
            QWEN2_VL_72B, H800_SXM, 4, mem_fraction=0.85, reserve_bytes=6e9,
            label="qwen2-vl-72b-h800-tp4"),
        "kimi-k2-h800-ep16": estimate_moe(
            KIMI_K2, H800_SXM, 16, mem_fraction=0.9, reserve_bytes=4e9,
            comm_s=DEEPEP_EP16_S * (KIMI_K2.layers - 1), label="kimi-k2-h800-ep16"),
    }
