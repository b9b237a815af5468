"""The sans-I/O rollout core shared by the simulator (`aprilsim.sim`) and the live runner
(`real/`)."""

from aprilsim.rollout.core import MAX_FAULT_RESUBMITS, RolloutCore, effective_cap
from aprilsim.rollout.ledger import StepLedger
from aprilsim.rollout.ports import (
    Abort,
    BatchReady,
    Command,
    Ended,
    Meter,
    Reading,
    RequestEnd,
    Sender,
    SyncWeights,
)

__all__ = ["MAX_FAULT_RESUBMITS", "Abort", "BatchReady", "Command", "Ended", "Meter", "Reading",
           "RequestEnd", "RolloutCore", "Sender", "StepLedger", "SyncWeights", "effective_cap"]
