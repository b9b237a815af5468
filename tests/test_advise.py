"""`aprilsim advise` end to end (issue 21, item 5): a slime launch script and a small generation
log in, a ranked recommendation out, with a scenario that loads and the commands to try it.

Kept fast: a batch of 8 groups, 3 steps, 3 seeds, one grid round of 2 points, two candidates.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from aprilsim.advise import CANDIDATES
from aprilsim.advise_launch import FRAMEWORKS, LAUNCH, launch
from aprilsim.cli import main
from aprilsim.config import load_scenario
from aprilsim.policies.registry import REGISTRY, knobs

pytest.importorskip("pandas")
DATA = Path(__file__).parent / "data"
SLIME = DATA / "april-grpo-run-qwen3-4B-dapo-partial.sh"
LOG = DATA / "replay" / "table.csv"
SMALL = ["--set", "batch_size=8", "--steps", "3", "--seeds", "3", "--rounds", "1", "--grid", "2",
         "-j", "1"]


def test_advise_from_a_slime_script_and_a_log_ranks_options_and_says_how_to_try_the_winner(
        tmp_path):
    out = tmp_path / "advice"
    args = ["advise", "--slime", str(SLIME), "--log", str(LOG), "--candidates",
            "april,async_one_step", "--max-staleness", "1", "--out", str(out), *SMALL]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    text = r.output
    assert "lengths: fitted from" in text and "launch config: slime" in text
    # the script runs APRIL: the gains are over it, what the user runs today
    assert "samples/s vs april [95% CI]" in text
    assert "april (today)" in text or "april (what you run today): infeasible" in text
    advice = json.loads((out / "advice.json").read_text())
    assert advice["baseline"] == "april" and advice["framework"] == "slime"
    by = {(o["scheduler"], o["baseline"]): o for o in advice["options"]}
    assert set(by) == {("april", True), ("april", False), ("async_one_step", False),
                       ("sync", False)}
    # APRIL tuned trains tokens two or more versions old: out under staleness <= 1, and the
    # reason names the limit and by how much it was missed
    assert "max_staleness <= 1 missed by" in by["april", False]["infeasible"]
    assert by["april", False]["misses"][0]["metric"] == "max_staleness"
    feasible = [o for o in advice["options"] if not o["infeasible"]]
    gains = [o["gain"] for o in feasible]
    assert gains == sorted(gains, reverse=True)  # ranked by the gain over the baseline
    assert all(o["staleness"] <= 1 for o in feasible)
    assert all(o["launch"] == "yes" for o in feasible)  # slime launches all three
    winner = advice["winner"]
    assert winner == feasible[0]["label"]
    # the advised scenario loads, uses the fitted lengths, compares the baseline with the winner
    sc = load_scenario(out / "advised.toml")
    assert sc.lengths == {"from": str((out / "lengths.toml").resolve())}
    pick = "-s april" if winner == "april" else f"-s april -s {winner}"
    assert list(sc.compare) == ["april"] + ([] if winner == "april" else [winner.split("@")[0]])
    assert f"aprilsim validate {out / 'advised.toml'} --local 2 {pick}" in text
    assert "slime: --rollout-batch-size 8" in text


def test_advise_with_nothing_feasible_says_so(tmp_path):
    out = tmp_path / "advice"
    args = ["advise", "--candidates", "async_one_step", "--max-offpolicy", "0.1", "--out",
            str(out), *SMALL]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    advice = json.loads((out / "advice.json").read_text())
    assert advice["winner"] == "sync"  # the baseline is always an option
    (out_opt,) = [o for o in advice["options"] if o["infeasible"]]
    assert "offpolicy_token_fraction <= 0.1 missed by 0.9" in out_opt["infeasible"]
    assert out_opt["infeasible"].endswith(": nothing to tune")


def test_advise_rejects_bad_input_in_one_line(tmp_path):
    r = CliRunner().invoke(main, ["advise", "--candidates", "nope", "--out", str(tmp_path), *SMALL])
    assert r.exit_code == 2 and "not advised on" in r.output
    r = CliRunner().invoke(main, ["advise", "--baseline", "nope", "--out", str(tmp_path), *SMALL])
    assert r.exit_code == 2 and "--baseline 'nope'" in r.output
    r = CliRunner().invoke(main, ["advise", "--slime", str(SLIME), "--verl",
                                  str(DATA / "verl-dapo-e2e.yaml"), "--out", str(tmp_path)])
    assert r.exit_code == 2 and "at most one of" in r.output


def test_every_registered_scheduler_is_a_candidate():
    """advise covers the registry: each scheduler is searched over a knob or measured as is."""
    assert set(CANDIDATES) | {"sync"} == set(REGISTRY)
    for name, spec in CANDIDATES.items():
        if spec is not None:
            assert spec.knob in {k.name for k in knobs(REGISTRY[name])}


def test_frameworks_say_what_they_launch_for_every_scheduler():
    for fw in FRAMEWORKS:
        assert set(LAUNCH[fw]) == set(REGISTRY)
        assert all(v.how for v in LAUNCH[fw].values())
    assert not launch("slime", "fully_async").ok and launch("verl", "fully_async").ok
    assert launch("slime", "april").ok and not launch("verl", "april").ok
    assert launch(None, "april") is None


def test_seer_april_and_slimes_dapo_on_a_slime_script_are_ranked_with_reasons(tmp_path):
    """Issue 38's done-when: seer, april and slime_dapo on a slime script, ranked against what
    the script runs, each with a reason when it cannot be used (a missed limit, or slime
    cannot launch it and what it would take)."""
    out = tmp_path / "advice"
    args = ["advise", "--slime", str(SLIME), "--candidates", "seer,april,slime_dapo", "--out",
            str(out), *SMALL]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    advice = json.loads((out / "advice.json").read_text())
    ranked = [o for o in advice["options"] if not o["infeasible"]]
    assert {o["scheduler"] for o in ranked} >= {"seer", "april", "slime_dapo", "sync"}
    by = {o["label"]: o for o in ranked}
    seer = next(o for o in ranked if o["scheduler"] == "seer")
    assert seer["launch"] == "no" and "global KV pool" in seer["launch_how"]
    assert 'slime cannot launch seer: it needs' in r.output
    assert all(o["launch"] == "yes" for lbl, o in by.items() if not lbl.startswith("seer"))
    assert advice["winner"] != seer["label"]  # the winner is one slime can launch
    if advice["best"] == seer["label"]:
        assert "cannot be launched by slime" in r.output


def test_verl_config_is_advised_against_the_scheduler_it_runs(tmp_path):
    """A verl DAPO config runs dynamic sampling: that is the baseline, and fully_async is one
    verl can launch (its recipe) where slime_dapo is not."""
    out = tmp_path / "advice"
    args = ["advise", "--verl", str(DATA / "verl-dapo-e2e.yaml"), "--candidates",
            "fully_async,slime_dapo", "--out", str(out), *SMALL]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    advice = json.loads((out / "advice.json").read_text())
    assert advice["baseline"] == "dynamic_sampling" and advice["framework"] == "verl"
    by = {o["scheduler"]: o for o in advice["options"]}
    assert by["dynamic_sampling"]["baseline"] and by["dynamic_sampling"]["gain"] == 1.0
    assert by["fully_async"]["launch"] == "yes" and by["slime_dapo"]["launch"] == "no"


def test_a_log_longer_than_the_cap_is_said_to_be_truncated(tmp_path):
    """Issue 36 item 3: a log whose responses are mostly above max_response_len is advised on
    only with a warning naming the share, the median and what to set."""
    rng = np.random.default_rng(0)
    log = tmp_path / "long.csv"
    long = np.clip(rng.lognormal(np.log(98_000), 0.2, 396), 20_000, 130_000)
    lengths = np.concatenate([long, [3_000, 5_000, 8_000, 12_000]]).astype(int)  # 99 % above
    log.write_text("response_length\n" + "\n".join(map(str, lengths)) + "\n")
    out = tmp_path / "advice"
    args = ["advise", "--log", str(log), "--candidates", "async_one_step", "--out", str(out),
            *SMALL]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    advice = json.loads((out / "advice.json").read_text())
    (w,) = advice["warnings"]
    assert "99% of the log's responses are longer than max_response_len 16,384" in w
    assert "median: 9" in w  # ~98k
    assert "truncated workload" in w and "--set max_response_len" in w
    assert f"warning: {w}" in r.output
