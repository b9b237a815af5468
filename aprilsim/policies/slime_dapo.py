"""`slime_dapo`: slime's DAPO baseline, dynamic sampling without partial rollout.

This is what slime runs for the APRIL repo's DAPO baseline scripts (`--dynamic-sampling-filter-path`
without `--partial-rollout`; `slime/rollout/sglang_rollout.py`, `generate_rollout_async`): submit an
over-sampling batch (`--over-sampling-batch-size`, default N); a group whose rewards are all equal
is dropped and decrements slime's `remaining_batch_size`; when in-flight plus accepted groups fall
below N, a whole new over-sampling batch is submitted (so the first dropped group at ratio 1 starts
about N more groups racing); at the N-th valid group everything still running is aborted and thrown
away (no buffer), as are groups completing in the same wake-up. Not verl's synchronous rounds
(`dynamic_sampling`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from aprilsim.policies.april import AprilDSScheduler


@dataclass
class SlimeDapoScheduler(AprilDSScheduler):
    """slime's DAPO baseline: over-sample, abort at N valid groups, discard the rest."""

    name: ClassVar[str] = "slime_dapo"
    variants: ClassVar[tuple[dict[str, object], ...]] = (
        {"refill": "one_for_one", "surplus": "recycle", "mask_offpolicy": True},
    )
    ratio: float = 1.0  # --over-sampling-batch-size / --rollout-batch-size (slime's default: 1)
    recycle: bool = False  # no --partial-rollout: what the abort returns is discarded
