"""What an engine asks of a cost model (`DecodeCost`), apart from `cost`, which mypyc may compile.

A protocol in a compiled module loses what `runtime_checkable` needs, so it lives here, interpreted
(`docs/development.md`, the opt-in compiled build); `aprilsim.engine.cost` re-exports it.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class DecodeCost(Protocol):
    """What an engine asks of a cost model. Every method is closed form and exact."""

    p0: float
    p1: float
    p2: float

    def coefficients(self, batch: int) -> tuple[float, float]:
        """(f(B), g(B)): fixed seconds per iteration and seconds per KV token read."""
        ...

    def decode_time(self, batch: int, kv_tokens: float) -> float:
        """Seconds of one decode iteration with `batch` requests holding `kv_tokens`."""
        ...

    def decode_span(self, n: int, batch: int, kv_tokens: float) -> float:
        """Seconds of n iterations from `kv_tokens` with `batch` requests (K grows by B each)."""
        ...

    def iterations_within(self, dt: float, batch: int, kv_tokens: float, n_max: int) -> int:
        """Largest m <= n_max whose m iterations end no later than `dt` after they start."""
        ...

    def prefill_time(self, tokens: int, tokens_sq: float | None = None, passes: int = 1,
                     requests: int = 0) -> float:
        """Seconds of a prefill batch of `tokens` input tokens whose squares sum to `tokens_sq`,
        run as `passes` forward passes (each pays the fixed cost p0 once)."""
        ...
