"""`aprilsim validate` on in-process bundled engines (CPU): the command end to end, and the
issue's targets checked on a small case from the measured runs.

What is bounded, and why. The wall clock of a shared CI machine is not predictable (one step of
the same workload takes 0.6x to 1.6x another under load), so the targets are checked on the
engines' *logged iterations priced by the calibrated cost*: which iterations the engines ran
(scheduler, admission, batching, aborts), whatever each took. On one engine that is tight and
repeatable, because the simulation lands aborts as the bundled engine does (after the step in
flight, `abort_steps = 0`): over 11 runs, 6 of them beside three CPU burners, the priced
per-step error was 0-1.2 % for both schedulers and the priced gain 0-0.3 pp from the predicted
one (before that abort model, APRIL's error was 2.4-2.8 % and the gain 1.2-1.6 pp off); 8 more
runs beside two burners on 2 cores stayed within 0.28 pp. The tail is longer than that: a CI run
with the other test worker busy measured 1.15 pp (which requests the abort catches follows the
threads' timing), so the gain is held to the issue's target (3 pp), not to the 1 pp an earlier
version asserted. On two in-process engines only sync's figures are deterministic: the engines share
one interpreter lock, so their progress relative to each other follows the threads' turns rather
than the cost model, and APRIL's first-finished groups (hence its priced gain, 0.3-9.3 pp off over
10 runs) depend on it; that test bounds sync only.
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


def _validate(tmp_path, engines: int) -> tuple[dict, dict, dict]:
    sc = tmp_path / "small.toml"
    sc.write_text(SMALL)
    out = tmp_path / "report"
    res = CliRunner().invoke(main, ["validate", str(sc), "--local", str(engines), "-s", "sync",
                                    "-s", "april", "--no-figures", "--out", str(out)])
    assert res.exit_code == 0, res.output
    rep = json.loads((out / "report.json").read_text())
    assert (out / "report.md").read_text().startswith("# aprilsim validate")
    assert rep["meta"]["limits"]["max_running"] == 64  # read from the engines' server info
    by = {s["label"]: s for s in rep["schedulers"]}
    assert set(by) == {"sync", "april"}
    # same groups on both sides: sync trains the same samples, so the same tokens (APRIL trains
    # the groups that finish first, which depends on timing)
    assert by["sync"]["predicted"]["trained_tokens"] == by["sync"]["measured"]["trained_tokens"]
    for s in by.values():  # wall clock: a guard against nonsense only (see the module docstring)
        assert s["errors"]["step_rollout_median_abs"] <= 1.0, (s["label"], s["errors"])
    return rep["targets"], by, rep["meta"]["limits"]


@pytest.mark.slow
def test_validate_on_one_engine_meets_the_engine_time_targets(tmp_path):
    t, by, limits = _validate(tmp_path, 1)
    # APRIL aborted: the latency its live aborts took reaches the simulation (a client's
    # confirmation takes at least one HTTP-free round of the runner's loop: > 0)
    assert 0 < limits["abort_latency_s"] < 1.0, limits
    # sync's engine time is deterministic; the abort model (abort_steps 0) keeps APRIL's close,
    # but which requests an abort catches follows the timing (5.4 % at load 8 on 2 cores)
    for label, bound in (("sync", 0.03), ("april", 0.08)):
        assert by[label]["errors"]["step_priced_median_abs"] <= bound, (label, by[label]["errors"])
    assert t["step_priced_error"]["worst"] <= t["step_priced_error"]["bound"], (
        t["step_priced_error"])
    assert t["gain_priced_pp"]["bound"] == 3.0
    assert t["gain_priced_pp"]["worst"] <= 3.0, t["gain_priced_pp"]
    assert all(p["mean"] >= -t["ranking_priced"]["tie"] for p in t["ranking_priced"]["pairs"]), t
    # one round: no interval, so a gain and a ranking decide nothing (issue 35)
    assert t["gain_priced_pp"]["verdict"] == t["ranking_priced"]["verdict"] == "undecided"


@pytest.mark.slow
def test_validate_on_two_engines_matches_sync(tmp_path):
    """Two in-process engines: sync's engine time is deterministic (every request runs to its
    end), so it matches the simulation; APRIL's is not asserted (see the module docstring: its
    priced gain moved 0.3-9.3 pp from the prediction over 10 runs, more than the predicted gap
    to sync in some of them, so even the ranking would be a coin toss there)."""
    t, by, _ = _validate(tmp_path, 2)
    assert by["sync"]["errors"]["step_priced_median_abs"] <= 0.05, by["sync"]["errors"]
    assert by["april"]["measured"]["steps"] == by["april"]["predicted"]["steps"]
    assert "april" in t["gain_vs_sync_pp"]["by_scheduler"]  # reported, whatever it is
