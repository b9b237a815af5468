"""`aprilsim simulate`, `scenario`, `presets` as a user runs them: output shape and clean errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import tomllib
from cli_helpers import aprilsim

from aprilsim.config import default_scenario_text

REQUIRED = {
    "scheduler",
    "steps",
    "rollout_throughput_tok_s",
    "mean_rollout_time_s",
    "mean_step_time_s",
    "engine_busy_fraction",
    "offpolicy_token_fraction",
    "mean_trained_length",
    "wasted_tokens",
}


def test_module_entry_point_runs():
    """`python -m aprilsim` (the one subprocess run: the entry point itself is the point)."""
    r = subprocess.run([sys.executable, "-m", "aprilsim", "schedulers", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert {row["name"] for row in json.loads(r.stdout)} >= {"sync", "april"}


def test_simulate_json_default_scenario():
    r = aprilsim("simulate", "--json", "--steps", "3")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [row["scheduler"] for row in rows] == ["sync", "april"]
    for row in rows:
        assert REQUIRED <= set(row)
        assert row["steps"] + row["warmup_steps"] == 3 and row["warmup_steps"] == 1
    sync, april = rows
    assert april["rollout_throughput_tok_s"] > sync["rollout_throughput_tok_s"]


def test_simulate_table_and_steps_out(tmp_path):
    out = tmp_path / "steps.jsonl"
    r = aprilsim("simulate", "--steps", "2", "--scheduler", "april", "--steps-out", str(out))
    assert r.returncode == 0, r.stderr
    assert "april" in r.stdout and "rollout tok/s" in r.stdout
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 1] and all(x["scheduler"] == "april" for x in lines)


def test_same_seed_same_json():
    a = aprilsim("simulate", "--json", "--steps", "2", "--seed", "7")
    b = aprilsim("simulate", "--json", "--steps", "2", "--seed", "7")
    c = aprilsim("simulate", "--json", "--steps", "2", "--seed", "8")
    assert a.stdout == b.stdout and a.stdout != c.stdout


def test_printed_default_scenario_is_the_one_simulated(tmp_path):
    r = aprilsim("scenario")
    assert r.returncode == 0
    assert tomllib.loads(r.stdout)["cluster"]["engines"] == 4
    path = tmp_path / "s.toml"
    path.write_text(r.stdout)
    a = aprilsim("simulate", str(path), "--json", "--steps", "2")
    b = aprilsim("simulate", "--json", "--steps", "2")
    rows_a, rows_b = json.loads(a.stdout), json.loads(b.stdout)
    for ra, rb in zip(rows_a, rows_b):  # the same inputs (hash), only the command line differs
        assert ra["run"].pop("command") != rb["run"].pop("command")
    assert rows_a == rows_b


def test_presets_say_where_numbers_come_from():
    r = aprilsim("presets")
    assert r.returncode == 0 and "qwen3-4b-h100-tp2" in r.stdout and "estimate" in r.stdout


def _edit(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


BASE = default_scenario_text()
BAD = {
    "unknown key": (_edit(BASE, "steps = 40", "steps = 40\nstepz = 3"), "stepz: unknown key"),
    "negative length": (
        _edit(BASE, "max_response_len = 16384", "max_response_len = -5"),
        "max_response_len",
    ),
    "negative length model": (_edit(BASE, "sigma = 0.93", "sigma = -0.93"), "lengths"),
    "ratio below one": (_edit(BASE, "ratio = 2.0", "ratio = 0.5"), "schedulers.april"),
    "kv too small": (
        _edit(BASE, 'router = "round_robin"', 'router = "round_robin"\nkv_capacity = 9000'),
        "cluster.kv_capacity",
    ),
    "unknown preset": (_edit(BASE, '"qwen3-4b-h100-tp2"', '"tpu-v9"'), "cluster.preset"),
    "bad toml": ("steps = = 3", "not valid TOML"),
    "unknown scheduler knob": (_edit(BASE, "recycle = true", "recycle = true\nfoo = 1"), "foo"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_scenarios_give_one_line_and_exit_2(tmp_path, case):
    text, needle = BAD[case]
    path = tmp_path / "bad.toml"
    path.write_text(text)
    r = aprilsim("simulate", str(path), "--steps", "1")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], lines


def test_missing_scenario_file_is_a_clean_error(tmp_path):
    r = aprilsim("simulate", str(tmp_path / "nope.toml"))
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_lengths_from_a_model_file(tmp_path):
    (tmp_path / "m.toml").write_text('[lengths]\nfamily = "gamma"\nshape = 1.5\nscale = 800.0\n')
    body = BASE[: BASE.index("[lengths]")] + BASE[BASE.index("[prompts]") :]
    text = 'lengths = { from = "m.toml" }\n' + body  # top-level keys come before any table
    (tmp_path / "s.toml").write_text(text)
    r = aprilsim("simulate", str(tmp_path / "s.toml"), "--json", "--steps", "2",
                 "--scheduler", "sync")
    assert r.returncode == 0, r.stderr
    (row,) = json.loads(r.stdout)
    assert abs(row["workload_mean_length"] - 1200) < 60  # gamma mean = shape * scale


def test_simulate_writes_traces_and_timelines_per_scheduler(tmp_path):
    from aprilsim.metrics.trace import Trace

    r = aprilsim("simulate", "--steps", "2", "--trace", str(tmp_path / "t.jsonl"),
                 "--timeline", str(tmp_path / "tl.png"))
    assert r.returncode == 0, r.stderr
    for name in ("sync", "april"):
        tr = Trace.read(tmp_path / f"t_{name}.jsonl")
        assert tr.scheduler == name and tr.source == "sim" and tr.n_engines == 4
        assert {p.phase for p in tr.phases} == {"rollout", "train", "sync"}
        assert tr.engine_samples and all(s.kv_tokens >= 0 for s in tr.engine_samples)
        assert sum(q.tokens for q in tr.requests) > 0
        assert (tmp_path / f"tl_{name}.png").stat().st_size > 10_000
        assert f"wrote {tmp_path / f'tl_{name}.png'}" in r.stderr
    april = Trace.read(tmp_path / "t_april.jsonl")
    assert any(q.reason == "abort" for q in april.requests)
    assert any(q.carried > 0 for q in april.requests)  # resumed partials
    bad = aprilsim("simulate", "--steps", "2", "--timeline", str(tmp_path / "x.gif"))
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    missing = aprilsim("simulate", "--steps", "2", "--trace", str(tmp_path / "no" / "t.jsonl"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr
