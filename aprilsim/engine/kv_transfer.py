"""What moving a request's KV cache between engines costs (Seer's divided rollout, `keep_kv`).

Seer (arXiv 2511.14617, "divided rollout") keeps the KV of a request's finished piece in a
global KVCache pool built on Mooncake, so the next piece resumes on any instance without
re-prefilling; the pool lives in the cluster's CPU memory and the KV crosses the RDMA network
twice (the old engine stores it, the new one loads it). `[cluster] kv_transfer` prices that:

    delay(tokens) = hops x (latency_s + tokens x bytes_per_token / (bandwidth_gb_s x 1e9))

per resumed piece, which reaches its new engine that much later (its engine keeps serving the
others meanwhile: Mooncake's transfer engine moves data by RDMA, off the GPUs' compute). The
numbers, and where they come from:

* `bytes_per_token`: the KV one GPU of the engine holds per token (each GPU moves its own shard
  over its own NIC, in parallel): `EngineSpec.kv_bytes_per_token`, from the preset's model shape
  (e.g. Qwen3-4B at TP 2: 36 layers x 4 KV heads x 128 x K,V x bf16 = 73,728 bytes).
* `bandwidth_gb_s` 23.75 GB/s per GPU: Mooncake's transfer engine reaches 190 GB/s on a node's
  8 x 400 Gbps RoCE NICs (github.com/kvcache-ai/Mooncake, README, "Transfer Engine:
  Performance", 40 GB transfers), one NIC per GPU: 190 / 8.
* `latency_s` 1 ms per hop: an assumption (the pool's metadata lookup and the RDMA setup; the
  Mooncake README reports bandwidth, not latency). At these sizes the bandwidth term dominates:
  a 16k-token Qwen3-4B piece moves 1.2 GB per GPU, 51 ms per hop.
* `pool`: "global" (two hops: to the pool and back, Seer's design, the default), "p2p" (one
  hop, engine to engine), "free" (no cost: the idealisation the simulator had before).

Pure functions and a frozen dataclass: no I/O, nothing of the engines (`cost.EngineSpec` holds
one `KvTransferSpec`; the simulated driver and the virtual cluster ask it for each piece's delay).
"""

from __future__ import annotations

from dataclasses import dataclass

POOLS = ("global", "p2p", "free")
HOPS = {"global": 2, "p2p": 1, "free": 0}
# Mooncake transfer engine: 190 GB/s over 8 x 400 Gbps RoCE NICs per node (README), per GPU
MOONCAKE_GB_S_PER_GPU = 190.0 / 8
# when a preset does not say how much KV a token takes: c's KV read at the H100 presets'
# efficiency (70 % of 3.35 TB/s), i.e. bytes = c x 0.7 x 3.35e12
KV_READ_BYTES_S = 0.7 * 3.35e12


@dataclass(frozen=True)
class KvTransferSpec:
    """`[cluster] kv_transfer = {...}`: the pool, the link and the latency a migrated piece pays."""

    pool: str = "global"
    bandwidth_gb_s: float = MOONCAKE_GB_S_PER_GPU  # per GPU (one NIC each), GB/s
    latency_s: float = 1.0e-3  # per hop (assumed)
    bytes_per_token: float = 0.0  # per GPU; 0: the preset's (`EngineSpec.kv_bytes_per_token`)

    def __post_init__(self) -> None:
        if self.pool not in POOLS:
            raise ValueError(f"kv_transfer.pool must be one of {', '.join(POOLS)}, got "
                             f"{self.pool!r}")
        if not self.bandwidth_gb_s > 0 or self.bandwidth_gb_s == float("inf"):
            raise ValueError(f"kv_transfer.bandwidth_gb_s must be > 0 and finite, got "
                             f"{self.bandwidth_gb_s}")
        if not 0 <= self.latency_s < 3600:
            raise ValueError(f"kv_transfer.latency_s must lie in [0, 3600), got {self.latency_s}")
        if not 0 <= self.bytes_per_token < 1e9:
            raise ValueError(f"kv_transfer.bytes_per_token must lie in [0, 1e9), got "
                             f"{self.bytes_per_token}")

    @property
    def hops(self) -> int:
        """Network crossings per migration: 2 through a pool, 1 engine to engine, 0 free."""
        return HOPS[self.pool]

    def delay(self, tokens: int, preset_bytes: float) -> float:
        """Seconds for `tokens` tokens of KV to reach the next engine (`preset_bytes`: the
        engine's KV bytes per token per GPU, used when this spec sets none)."""
        hops = HOPS[self.pool]
        if not hops or tokens <= 0:
            return 0.0
        per_token = self.bytes_per_token or preset_bytes
        return hops * (self.latency_s + tokens * per_token / (self.bandwidth_gb_s * 1e9))


def kv_bytes_of(spec: object) -> float:
    """An engine spec's KV bytes per token per GPU: its own figure, else estimated from its KV
    read cost `c` at the H100 presets' efficiency (a calibrated preset that does not say)."""
    got = float(getattr(spec, "kv_bytes_per_token", 0.0) or 0.0)
    if got > 0:
        return got
    cost = getattr(spec, "cost", None)
    c = getattr(cost, "c", None)
    if c is None:  # a tabulated cost: its KV term at one request
        g = getattr(cost, "coefficients", None)
        c = g(1)[1] if callable(g) else 0.0
    return float(c) * KV_READ_BYTES_S


def transfer_delay(spec: object, tokens: int) -> float:
    """The delay a piece carrying `tokens` migrated tokens pays on engines of `spec` (an
    EngineSpec; 0 without a `kv_transfer` setting or with pool "free")."""
    kt = getattr(spec, "kv_transfer", None)
    if kt is None or not kt.hops:
        return 0.0
    return kt.delay(tokens, kt.bytes_per_token or kv_bytes_of(spec))
