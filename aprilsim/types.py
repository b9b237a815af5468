"""The nouns shared by the simulator and the live-engine runner: samples, groups, segments.

A *sample* is one response being generated; a *group* is the n samples of one prompt (GRPO).
A *segment* is a run of tokens of one sample generated under one policy version. These types
carry no clock and no I/O, so `aprilsim.sim` and `real/` can both use them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class SampleStatus(str, Enum):
    """Where a sample is in its life; the ledger of conservation is built on this."""

    PENDING = "pending"  # created, never submitted
    RUNNING = "running"  # submitted to an engine, not yet returned
    PARTIAL = "partial"  # returned unfinished (aborted); may be resumed
    DONE = "done"  # finished: stop token or max_response_len
    TRAINED = "trained"  # part of a batch handed to the trainer
    DISCARDED = "discarded"  # thrown away; its tokens count as waste


_DONE, _TRAINED = SampleStatus.DONE, SampleStatus.TRAINED


class FinishReason(str, Enum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"


@dataclass(slots=True)
class Segment:
    """`tokens` tokens of one sample generated under policy `version`."""

    version: int
    tokens: int


@dataclass(slots=True, eq=False)
class Sample:
    """One response. `target_len` is the length it will reach (already capped at max_len).

    The engine does not know `target_len` (a real engine does not know when EOS comes); it is the
    workload's ground truth, used to decide when the simulated request stops.
    """

    uid: int
    group_id: int
    index: int
    prompt_len: int
    target_len: int
    max_len: int
    reward: float
    generated: int = 0
    segments: list[Segment] = field(default_factory=list)
    status: SampleStatus = SampleStatus.PENDING
    submits: int = 0
    submit_version: int = -1

    @property
    def truncated(self) -> bool:
        """True when the response runs into max_response_len (status "truncated" in slime)."""
        return self.target_len >= self.max_len

    @property
    def remaining(self) -> int:
        return self.target_len - self.generated

    @property
    def max_new_tokens(self) -> int:
        """What a (re)submission asks the engine for: the remainder of max_response_len."""
        return self.max_len - self.generated

    @property
    def finished(self) -> bool:
        st = self.status
        return st is _DONE or st is _TRAINED

    @property
    def finish_reason(self) -> FinishReason:
        return FinishReason.LENGTH if self.truncated else FinishReason.STOP

    def add_tokens(self, tokens: int, version: int) -> None:
        """Record `tokens` newly generated under `version` (merging with the last segment)."""
        if tokens <= 0:
            return
        self.generated += tokens
        if self.segments and self.segments[-1].version == version:
            self.segments[-1].tokens += tokens
        else:
            self.segments.append(Segment(version, tokens))


@dataclass(slots=True, eq=False)
class Group:
    """The n samples of one prompt; finished when all of its samples are."""

    gid: int
    prompt_len: int
    samples: list[Sample]
    created_step: int
    pass_rate: float

    @property
    def size(self) -> int:
        return len(self.samples)

    @property
    def finished(self) -> bool:
        return all(s.finished for s in self.samples)

    @property
    def unfinished(self) -> list[Sample]:
        return [s for s in self.samples if not s.finished]

    @property
    def rewards(self) -> list[float]:
        return [s.reward for s in self.samples]

    @property
    def generated(self) -> int:
        return sum(s.generated for s in self.samples)

    def reward_std(self) -> float:
        r = self.rewards
        m = sum(r) / len(r)
        return (sum((x - m) ** 2 for x in r) / len(r)) ** 0.5
