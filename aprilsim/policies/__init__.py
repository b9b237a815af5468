"""Schedulers: one implementation each, shared by the simulator and the live-engine runner."""

from aprilsim.policies.april import AprilScheduler
from aprilsim.policies.base import Context, Scheduler
from aprilsim.policies.registry import REGISTRY, make_scheduler, register
from aprilsim.policies.sync import SyncScheduler

__all__ = [
    "REGISTRY",
    "AprilScheduler",
    "Context",
    "Scheduler",
    "SyncScheduler",
    "make_scheduler",
    "register",
]
