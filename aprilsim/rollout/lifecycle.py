"""The sample life cycle: every legal status change, and the one error for an illegal one.

    PENDING --submit--> RUNNING --ends complete--> DONE --close batch--> TRAINED
                        RUNNING --abort / cap / fault--> PARTIAL --submit--> RUNNING
    PENDING, PARTIAL, DONE --discard--> DISCARDED

Only the rollout core moves samples (`aprilsim.rollout.core`). A change a scheduler names (submit,
discard, close a batch) is asked of this table (`check`), which raises with the reason where it is
illegal; the core's fast paths test the usual source by identity first and ask the table only
otherwise. Where the in-flight map proves the source (a request id in flight is a RUNNING sample),
the core writes without asking: those writes are `DIRECT`, and a test holds them to `LEGAL`.
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

# the changes the core writes without `check`: submit's usual sources, and the ends of a request
# in flight (finished, returned or capped, failed), and training a finished group
DIRECT: frozenset[tuple[SampleStatus, SampleStatus]] = frozenset(
    {(P, R), (A, R), (R, D), (R, A), (D, T)})

_VERB = {R: "submit", X: "discard", T: "train", D: "finish", A: "return"}


def check(sample: Sample, to: SampleStatus) -> None:
    """Raise SchedulerError unless `sample` may move from its status to `to`."""
    if to not in LEGAL[sample.status]:
        raise SchedulerError(
            f"cannot {_VERB[to]} sample {sample.uid} in status {sample.status.value}")
