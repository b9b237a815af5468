"""Replay of multi-turn (agentic) run logs (issue 37): slime dumps with `loss_mask` and verl
agent-loop dumps replay as episodes whose generated tokens are the model's exactly; tool tokens
are prefilled, never generated; tool time comes from slime's `non_generation_time` or an
assumption. The fixtures (tests/data/replay_agentic) are written the way slime's and verl's
multi-turn code writes them (tests/data/make_agentic_logs.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from aprilsim.config import ScenarioError, scenario_from_dict
from aprilsim.sim.run import simulate
from aprilsim.workload.replay.spec import scenario_notes
from aprilsim.workload.replay.torch_pickle import load_torch_save
from aprilsim.workload.replay.turns import LoggedTurns, turns_from_mask, turns_from_text

DATA = Path(__file__).resolve().parent / "data" / "replay_agentic"
TRUTH = [json.loads(x) for x in (DATA / "truth.jsonl").read_text().splitlines()]
DUMPS = [load_torch_save(DATA / "slime" / "rollout_data" / f"{k}.pt") for k in range(3)]


def _replay(path: Path, **spec):
    return scenario_from_dict({
        "name": "r", "steps": 3, "warmup_steps": 0, "batch_size": 4, "group_size": 4,
        "max_response_len": 4096, "compare": ["sync"],
        "lengths": {"replay": str(path), "exhausted": "stop", **spec},
        "prompts": {"family": "lognormal", "mu": 4.5, "sigma": 0.3, "max_len": 512},
        "cluster": {"engines": 2, "router": "group_affinity", "prefix_cache": "lru"}})


def test_the_fixture_is_what_slime_writes_for_a_multi_turn_run():
    """Every sample: tokens = prompt + response, one loss_mask entry per response token, tool
    outputs (the zeros) between model turns, the tool time in non_generation_time."""
    for d in DUMPS:
        for s in d["samples"]:
            assert len(s["loss_mask"]) == s["response_length"] < len(s["tokens"])
            assert s["loss_mask"][0] == 1 and s["loss_mask"][-1] == 1 and 0 in s["loss_mask"]
            assert s["non_generation_time"] > 0
    model = sum(sum(s["loss_mask"]) for d in DUMPS for s in d["samples"])
    assert model == sum(t["generated"] for t in TRUTH)


@pytest.mark.parametrize("fmt", ["slime", "verl"])
def test_replaying_a_multi_turn_dump_generates_the_models_tokens_exactly(fmt):
    """The replayed sync run generates exactly the tokens the model generated (the loss_mask's
    ones): the tool tokens, 40-200 per call, are prefilled by the next turn; counted as
    generated, as before episodes, they would add a third."""
    if fmt == "slime":
        sc = _replay(DATA / "slime" / "rollout_data")
    else:
        sc = _replay(DATA / "verl", tokenizer=str(DATA / "verl" / "tokenizer.json"))
    r = simulate(sc, "sync")
    row = r.summary(warmup=0)
    model = sum(t["generated"] for t in TRUTH)
    tools = sum(t["tool_tokens"] for t in TRUTH)
    assert row["generated_tokens"] == r.end_state["engine_tokens"] == model
    assert row["tool_tokens"] == tools and row["tool_calls"] == sum(t["turns"] - 1 for t in TRUTH)
    resp = sum(s["response_length"] for d in DUMPS for s in d["samples"])
    assert resp == model + tools and resp / model - 1 > 0.3  # what tool tokens as generated cost
    assert row["turns_per_episode"] == pytest.approx(sum(t["turns"] for t in TRUTH) / len(TRUTH))
    secs = sum(t["tool_s"] for t in TRUTH)
    if fmt == "slime":  # non_generation_time: each sample's, split over its calls
        assert math.isclose(row["tool_time_s"], secs, rel_tol=1e-9)
    else:  # verl logs no tool time: the stated assumption, 0.5 s a call
        assert math.isclose(row["tool_time_s"], 0.5 * row["tool_calls"])
    notes = " ".join(scenario_notes(sc))
    assert "multi-turn responses" in notes and "prefilled, not generated" in notes


def test_turns_from_a_mask():
    t = turns_from_mask([1, 1, 1, 0, 0, 1, 1, 0, 0, 0, 1], 3.0)
    assert t == LoggedTurns((3, 2, 1), (2, 3), (1.5, 1.5), 0)
    assert turns_from_mask([1, 1, 1]) is None  # one turn: a plain response
    assert turns_from_mask([0, 0, 1, 1, 0, 1, 0]) == LoggedTurns((2, 1), (1,), None, 1)
    assert turns_from_mask([0, 0]) is None


def test_turns_from_verl_text():
    count = lambda t: len(t.split())  # noqa: E731 - a word-level tokenizer
    text = ("a b c user <tool_response> x y </tool_response> assistant d e <tool_response> q "
            "</tool_response> <tool_response> r </tool_response> f")
    t = turns_from_text(text, count, eos_tokens=1)
    assert t == LoggedTurns((3, 2, 2), (6, 6), None, 0)
    assert turns_from_text("plain answer", count) is None


def test_an_episodes_table_fitted_to_the_log_simulates_the_logged_regime(tmp_path):
    """`episodes_table` turns the logged turns into `[workload.episodes]` (empirical tool
    tokens and seconds) and the per-turn lengths `aprilsim fit` takes: a scenario built on them
    draws episodes in the logged ranges."""
    from aprilsim.workload.replay.spec import read_run_log
    from aprilsim.workload.replay.turns import episodes_table

    run = read_run_log(DATA / "slime" / "rollout_data")
    fitted = episodes_table([t for g in run.groups for t in g.turns or () if t is not None])
    ep = fitted["episodes"]
    assert (ep["min_turns"], ep["max_turns"]) == (min(t["turns"] for t in TRUTH),
                                                  max(t["turns"] for t in TRUTH))
    assert 40 <= min(ep["tool_tokens"]["values"]) and max(ep["tool_tokens"]["values"]) <= 200
    assert len(fitted["per_turn_lengths"]) == sum(t["turns"] for t in TRUTH)
    assert sum(fitted["per_turn_lengths"]) == sum(t["generated"] for t in TRUTH)
    sc = scenario_from_dict({
        "name": "fitted", "steps": 2, "batch_size": 4, "group_size": 4, "max_response_len": 4096,
        "lengths": {"family": "empirical", "values": fitted["per_turn_lengths"]},
        "workload": {"episodes": ep}})
    for g in sc.workload_for().generate(8, 0):
        for s in g.samples:
            assert ep["min_turns"] <= len(s.episode._ends) <= ep["max_turns"]
            assert all(40 <= t <= 200 for t in s.episode._tool_tokens)
            assert all(0 < x <= max(ep["tool_s"]["values"]) for x in s.episode._tool_s)


def test_a_bad_tool_seconds_key_is_one_line():
    with pytest.raises(ScenarioError, match="tool_s") as e:
        _replay(DATA / "slime" / "rollout_data", tool_s=-1.0).workload_for()
    assert "\n" not in str(e.value)
