"""What goes into an engine and what comes out: the engine's view of one submission."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, eq=False)
class Request:
    """One submission of a sample.

    `input_len` tokens are prefilled (prompt + tokens the sample already carried), at most
    `max_new` tokens may be generated; the workload decides the request stops after `target_new`
    (<= max_new). Admission sees only input_len and max_new, as a real engine would.
    """

    rid: int
    input_len: int
    max_new: int
    target_new: int
    gen: int = 0  # tokens generated in this submission so far (kept across retractions)
    # bookkeeping of the fast engine: gen == base + engine iteration counter while running
    base: int = 0
    retractions: int = 0


@dataclass(slots=True)
class Completion:
    """A request leaving the engine: finished ("stop"/"length") or aborted with partial output."""

    rid: int
    tokens: int
    reason: str
    time: float


def check_requests(reqs: list[Request], kv_capacity: int) -> None:
    """Reject requests no engine could serve (what a runtime must never submit)."""
    for r in reqs:
        if r.target_new < 1 or r.target_new > r.max_new:
            raise ValueError(f"request {r.rid}: need 1 <= target_new <= max_new")
        if r.input_len + r.max_new > kv_capacity:
            raise ValueError(f"request {r.rid} can never fit in the KV cache")
