"""Issue 22, the first hour: `simulate --seeds/--set/-s NAME@knob=v/--out`, run metadata, the
`vs sync` columns, `schedulers NAME`, `presets` units and `did you mean`."""

from __future__ import annotations

import json

import tomllib
from click.testing import CliRunner

from aprilsim.cli import main
from aprilsim.policies.registry import REGISTRY, knobs

TINY = """name = "tiny"
steps = 3
batch_size = 4
group_size = 2
max_response_len = 512
compare = ["sync", "april"]
[cluster]
engines = 2
[lengths]
family = "lognormal"
mu = 5.0
sigma = 0.5
[prompts]
family = "lognormal"
mu = 4.0
sigma = 0.3
max_len = 256
"""


def cli(*args: str):
    return CliRunner().invoke(main, list(args))


def scenario(tmp_path, text: str = TINY):
    p = tmp_path / "s.toml"
    p.write_text(text)
    return str(p)


def test_seeds_give_a_paired_table_with_intervals(tmp_path):
    s = scenario(tmp_path)
    r = cli("simulate", s, "--seeds", "3")
    assert r.exit_code == 0, r.output
    head = r.stdout.splitlines()[1]
    assert "rollout tok/s [95% CI]" in head and "tok/s vs sync [95% CI]" in head
    assert "samples/s vs sync [95% CI]" in head and "seeds 0..2, paired" in r.stdout
    sync_line = next(ln for ln in r.stdout.splitlines() if ln.startswith("sync "))
    assert "1.00x [1.00, 1.00]" in sync_line  # a scheduler against itself, seed by seed
    rows = json.loads(cli("simulate", s, "--seeds", "3", "--json").stdout)
    assert [(x["scheduler"], x["run"]["seed"]) for x in rows] == [
        ("sync", 0), ("sync", 1), ("sync", 2), ("april", 0), ("april", 1), ("april", 2)]
    # common random numbers: seed 1 here is the same run as --seed 1 alone
    alone = json.loads(cli("simulate", s, "--seed", "1", "-s", "sync", "--json").stdout)[0]
    assert alone["rollout_throughput_tok_s"] == rows[1]["rollout_throughput_tok_s"]


def test_set_any_scenario_key(tmp_path):
    s = scenario(tmp_path)
    r = cli("simulate", s, "--set", "cluster.engines=3", "--set", "schedulers.april.ratio=1.5",
            "--json")
    assert r.exit_code == 0, r.output
    via_file = scenario(tmp_path, TINY.replace("engines = 2", "engines = 3")
                        + "[schedulers.april]\nratio = 1.5\n")
    same = cli("simulate", via_file, "--json")
    strip = [{k: v for k, v in row.items() if k != "run"} for row in json.loads(r.stdout)]
    assert strip == [{k: v for k, v in row.items() if k != "run"}
                     for row in json.loads(same.stdout)]
    bad = cli("simulate", s, "--set", "cluster.enigne=3")
    assert bad.exit_code == 2 and "did you mean 'engines'" in bad.stderr
    mus = cli("simulate", s, "--set", "lengths.mus.1=3")
    assert mus.exit_code == 2 and "its keys: family, mu, sigma" in mus.stderr


def test_set_takes_toml_values_inline_tables_and_arrays(tmp_path):
    """`--set KEY=VALUE` parses VALUE as TOML: an inline table replaces the whole table, as the
    same line in the file does (it used to be taken as the string '{family=...}')."""
    s = scenario(tmp_path)
    r = cli("simulate", s, "--json", "--set", 'lengths={family="lognormal", mu=6, sigma=0.25}',
            "--set", 'compare=["sync"]')
    assert r.exit_code == 0, r.output
    via_file = scenario(tmp_path, TINY.replace("mu = 5.0\nsigma = 0.5", "mu = 6\nsigma = 0.25")
                        .replace('compare = ["sync", "april"]', 'compare = ["sync"]'))
    same = cli("simulate", via_file, "--json")
    strip = [{k: v for k, v in row.items() if k != "run"} for row in json.loads(r.stdout)]
    assert strip == [{k: v for k, v in row.items() if k != "run"}
                     for row in json.loads(same.stdout)]
    # a table replaces the table: a family's missing parameter is named, as in a file
    part = cli("simulate", s, "--set", 'lengths={family="lognormal", mu=7}')
    assert part.exit_code == 2 and "missing ['sigma']" in part.stderr
    for bad, why in [("lengths={family=", "invalid value"), ('compare=["sync",', "invalid value"),
                     ("lengths={mu=7,,}", "key"), ("x=1\ny=2", "a second key")]:
        key, _, value = bad.partition("=")
        e = cli("simulate", s, "--set", bad)
        lines = e.stderr.strip().splitlines()
        assert e.exit_code == 2 and len(lines) == 1, (bad, e.stderr)
        assert (lines[0].startswith(f"aprilsim: error: --set {key}=")
                and "not a TOML value" in lines[0])
        assert why in lines[0], (bad, lines[0])
    word = cli("simulate", s, "--set", "cluster.preset=qwen3-4b-h100-tp2", "--json")  # a bare word
    assert word.exit_code == 0, word.output


def test_scheduler_at_knob_settings(tmp_path):
    s = scenario(tmp_path)
    r = cli("simulate", s, "-s", "april@ratio=1.5", "-s", "april", "--json")
    assert r.exit_code == 0, r.output
    rows = {x["scheduler"]: x for x in json.loads(r.stdout)}
    file_ratio = scenario(tmp_path, TINY + "[schedulers.april]\nratio = 1.5\n")
    ref = json.loads(cli("simulate", file_ratio, "-s", "april", "--json").stdout)[0]
    assert rows["april@ratio=1.5"]["rollout_throughput_tok_s"] == ref["rollout_throughput_tok_s"]
    assert rows["april@ratio=1.5"] != rows["april"]
    bad = cli("simulate", s, "-s", "april@recycle=maybe")
    assert bad.exit_code == 2 and "schedulers.april.recycle: expected true or false" in bad.stderr


def test_json_carries_what_reproduces_the_run(tmp_path):
    from aprilsim import __version__

    s = scenario(tmp_path)
    a = json.loads(cli("simulate", s, "--json", "--steps", "2").stdout)
    b = json.loads(cli("simulate", s, "--json", "--set", "cluster.engines=3").stdout)
    meta = a[0]["run"]
    assert meta["seed"] == 0 and meta["steps"] == 2 and meta["aprilsim_version"] == __version__
    assert meta["command"] == f"aprilsim simulate {s} --json --steps 2"
    assert len(meta["scenario_hash"]) == 16
    assert a[0]["run"]["scenario_hash"] == a[1]["run"]["scenario_hash"]
    assert b[0]["run"]["scenario_hash"] != meta["scenario_hash"]


def test_out_dir_holds_one_folder_per_run(tmp_path):
    s = scenario(tmp_path)
    out = tmp_path / "run1"
    r = cli("simulate", s, "--out", str(out), "--json")
    assert r.exit_code == 0, r.output
    assert {p.name for p in out.iterdir()} == {"scenario.toml", "summary.json", "table.txt",
                                               "sync", "april"}
    for name in ("sync", "april"):
        files = {p.name for p in (out / name).iterdir()}
        assert {"summary.json", "steps.jsonl", "trace.jsonl"} <= files
        assert "timeline.png" not in files  # opt-in: --out-timelines (it cost most of a run)
        steps = (out / name / "steps.jsonl").read_text().splitlines()
        assert len(steps) == 3 and json.loads(steps[0])["scheduler"] == name
    summary = json.loads((out / "summary.json").read_text())
    assert summary == json.loads(r.stdout)
    assert "vs sync" in (out / "table.txt").read_text()
    # the resolved scenario reruns to the same inputs
    again = json.loads(cli("simulate", str(out / "scenario.toml"), "--json").stdout)
    assert again[0]["run"]["scenario_hash"] == summary[0]["run"]["scenario_hash"]
    assert again[0]["rollout_throughput_tok_s"] == summary[0]["rollout_throughput_tok_s"]
    assert tomllib.loads((out / "scenario.toml").read_text())["cluster"]["engines"] == 2
    full = cli("simulate", s, "--out", str(out))
    assert full.exit_code == 2 and "not an empty folder" in full.stderr


def test_table_names_its_ratios_and_has_an_end_to_end_column(tmp_path):
    r = cli("simulate", scenario(tmp_path))
    head = r.stdout.splitlines()[1]
    assert "samples/s" in head and "tok/s vs sync" in head and "samples/s vs sync" in head
    assert " vs sync " not in head.replace("tok/s vs sync", "").replace("samples/s vs sync", "")


def test_schedulers_name_gives_meaning_and_allowed_values():
    r = cli("schedulers", "april")
    assert r.exit_code == 0
    assert "groups in flight / N" in r.stdout
    assert 'allowed: "fifo" (slime\'s default), "most_progress", "oldest_version"' in r.stdout
    rows = json.loads(cli("schedulers", "--json").stdout)
    for row in rows:  # every built-in knob has a meaning and its allowed values
        for k in row["knobs"]:
            assert k["meaning"] and k["allowed"], (row["name"], k)
    assert {r["name"] for r in rows} >= set(REGISTRY)
    assert sum(len(knobs(c)) for c in REGISTRY.values()) == sum(len(r["knobs"]) for r in rows)


def test_presets_print_units():
    r = cli("presets")
    assert r.exit_code == 0
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("qwen3-4b-h100-tp2"))
    for unit in (" s/request", " s/token", " tokens", " requests", "GPUs per engine"):
        assert unit in line, unit


def test_typos_get_did_you_mean(tmp_path):
    s = scenario(tmp_path, TINY.replace("steps = 3", "stpes = 3"))
    assert "did you mean 'steps'" in cli("simulate", s).stderr
    s = scenario(tmp_path, TINY + "[schedulers.april]\nrato = 3\n")
    assert "did you mean 'ratio'" in cli("simulate", s).stderr
    assert "did you mean 'april'" in cli("simulate", scenario(tmp_path), "-s", "aprl").stderr
    assert "did you mean 'simulate'" in cli("simulte").stderr
    s = scenario(tmp_path, TINY.replace("engines = 2", 'engines = 2\nrouter = "roundrobin"'))
    assert "did you mean 'round_robin'" in cli("simulate", s).stderr


def test_notebook_api_takes_the_same_scheduler_specs(tmp_path):
    import aprilsim

    s = scenario(tmp_path)
    res = aprilsim.simulate(s, schedulers=["april@ratio=1.5"], seeds=2)
    rows = res.rows()
    assert [(r["scheduler"], r["seed"]) for r in rows] == [("april@ratio=1.5", 0),
                                                          ("april@ratio=1.5", 1)]
    cli_row = json.loads(cli("simulate", s, "-s", "april@ratio=1.5", "--json").stdout)[0]
    assert rows[0]["rollout_throughput_tok_s"] == cli_row["rollout_throughput_tok_s"]


def test_the_default_first_run_is_settled_quick_and_what_the_readme_shows():
    """Issue 36 item 18: a new user's first `aprilsim simulate` printed "not settled ... run
    more --steps" for both schedulers. The default now runs 40 steps with 8 left out: both
    settle, in well under the time of a second CLI start, and the README's table is its output."""
    import re
    import time
    from pathlib import Path

    t0 = time.process_time()
    r = cli("simulate")
    cpu = time.process_time() - t0
    assert r.exit_code == 0 and "not settled" not in r.stdout + r.stderr
    assert cpu < 5.0  # ~0.7 s of simulation; loaded CI machines share cores
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = re.search(r"```\n(scheduler  rollout tok/s.*?)\n```", readme, re.S).group(1)
    assert block.strip() == "\n".join(r.stdout.strip().splitlines()[1:])
    rows = json.loads(cli("simulate", "--json").stdout)
    assert [row["settled"] for row in rows] == [True, True]
