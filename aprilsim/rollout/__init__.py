"""The sans-I/O rollout core shared by the simulator (`aprilsim.sim`) and the live runner (`real/`)."""

from aprilsim.rollout.core import MAX_FAULT_RESUBMITS, RolloutCore, effective_cap
from aprilsim.rollout.ledger import StepLedger
from aprilsim.rollout.ports import Commands, Ended, Meter, Reading

__all__ = ["MAX_FAULT_RESUBMITS", "Commands", "Ended", "Meter", "Reading", "RolloutCore", "StepLedger",
           "effective_cap"]
