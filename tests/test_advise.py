"""`aprilsim advise` end to end (issue 21, item 5): a slime launch script and a small generation
log in, a ranked recommendation out, with a scenario that loads and the commands to try it.

Kept fast: a batch of 8 groups, 3 steps, 3 seeds, one grid round of 2 points, two candidates.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from aprilsim.cli import main
from aprilsim.config import load_scenario

pytest.importorskip("pandas")
DATA = Path(__file__).parent / "data"
SLIME = DATA / "april-grpo-run-qwen3-4B-dapo-partial.sh"
LOG = DATA / "replay" / "table.csv"
SMALL = ["--set", "batch_size=8", "--steps", "3", "--seeds", "3", "--rounds", "1", "--grid", "2",
         "-j", "1"]


def test_advise_from_a_slime_script_and_a_log_ranks_options_and_says_how_to_try_the_winner(tmp_path):
    out = tmp_path / "advice"
    args = ["advise", "--slime", str(SLIME), "--log", str(LOG), "--candidates",
            "april,async_one_step", "--max-staleness", "1", "--out", str(out), *SMALL]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    text = r.output
    assert "lengths: fitted from" in text and "launch config: slime" in text
    assert "samples/s vs sync [95% CI]" in text
    advice = json.loads((out / "advice.json").read_text())
    by = {o["scheduler"]: o for o in advice["options"]}
    assert set(by) == {"april", "async_one_step", "sync"}
    # APRIL at any ratio trains tokens two or more versions old: out under staleness <= 1
    assert "max_staleness <= 1" in by["april"]["infeasible"]
    feasible = [o for o in advice["options"] if not o["infeasible"]]
    gains = [o["gain"] for o in feasible]
    assert gains == sorted(gains, reverse=True)  # ranked by the gain over sync
    assert all(o["staleness"] <= 1 for o in feasible)
    winner = advice["winner"]
    assert winner == feasible[0]["label"]
    # the advised scenario loads, uses the fitted lengths, and compares sync with the winner
    sc = load_scenario(out / "advised.toml")
    assert sc.lengths == {"from": str((out / "lengths.toml").resolve())}
    if winner != "sync":
        assert list(sc.compare) == ["sync", winner.split("@")[0]]
    assert f"aprilsim validate {out / 'advised.toml'} --local 2 -s sync -s {winner}" in text
    assert "slime: --rollout-batch-size 8" in text


def test_advise_with_nothing_feasible_says_so(tmp_path):
    out = tmp_path / "advice"
    args = ["advise", "--candidates", "async_one_step", "--max-offpolicy", "0.1", "--out",
            str(out), *SMALL]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    advice = json.loads((out / "advice.json").read_text())
    assert advice["winner"] == "sync"  # the baseline is always an option
    assert "misses offpolicy_token_fraction <= 0.1" in advice["options"][1]["infeasible"]


def test_advise_rejects_bad_input_in_one_line(tmp_path):
    r = CliRunner().invoke(main, ["advise", "--candidates", "nope", "--out", str(tmp_path), *SMALL])
    assert r.exit_code == 2 and "not advised on" in r.output
    r = CliRunner().invoke(main, ["advise", "--slime", str(SLIME), "--verl",
                                  str(DATA / "verl-dapo-e2e.yaml"), "--out", str(tmp_path)])
    assert r.exit_code == 2 and "at most one of" in r.output
