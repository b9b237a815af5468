"""A small decoder-only transformer with a slot-based KV cache.

The model is deliberately plain (pre-LayerNorm blocks, learned absolute positions, GELU MLP,
tied embeddings) so that the engine around it is the interesting part. Weights come from a seeded
random init or a local checkpoint written by :meth:`TinyDecoder.save`.

The KV cache is a pool of fixed slots: ``k[layer, slot, head, position, dim]``. A request owns one
slot while it runs; prefill writes its prompt's keys/values there, each decode step appends one
position. Batched decode gathers the slots of the running requests and masks positions beyond each
request's length, so requests of different lengths decode together in one forward pass.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ModelConfig:
    """Model shape. Defaults are tiny; tests use e.g. 2 layers, d_model 64."""

    vocab_size: int = 512
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int | None = None
    max_context: int = 2048
    eos_token_id: int = 2

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} not divisible by n_heads {self.n_heads}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def ff(self) -> int:
        return self.d_ff or 4 * self.d_model

    def num_params(self) -> int:
        d, f, v = self.d_model, self.ff, self.vocab_size
        per_layer = 4 * d * d + 4 * d + 2 * d * f + f + d + 4 * d
        return v * d + self.max_context * d + self.n_layers * per_layer + 2 * d


class KVPool:
    """Preallocated keys/values for ``n_slots`` requests of up to ``capacity`` tokens each."""

    def __init__(self, cfg: ModelConfig, n_slots: int, capacity: int, device, dtype) -> None:
        shape = (cfg.n_layers, n_slots, cfg.n_heads, capacity, cfg.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.capacity = capacity
        self.free: list[int] = list(range(n_slots - 1, -1, -1))

    def alloc(self) -> int:
        return self.free.pop()

    def release(self, slot: int) -> None:
        self.free.append(slot)

    def drop(self) -> None:
        """Free the cache tensors (release_memory_occupation); :meth:`restore` reallocates."""
        self._shape = self.k.shape
        self.k = self.v = torch.empty(0, device=self.k.device, dtype=self.k.dtype)

    def restore(self) -> None:
        if self.k.numel() == 0 and hasattr(self, "_shape"):
            self.k = torch.zeros(self._shape, device=self.k.device, dtype=self.k.dtype)
            self.v = torch.zeros(self._shape, device=self.v.device, dtype=self.v.dtype)

    @property
    def allocated(self) -> bool:
        return self.k.numel() > 0


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.fc1 = nn.Linear(cfg.d_model, cfg.ff)
        self.fc2 = nn.Linear(cfg.ff, cfg.d_model)

    def _split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[..., 3d] -> three [..., H, Dh]."""
        h, dh = self.cfg.n_heads, self.cfg.head_dim
        q, k, v = self.qkv(self.ln1(x)).split(self.cfg.d_model, dim=-1)
        return q.unflatten(-1, (h, dh)), k.unflatten(-1, (h, dh)), v.unflatten(-1, (h, dh))

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    def prefill(self, x: torch.Tensor, pool: KVPool, layer: int, slot: int) -> torch.Tensor:
        """x: [T, d] (one request, positions 0..T-1). Writes K/V of all T positions to ``slot``."""
        t = x.shape[0]
        q, k, v = self._split(x)  # [T, H, Dh]
        q, k, v = (z.transpose(0, 1) for z in (q, k, v))  # [H, T, Dh]
        pool.k[layer, slot, :, :t] = k
        pool.v[layer, slot, :, :t] = v
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [H, T, Dh]
        x = x + self.proj(att.transpose(0, 1).flatten(-2))
        return self._mlp(x)

    def decode(
        self, x: torch.Tensor, pool: KVPool, layer: int, slots: torch.Tensor,
        pos: torch.Tensor, mask: torch.Tensor, dense: bool = False,
    ) -> torch.Tensor:
        """x: [B, d], one new token per request at position ``pos[b]`` in slot ``slots[b]``;
        ``dense``: ``mask`` has a row per slot of the pool, which is attended in place."""
        q, k, v = self._split(x)  # [B, H, Dh]
        kl, vl = pool.k[layer], pool.v[layer]
        kl[slots, :, pos] = k
        vl[slots, :, pos] = v
        span = mask.shape[-1]
        if dense:
            qf = q.new_zeros((mask.shape[0], *q.shape[1:]))
            qf[slots] = q
            att = F.scaled_dot_product_attention(qf.unsqueeze(2), kl[:, :, :span], vl[:, :, :span],
                                                 attn_mask=mask)[slots]
        else:
            keys = kl[slots, :, :span]  # [B, H, L, Dh]
            vals = vl[slots, :, :span]
            att = F.scaled_dot_product_attention(q.unsqueeze(2), keys, vals, attn_mask=mask)
        x = x + self.proj(att.squeeze(2).flatten(-2))
        return self._mlp(x)


class TinyDecoder(nn.Module):
    """Decoder-only LM: token + position embeddings, ``n_layers`` blocks, tied output head."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.max_context, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)

    @classmethod
    def random(cls, cfg: ModelConfig, seed: int = 0) -> TinyDecoder:
        """Seeded random init (GPT-2 style scales), identical for the same config and seed."""
        gen = torch.Generator().manual_seed(seed)
        model = cls(cfg)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() >= 2:
                    std = 0.02 / (math.sqrt(2 * cfg.n_layers) if name.endswith("fc2.weight") else 1)
                    p.copy_(torch.randn(p.shape, generator=gen) * std)
                elif name.endswith("weight"):
                    p.fill_(1.0)
                else:
                    p.zero_()
        return model.eval()

    def save(self, path: str | Path) -> None:
        """Write ``config.json`` and ``model.pt`` into directory ``path``."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(asdict(self.cfg), indent=2))
        torch.save(self.state_dict(), path / "model.pt")

    @classmethod
    def load(cls, path: str | Path) -> TinyDecoder:
        """Load a checkpoint directory written by :meth:`save`."""
        path = Path(path)
        cfg = ModelConfig(**json.loads((path / "config.json").read_text()))
        model = cls(cfg)
        state = torch.load(path / "model.pt", map_location="cpu", weights_only=True)
        bad = next((k for k, v in state.items()
                    if torch.is_tensor(v) and v.is_floating_point()
                    and not torch.isfinite(v).all()),
                   None)
        if bad is not None:  # it would serve NaN log-probs and garbage tokens
            raise ValueError(f"checkpoint {path} has non-finite weights in {bad!r} (NaN or inf)")
        model.load_state_dict(state)
        return model.eval()

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.ln_f(h) @ self.tok.weight.T

    @torch.inference_mode()
    def prefill(self, ids: torch.Tensor, pool: KVPool, slot: int,
                all_logits: bool = False) -> torch.Tensor:
        """Run the prompt ``ids`` [T] into ``slot``; the last position's logits [V].

        With ``all_logits`` the logits of every position [T, V] (for input log-probs).
        """
        t = ids.shape[0]
        x = self.tok(ids) + self.pos(torch.arange(t, device=ids.device))
        for i, blk in enumerate(self.blocks):
            x = blk.prefill(x, pool, i, slot)
        return self._logits(x) if all_logits else self._logits(x[-1])

    @torch.inference_mode()
    def decode(self, ids: torch.Tensor, pos: torch.Tensor, slots: torch.Tensor, pool: KVPool,
               dense: bool | None = None) -> torch.Tensor:
        """One decode step for B requests: token ``ids[b]`` at position ``pos[b]``; logits [B, V].

        ``dense`` (default: on a GPU, when the batch holds at least half the pool's slots):
        attend over the whole pool in place, each slot's row masked to its own positions (idle
        slots to position 0), instead of gathering the batch's keys and values into a copy
        first: with long contexts on a GPU the copy, not the attention, is what a step costs."""
        span = int(pos.max().item()) + 1
        mask = (torch.arange(span, device=ids.device)[None, :] <= pos[:, None])[:, None, None, :]
        n = pool.k.shape[1]
        if dense is None:
            dense = ids.device.type == "cuda" and 2 * ids.shape[0] >= n > 1
        if dense:
            full = torch.zeros((n, 1, 1, span), dtype=torch.bool, device=ids.device)
            full[..., 0] = True
            full[slots] = mask
            mask = full
        x = self.tok(ids) + self.pos(pos)
        for i, blk in enumerate(self.blocks):
            x = blk.decode(x, pool, i, slots, pos, mask, dense)
        return self._logits(x)

    @torch.inference_mode()
    def forward_full(self, ids: torch.Tensor) -> torch.Tensor:
        """Reference forward without cache: logits for every position of ``ids`` [T] -> [T, V]."""
        t = ids.shape[0]
        x = self.tok(ids) + self.pos(torch.arange(t, device=ids.device))
        h, dh = self.cfg.n_heads, self.cfg.head_dim
        for blk in self.blocks:
            q, k, v = (z.transpose(0, 1) for z in blk._split(x))
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + blk.proj(att.transpose(0, 1).reshape(t, h * dh))
            x = blk._mlp(x)
        return self._logits(x)
