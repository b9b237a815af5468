"""Off-policy figures, each named for what it is: aprilsim's share, the resumed share, slime's
`off_policy_ratio` (the APRIL fork's formula) and the share slime's loss mask zeroes."""

from __future__ import annotations

import pytest
from sched_helpers import run, small_scenario

from aprilsim.metrics.records import StepRecord, slime_off_policy_ratio


def test_slimes_ratio_is_the_mean_of_per_step_off_over_generated_plus_off():
    steps = [StepRecord(step=0, rollout_start_s=0, rollout_time_s=1, generated_tokens=300,
                        scheduler_stats={"slime_offpolicy_tokens": 100.0}),
             StepRecord(step=1, rollout_start_s=0, rollout_time_s=1, generated_tokens=100,
                        scheduler_stats={"slime_offpolicy_tokens": 0.0}),
             StepRecord(step=2, rollout_start_s=0, rollout_time_s=1)]  # nothing logged: skipped
    assert slime_off_policy_ratio(steps) == pytest.approx((100 / 400 + 0.0) / 2)


def test_april_reports_slimes_count_below_the_resumed_tokens():
    sc = small_scenario(steps=5, seed=3)
    r = run(sc, "april", {"ratio": 2.0})
    steps = r.result.steps
    off = [s.scheduler_stats["slime_offpolicy_tokens"] for s in steps]
    assert sum(off) > 0
    # the last segment of each resubmitted sample <= everything it carried
    assert all(o <= s.resumed_tokens for o, s in zip(off, steps))
    summary = r.result.summary()
    assert 0 < summary["slime_off_policy_ratio"] < summary["offpolicy_token_fraction"] <= 1
    assert summary["resumed_token_fraction"] > 0 and summary["masked_token_fraction"] == 0


def test_mask_offpolicy_reports_the_masked_tokens_and_changes_no_schedule():
    sc = small_scenario(steps=5, seed=3)
    plain = run(sc, "april", {"ratio": 2.0})
    masked = run(sc, "april", {"ratio": 2.0, "mask_offpolicy": True})
    assert [s.generated_tokens for s in plain.result.steps] == [
        s.generated_tokens for s in masked.result.steps]
    frac = masked.result.summary()["masked_token_fraction"]
    assert 0 < frac < 1
    # every masked token is one generated under an older version: the off-policy share bounds it
    assert frac <= masked.result.summary()["offpolicy_token_fraction"] + 1e-12
    assert sum(s.scheduler_stats["masked_samples"] for s in masked.result.steps) > 0
