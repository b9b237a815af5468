"""Schedulers: one implementation each, shared by the simulator and the live-engine runner."""

from aprilsim.policies.april import AprilDSScheduler, AprilScheduler
from aprilsim.policies.async_one_step import AsyncOneStepScheduler
from aprilsim.policies.base import Context, Scheduler, SchedulerError
from aprilsim.policies.dynamic_sampling import DynamicSamplingScheduler
from aprilsim.policies.fully_async import FullyAsyncScheduler
from aprilsim.policies.registry import REGISTRY, make_scheduler, register
from aprilsim.policies.slime_dapo import SlimeDapoScheduler
from aprilsim.policies.sync import SyncScheduler
from aprilsim.policies.tail_batching import TailBatchingScheduler

__all__ = [
    "REGISTRY",
    "AprilDSScheduler",
    "AprilScheduler",
    "AsyncOneStepScheduler",
    "Context",
    "DynamicSamplingScheduler",
    "FullyAsyncScheduler",
    "Scheduler",
    "SchedulerError",
    "SlimeDapoScheduler",
    "SyncScheduler",
    "TailBatchingScheduler",
    "make_scheduler",
    "register",
]

