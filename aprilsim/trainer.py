"""How long a training step and a weight sync take."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TrainerModel:
    """train time = base_s + per_token_s * (prompt + response tokens of the batch); sync = sync_s.

    Default: Qwen3-4B on 8 H100s, forward+backward (6 FLOPs/param/token) plus reference and old
    log-prob passes (4 FLOPs/param/token) at 40% of 989 TFLOP/s each: ~1.26e-5 s per token. An
    estimate, to be replaced by measurements of your trainer.
    """

    base_s: float = 5.0
    per_token_s: float = 1.26e-5
    sync_s: float = 3.0

    def __post_init__(self) -> None:
        if self.base_s < 0 or self.per_token_s < 0 or self.sync_s < 0:
            raise ValueError("trainer times must be >= 0")

    def train_time(self, tokens: int) -> float:
        return self.base_s + self.per_token_s * tokens
