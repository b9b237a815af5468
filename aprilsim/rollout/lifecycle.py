"""The sample life cycle: every legal status change, and the one error for an illegal one.

    PENDING --submit--> RUNNING --ends complete--> DONE --close batch--> TRAINED
                        RUNNING --abort / cap / fault--> PARTIAL --submit--> RUNNING
    PENDING, PARTIAL, DONE --discard--> DISCARDED

Only the rollout core moves samples (`aprilsim.rollout.core`); on its hot paths it writes the
status inline where the in-flight map already proves the source status (a request id in flight
is a RUNNING sample), and calls `check` everywhere a scheduler names the sample.
"""

from __future__ import annotations

from aprilsim.policies.base import SchedulerError
from aprilsim.types import Sample, SampleStatus

P, R, A, D, T, X = (SampleStatus.PENDING, SampleStatus.RUNNING, SampleStatus.PARTIAL,
                    SampleStatus.DONE, SampleStatus.TRAINED, SampleStatus.DISCARDED)

LEGAL: dict[SampleStatus, frozenset[SampleStatus]] = {
    P: frozenset({R, X}),
    R: frozenset({D, A}),
    A: frozenset({R, X}),
    D: frozenset({T, X}),
    T: frozenset(),
    X: frozenset(),
}

_VERB = {R: "submit", X: "discard", T: "train", D: "finish", A: "return"}


def check(sample: Sample, to: SampleStatus) -> None:
    """Raise SchedulerError unless `sample` may move from its status to `to`."""
    if to not in LEGAL[sample.status]:
        raise SchedulerError(
            f"cannot {_VERB[to]} sample {sample.uid} in status {sample.status.value}")


def move(sample: Sample, to: SampleStatus) -> None:
    """Move `sample` to `to` (checked)."""
    check(sample, to)
    sample.status = to
