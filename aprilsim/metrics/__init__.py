"""Per-step records and run summaries; the definitions are documented in docs/metrics.md."""

from aprilsim.metrics.records import RunResult, StepRecord, summarize

__all__ = ["RunResult", "StepRecord", "summarize"]
