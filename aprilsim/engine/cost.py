"""The engine cost model and presets.

Decode iteration time t(B, K) = a + b*B + c*K with B running requests and K KV tokens held at the
start of the iteration; prefill time p0 + p1*n + p2*n^2 for a batch of n input tokens. Presets are
roofline *estimates*, each with the arithmetic behind it, to be replaced by a calibration.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CostModel:
    """Seconds per decode iteration and per prefill batch (see module docstring)."""

    a: float
    b: float
    c: float
    p0: float
    p1: float
    p2: float = 0.0

    def __post_init__(self) -> None:
        for k in ("a", "b", "c", "p0", "p1", "p2"):
            if getattr(self, k) < 0:
                raise ValueError(f"cost coefficient {k} must be >= 0")
        if self.a <= 0 and self.b <= 0:
            raise ValueError("cost coefficients a and b cannot both be zero (iterations take time)")

    def decode_time(self, batch: int, kv_tokens: float) -> float:
        """Seconds of one decode iteration with `batch` running requests holding `kv_tokens`."""
        return self.a + self.b * batch + self.c * kv_tokens

    def decode_span(self, n: int, batch: int, kv_tokens: float) -> float:
        """Time of n iterations from KV `kv_tokens` with `batch` requests (K grows by B each)."""
        return n * (self.a + self.b * batch + self.c * kv_tokens) + self.c * batch * n * (n - 1) / 2

    def prefill_time(self, tokens: int) -> float:
        """Seconds to prefill a batch of `tokens` input tokens."""
        return self.p0 + self.p1 * tokens + self.p2 * tokens * tokens


@dataclass(frozen=True)
class EngineSpec:
    """One engine = one SGLang server (a DP replica with tensor parallelism `tp`)."""

    cost: CostModel
    kv_capacity: int = 800_000
    max_running: int = 256
    new_token_ratio: float = 0.1
    max_prefill_tokens: int = 16_384
    tp: int = 2
    label: str = "custom"
    source: str = ""

    def __post_init__(self) -> None:
        if self.kv_capacity < 1 or self.max_running < 1 or self.max_prefill_tokens < 1:
            raise ValueError("kv_capacity, max_running and max_prefill_tokens must be >= 1")
        if not 0.0 <= self.new_token_ratio <= 1.0:
            raise ValueError("new_token_ratio must lie in [0, 1]")


def _qwen3_4b_h100_tp2() -> EngineSpec:
    # Qwen3-4B: 36 layers, hidden 2560, 8 KV heads x 128, ~4.0e9 params (bf16: 8.0 GB).
    # H100 SXM: 3.35 TB/s HBM, 989 TFLOP/s bf16 dense. TP=2: each GPU holds half of it all.
    hbm, flops = 3.35e12, 989e12
    weights_per_gpu = 8.0e9 / 2
    a = weights_per_gpu / (0.8 * hbm) + 3.0e-3  # weight read + launch/all-reduce/sampling overhead
    b = (2 * 4.0e9 / 2) / (0.5 * flops) + 1.2e-5  # matmul FLOPs per token + per-request overhead
    kv_bytes = 2 * 36 * (8 // 2) * 128 * 2  # K and V, 36 layers, 4 KV heads per GPU, bf16
    c = kv_bytes / (0.7 * hbm)  # attention reads the whole KV once per iteration
    p1 = (2 * 4.0e9 / 2) / (0.6 * flops)
    p2 = (2 * 2 * 36 * 4096 / 2) / (0.5 * flops) / 2  # causal attention, per token pair
    kv_capacity = int((80e9 * 0.85 - weights_per_gpu - 6e9) / kv_bytes)
    return EngineSpec(
        cost=CostModel(a=a, b=b, c=c, p0=0.01, p1=p1, p2=p2),
        kv_capacity=kv_capacity,
        max_running=256,
        new_token_ratio=0.1,
        tp=2,
        label="qwen3-4b-h100-tp2",
        source=(
            "roofline estimate, not a measurement: Qwen3-4B (bf16) on 2x H100 SXM with TP=2; "
            "decode reads weights at 80% and KV at 70% of 3.35 TB/s, matmuls at 50% of 989 TFLOP/s, "
            "3 ms fixed overhead per iteration; KV pool 85% of 80 GB minus weights and 6 GB"
        ),
    )


def _qwen3_8b_h100_tp1() -> EngineSpec:
    hbm, flops = 3.35e12, 989e12
    weights = 16.4e9
    kv_bytes = 2 * 36 * 8 * 128 * 2
    return EngineSpec(
        cost=CostModel(
            a=weights / (0.8 * hbm) + 2.5e-3,
            b=(2 * 8.2e9) / (0.5 * flops) + 1.2e-5,
            c=kv_bytes / (0.7 * hbm),
            p0=0.01,
            p1=(2 * 8.2e9) / (0.6 * flops),
            p2=(2 * 2 * 36 * 4096) / (0.5 * flops) / 2,
        ),
        kv_capacity=int((80e9 * 0.85 - weights - 6e9) / kv_bytes),
        max_running=256,
        new_token_ratio=0.1,
        tp=1,
        label="qwen3-8b-h100-tp1",
        source="roofline estimate, not a measurement: Qwen3-8B (bf16) on one H100 SXM, same rules",
    )


PRESETS: dict[str, EngineSpec] = {
    "qwen3-4b-h100-tp2": _qwen3_4b_h100_tp2(),
    "qwen3-8b-h100-tp1": _qwen3_8b_h100_tp1(),
}

DEFAULT_PRESET = "qwen3-4b-h100-tp2"
