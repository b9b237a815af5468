"""Trace replay: a run's logged groups as the workload (see `source.py` for the rules)."""

from aprilsim.workload.replay.log import LoggedGroup, LoggedRow, ReplayLogError, RunLog
from aprilsim.workload.replay.source import CAVEAT, ReplayExhausted, ReplayWorkload
from aprilsim.workload.replay.spec import ReplaySpec, notes_for, read_run_log, replay_workload

__all__ = ["CAVEAT", "LoggedGroup", "LoggedRow", "ReplayExhausted", "ReplayLogError",
           "ReplaySpec", "ReplayWorkload", "RunLog", "notes_for", "read_run_log", "replay_workload"]
