"""`aprilsim validate` on two in-process bundled engines (CPU): the command end to end, and the
issue's targets checked on a small case from the measured runs.

What is bounded, and why: the per-step rollout-time error of the simulation against the live
engines' *logged iterations priced by the calibrated cost* (median <= 5 % for sync; <= 10 % for
APRIL, whose live engines run ~6 % more iterations than simulated in this 8-group case and
~3 % in the 32-group case of docs/validation.md), the APRIL-vs-sync gain on the same footing
(<= 5 pp here, against the 3 pp target, for the same reason) and the ranking. These depend on which
iterations the engines ran (the scheduler, admission, batching), not on how long the shared CI
machine took for each: another process stretching a step stretches the wall clock and the log
alike, and the pricing leaves it out. The wall-clock errors are reported beside them and only
guarded loosely (median per-step error <= 50 %): on a machine with several times more runnable
processes than cores, one step of the same workload takes from 0.6x to 1.6x another
(docs/validation.md), which no simulator can predict.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from aprilsim.cli import main

SMALL = """
name = "validate-small"
seed = 3
steps = 4
warmup_steps = 1
batch_size = 8
group_size = 4
max_response_len = 16384
compare = ["sync", "april"]
[cluster]
engines = 2
[trainer]
base_s = 5.0
per_token_s = 1.26e-5
sync_s = 3.0
[lengths]
family = "lognormal_mixture"
weights = [0.7, 0.3]
mus = [7.313, 8.854]
sigmas = [0.6, 0.7]
[prompts]
family = "lognormal"
mu = 5.3
sigma = 0.5
max_len = 2048
[schedulers.april]
ratio = 2.0
"""


@pytest.mark.slow
def test_validate_small_case_meets_the_engine_time_targets(tmp_path):
    sc = tmp_path / "small.toml"
    sc.write_text(SMALL)
    out = tmp_path / "report"
    res = CliRunner().invoke(main, ["validate", str(sc), "--local", "2", "-s", "sync", "-s", "april",
                                    "--no-figures", "--out", str(out)])
    assert res.exit_code == 0, res.output
    rep = json.loads((out / "report.json").read_text())
    assert (out / "report.md").read_text().startswith("# aprilsim validate")
    assert rep["meta"]["limits"]["max_running"] == 64  # read from the engines' server info
    t = rep["targets"]
    by = {s["label"]: s for s in rep["schedulers"]}
    assert set(by) == {"sync", "april"}
    for label, s in by.items():
        e = s["errors"]
        bound = 0.05 if label == "sync" else 0.10
        assert e["step_priced_median_abs"] <= bound, (label, e)  # engine rules + scheduler
        assert e["step_rollout_median_abs"] <= 0.50, (label, e)  # wall clock: loose guard only
    # same groups on both sides: sync trains the same samples, so the same tokens (APRIL trains
    # the groups that finish first, which depends on timing)
    assert by["sync"]["predicted"]["trained_tokens"] == by["sync"]["measured"]["trained_tokens"]
    assert t["gain_priced_pp"]["worst"] <= 5.0, (t["gain_vs_sync_pp"], by)
    assert t["ranking_priced"]["met"], t
