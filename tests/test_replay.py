"""Trace replay: readers on files in slime's, verl's and a table's real shape, the replay
workload's rules, trained lengths equal to the log's, and offline validation on the example.

The example under tests/data/replay is made by tests/data/make_replay_logs.py: aprilsim's own
simulation of tests/data/replay/run.toml (a cluster 15 % slower than the preset, true_cost.toml),
APRIL for slime's dumps, sync for verl's and the table, logged times with 3 % noise.
"""

from __future__ import annotations

import json
import pickle
import shutil
import zipfile
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import event, given, settings
from hypothesis import strategies as st

from aprilsim.cli import main
from aprilsim.config import ScenarioError, load_scenario, scenario_from_dict
from aprilsim.validate.from_log import BatchRecorder
from aprilsim.validate.scaled import make_policy
from aprilsim.workload.replay import (
    CAVEAT,
    LoggedRow,
    ReplayExhausted,
    ReplayLogError,
    ReplaySpec,
    ReplayWorkload,
    RunLog,
    read_run_log,
)
from aprilsim.workload.replay.timing import read_step_times
from aprilsim.workload.replay.torch_pickle import load_torch_save

DATA = Path(__file__).resolve().parent / "data" / "replay"
SLIME = DATA / "slime" / "rollout_data"
VERL = DATA / "verl" / "rollout_data"
TOKENIZER = DATA / "verl" / "tokenizer.json"


def _scenario(lengths: dict, **over) -> object:
    """The example run's scenario with `lengths` replaced (paths absolute)."""
    base = load_scenario(DATA / "run.toml")
    data = base.model_dump(exclude={"base_dir"})
    data["lengths"] = lengths
    data.update(over)
    return scenario_from_dict(data, DATA)


def _trained(sc, scheduler: str):
    rec = BatchRecorder(make_policy(sc, scheduler))
    from aprilsim.sim.build import build_simulation

    sim = build_simulation(sc, rec)
    sim.run()
    return rec, sim.workload


# ------------------------------------------------------------------------------------ readers
def test_slime_dump_read_without_torch_equals_torch_load():
    torch = pytest.importorskip("torch")
    for f in sorted(SLIME.glob("*.pt")):
        assert load_torch_save(f) == torch.load(f, weights_only=True)


def test_slime_reader_fields():
    torch = pytest.importorskip("torch")
    run = read_run_log(SLIME)
    assert run.fmt == "slime" and run.steps == [0, 1, 2, 3, 4]
    assert (run.batch_size, run.group_size) == (8, 4)
    dumps = [torch.load(SLIME / f"{s}.pt", weights_only=True) for s in range(5)]
    by_prompt = {}
    for d in dumps:
        for s in d["samples"]:
            by_prompt.setdefault(s["group_index"], []).append(s)
    # prompt (draw) order: slime's group_index
    assert [g.key[1] for g in run.groups] == sorted(by_prompt)
    for g in run.groups:
        logged = by_prompt[g.key[1]]
        assert g.lengths == tuple(s["response_length"] for s in logged)
        assert g.prompt_len == len(logged[0]["tokens"]) - logged[0]["response_length"]
        assert g.rewards == tuple(s["reward"] for s in logged)
        assert g.resumed == sum("start_rollout_id" in s["metadata"] for s in logged)
    assert sum(g.resumed for g in run.groups) > 0  # APRIL's run resumed some responses
    assert "resumed from an earlier step" in run.describe()


def test_slime_reader_skips_eval_dumps_and_orders_by_step(tmp_path):
    for f in SLIME.glob("*.pt"):
        shutil.copy(f, tmp_path / f.name)
    shutil.copy(SLIME / "0.pt", tmp_path / "eval_0.pt")
    run = read_run_log(tmp_path, ReplaySpec(replay=str(tmp_path), order="step"))
    assert "1 evaluation dumps (*eval_N*.pt, e.g. eval_0.pt) skipped" in run.notes
    assert [g.step for g in run.groups] == sorted(g.step for g in run.groups)
    assert run.n_samples == read_run_log(SLIME).n_samples


def test_torch_pickle_never_runs_code(tmp_path, capsys):
    """A class or function the pickle names is never called: it becomes an Opaque placeholder
    (counted), so a dump's own objects are skipped and a hostile one does nothing."""
    from collections import Counter

    from aprilsim.workload.replay.torch_pickle import Opaque

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    p = tmp_path / "evil.pt"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("evil/data.pkl", pickle.dumps({"rollout_id": 0, "samples": [Evil()]},
                                                 protocol=2))
    seen: Counter = Counter()
    data = load_torch_save(p, seen)
    assert isinstance(data["samples"][0], Opaque) and data["samples"][0].origin == "builtins.print"
    assert seen == {"builtins.print": 1} and "pwned" not in capsys.readouterr().out
    with pytest.raises(ReplayLogError, match="sample 0 has no response_length"):
        read_run_log(p)
    (tmp_path / "plain.pt").write_bytes(b"not a zip")
    with pytest.raises(ReplayLogError, match="not a torch.save zip file"):
        load_torch_save(tmp_path / "plain.pt")


def test_torch_pickle_reads_tensors(tmp_path):
    torch = pytest.importorskip("torch")
    p = tmp_path / "3.pt"
    toks = torch.arange(30)
    torch.save({"rollout_id": 3, "samples": [
        {"group_index": 0, "index": 0, "tokens": toks, "response_length": 12,
         "reward": torch.tensor(0.5), "status": "completed", "metadata": {}},
        {"group_index": 0, "index": 1, "tokens": toks[5:], "response_length": 20,
         "reward": {"score": 1.0, "acc": True}, "status": "aborted", "metadata": {}}]}, p)
    run = read_run_log(p)
    (g,) = run.groups
    assert g.step == 3 and g.lengths == (12, 20) and g.prompt_len == 18 and g.rewards == (0.5, 1.0)
    assert any("1 responses logged as aborted" in n for n in run.notes)


def test_verl_reader_tokenises_text_like_the_run():
    run = read_run_log(VERL, ReplaySpec(replay=str(VERL), tokenizer=str(TOKENIZER)))
    table = read_run_log(DATA / "table.csv")  # the same sync run, lengths as numbers
    assert run.fmt == "verl" and run.steps == [1, 2, 3, 4, 5]
    assert any("re-tokenised" in n for n in run.notes)
    plus = read_run_log(VERL, ReplaySpec(replay=str(VERL), tokenizer=str(TOKENIZER), eos_tokens=1))
    assert [tuple(x - 1 for x in g.lengths) for g in plus.groups] == [g.lengths for g in run.groups]
    # verl's rows are shuffled within a step (balance_batch): groups are matched by prompt text
    for s_verl, s_tab in zip(run.steps, table.steps):
        a = sorted((g.prompt_len, sorted(g.lengths), sorted(g.rewards))
                   for g in run.groups_of(s_verl))
        b = sorted((g.prompt_len, sorted(g.lengths), sorted(g.rewards))
                   for g in table.groups_of(s_tab))
        assert a == b


def test_verl_reader_needs_token_counts(tmp_path):
    with pytest.raises(ReplayLogError, match="verl dumps hold decoded text, not token counts"):
        read_run_log(VERL, ReplaySpec(replay=str(VERL)))
    rows = [{"input": "q", "output": "a b", "score": 1.0, "step": 1, "response_length": 7,
             "prompt_length": 3}, {"input": "q", "output": "c", "score": 0.0, "step": 1,
                                   "response_length": 9, "prompt_length": 3}]
    (tmp_path / "1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (g,) = read_run_log(tmp_path).groups
    assert g.lengths == (7, 9) and g.prompt_len == 3 and g.rewards == (1.0, 0.0)


def test_table_reader_and_its_errors(tmp_path):
    run = read_run_log(DATA / "table.csv")
    assert run.fmt == "table" and run.n_samples == 160 and run.batch_size == 8
    (tmp_path / "nostep.csv").write_text("prompt_id,response_length\n1,5\n")
    with pytest.raises(ReplayLogError, match="replay needs a step column"):
        read_run_log(tmp_path / "nostep.csv")
    (tmp_path / "x.jsonl").write_text(json.dumps({"global_step": 2, "group_id": "a",
                                                  "usage": {"completion_tokens": 11}}) + "\n")
    (g,) = read_run_log(tmp_path / "x.jsonl").groups
    assert (g.step, g.lengths, g.prompt_len, g.rewards) == (2, (11,), None, None)
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    pq.write_table(pa.table({"step": [0, 0, 1], "prompt_id": [4, 4, 5],
                             "response_length": [10, 20, 30]}), tmp_path / "t.parquet")
    assert [g.lengths for g in read_run_log(tmp_path / "t.parquet").groups] == [(10, 20), (30,)]


def test_step_time_readers(tmp_path):
    slime = read_step_times(DATA / "slime" / "train.log")
    assert sorted(slime) == [0, 1, 2, 3, 4] and all(t > 0 for t in slime.values())
    verl = read_step_times(DATA / "verl" / "metrics.jsonl")
    assert sorted(verl) == [1, 2, 3, 4, 5]
    table = read_step_times(DATA / "table_times.csv")
    assert [table[k] for k in range(5)] == pytest.approx([verl[k + 1] for k in range(5)], abs=1e-6)
    (tmp_path / "console.log").write_text(
        "step:1 - actor/lr:1e-06 - timing_s/gen:12.5 - timing_s/step:30.0\n"
        "step:2 - timing_s/gen:11.25 - x:1\n")
    assert read_step_times(tmp_path / "console.log") == {1: 12.5, 2: 11.25}
    (tmp_path / "numpy.log").write_text("perf 0: {'perf/rollout_time': np.float64(3.5), 'a': 1}\n")
    assert read_step_times(tmp_path / "numpy.log") == {0: 3.5}
    (tmp_path / "wandb.csv").write_text(  # a wandb export of slime's run
        "_step,rollout/step,perf/rollout_time,perf/tokens_per_gpu_per_sec\n"
        "10,0,31.5,900\n11,1,29.0,950\n12,2,,\n")
    assert read_step_times(tmp_path / "wandb.csv") == {0: 31.5, 1: 29.0}
    (tmp_path / "none.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ReplayLogError, match="no per-step rollout times found"):
        read_step_times(tmp_path / "none.csv")


# ---------------------------------------------------------------------------- replay workload
def test_sync_replay_trains_the_log_step_by_step():
    """Done-when: a replayed scenario's trained lengths equal the log's exactly (sync)."""
    for lengths in ({"replay": "table.csv"}, {"replay": "slime/rollout_data"},
                    {"replay": "verl/rollout_data", "tokenizer": "verl/tokenizer.json"}):
        sc = _scenario(lengths)
        rec, wl = _trained(sc, "sync")
        log = wl.run.groups
        assert len(rec.batches) == sc.steps
        for k, (_step, groups) in enumerate(rec.batches):
            expect = log[k * sc.batch_size:(k + 1) * sc.batch_size]
            groups = sorted(groups, key=lambda g: g.prompt_key)  # closed in finishing order
            assert [g.prompt_key for g in groups] == list(range(k * 8, (k + 1) * 8))
            assert ([tuple(s.generated for s in g.samples) for g in groups]
                    == [e.lengths for e in expect])
            assert [g.prompt_len for g in groups] == [e.prompt_len for e in expect]
            assert ([tuple(s.reward for s in g.samples) for g in groups]
                    == [e.rewards for e in expect])
        if lengths["replay"] == "table.csv":  # a sync log in step order: the run's own batches
            assert [{e.key for e in wl.run.groups_of(s)} for s in wl.run.steps] == [
                {log[g.prompt_key].key for g in groups} for _, groups in rec.batches]


def test_april_replay_trains_logged_lengths_exactly():
    """Done-when, for APRIL: every trained response has its logged length (resumed ones with
    all their segments), every trained group is a logged group, none twice unless wrapped."""
    sc = _scenario({"replay": "slime/rollout_data"})
    rec, wl = _trained(sc, "april")
    log = wl.run.groups
    seen = Counter()
    resumed = 0
    for _, groups in rec.batches:
        assert len(groups) == sc.batch_size
        for g in groups:
            seen[g.prompt_key] += 1
            assert tuple(s.generated for s in g.samples) == log[g.prompt_key].lengths
            assert g.prompt_len == log[g.prompt_key].prompt_len
            resumed += sum(len(s.segments) > 1 for s in g.samples)
    assert resumed > 0  # APRIL aborted and resumed some responses in the replay too
    assert wl.drawn > len(log) and wl.wrapped == wl.drawn - len(log)
    assert max(seen.values()) <= 2  # a prompt is trained again only after the log wrapped


def test_common_random_numbers_across_schedulers():
    sc = _scenario({"replay": "slime/rollout_data"})
    drawn = {}
    for name in ("sync", "april", "tail_batching", "async_one_step", "dynamic_sampling",
                 "fully_async"):
        _, wl = _trained(sc, name)
        assert wl.drawn >= 40
        drawn[name] = wl
    ref = ReplayWorkload(read_run_log(SLIME), max_len=1024).generate(40)
    for wl in drawn.values():
        again = ReplayWorkload(wl.run, max_len=1024).generate(40)
        assert [[s._target_len for s in g.samples] for g in again] == \
            [[s._target_len for s in g.samples] for g in ref]


def test_exhausted_stop_and_wrap(caplog):
    run = read_run_log(DATA / "table.csv")
    stop = ReplayWorkload(run, max_len=1024, exhausted="stop")
    stop.generate(40)
    with pytest.raises(ReplayExhausted, match="asked for group 41 but .* holds 40 groups"):
        stop.generate(1)
    wrap = ReplayWorkload(run, max_len=1024, exhausted="wrap")
    first = wrap.generate(3)
    wrap.generate(37)
    with caplog.at_level("WARNING", logger="aprilsim.replay"):
        again = wrap.generate(3)
    assert "all 40 logged groups used" in caplog.text
    assert [[s._target_len for s in g.samples] for g in again] == \
        [[s._target_len for s in g.samples] for g in first]
    assert len({g.gid for g in first + again}) == 6  # new groups, same prompts
    assert "3 of them repeat the log" in wrap.usage()
    sc = _scenario({"replay": "table.csv", "exhausted": "stop"})
    from aprilsim.sim.run import simulate

    with pytest.raises(ReplayExhausted, match="lengths.exhausted"):
        simulate(sc, "april")
    assert simulate(sc, "sync").steps  # sync needs exactly the logged groups


def test_more_responses_than_logged_regenerate_and_cap():
    run = read_run_log(DATA / "table.csv")
    wl = ReplayWorkload(run, max_len=100)
    (g,) = wl.generate(1, group_size=6)
    logged = run.groups[0].lengths
    assert [s._target_len for s in g.samples] == [min(logged[i % 4], 100) for i in range(6)]
    assert wl.stretched == 1 and wl.n_capped == sum(x > 100 for gg in run.groups
                                                    for x in gg.lengths)
    (r,) = wl.regenerate([g], 0, 3)
    assert [s._target_len for s in r.samples] == [s._target_len for s in g.samples[:3]]
    assert r.prompt_key == g.prompt_key and r.gid != g.gid and wl.drawn == 1
    with pytest.raises(ValueError, match="cannot regenerate 7 samples"):
        wl.regenerate([g], 0, 7)


def test_missing_prompts_and_rewards_are_drawn_by_log_index(tmp_path):
    p = tmp_path / "bare.csv"
    p.write_text("step,prompt_id,response_length\n" + "".join(
        f"{s},{s * 10 + k},{50 + s + k + i}\n"
        for s in range(3) for k in range(4) for i in range(2)))
    a = _scenario({"replay": str(p)}, seed=5).workload_for()
    b = _scenario({"replay": str(p)}, seed=5).workload_for()
    c = _scenario({"replay": str(p)}, seed=6).workload_for()
    ga, gb, gc = a.generate(12), b.generate(12), c.generate(12)
    assert [g.prompt_len for g in ga] == [g.prompt_len for g in gb] != [g.prompt_len for g in gc]
    assert ([[s._reward for s in g.samples] for g in ga]
            == [[s._reward for s in g.samples] for g in gb])
    assert ([[s._target_len for s in g.samples] for g in ga]
            == [[s._target_len for s in g.samples] for g in gc])
    assert all(s._reward in (0.0, 1.0) for g in ga for s in g.samples)
    # group i's draws are the seeded generator's for prompt i: independent of the other groups
    fb = _scenario({"family": "lognormal", "mu": 5.0, "sigma": 0.5}, seed=5).workload_for()
    for i in (0, 7, 11):
        fb._next_prompt = i
        (one,) = fb.generate(1, 0, group_size=2)
        assert one.prompt_len == ga[i].prompt_len
        assert [s._reward for s in one.samples] == [s._reward for s in ga[i].samples]


def test_scenario_errors_are_one_line():
    with pytest.raises(ScenarioError,
                       match=r"^lengths.exhausted: Input should be 'wrap' or 'stop'"):
        _scenario({"replay": "table.csv", "exhausted": "never"})
    with pytest.raises(ScenarioError, match=r"^lengths.colour: unknown key"):
        _scenario({"replay": "table.csv", "colour": 1})
    with pytest.raises(ScenarioError, match=r"^lengths.replay: .*nope.csv: no such file"):
        _scenario({"replay": "nope.csv"})


REACHED: Counter = Counter()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5), st.integers(0, 300)),
                min_size=1, max_size=60),
       st.lists(st.integers(1, 7), min_size=1, max_size=12), st.sampled_from(["step", "prompt"]))
def test_replay_hands_out_the_log_in_any_chunking(rows, chunks, order):
    """Whatever chunks a scheduler asks in, group j is the log's group j (common random numbers),
    with its lengths (capped) and all logged responses kept."""
    log = RunLog.from_rows([LoggedRow(step=s, key=("group", k), length=n, prompt_len=10 + k)
                            for s, k, n in rows], order=order)
    per = Counter((s, k) for s, k, _ in rows)
    assert sorted((g.step, g.key[1], g.size) for g in log.groups) == sorted(
        (s, k, n) for (s, k), n in per.items())
    assert sorted(x for g in log.groups for x in g.lengths) == sorted(n for _, _, n in rows)
    cap = 200
    wl = ReplayWorkload(log, max_len=cap, fallback=load_scenario(DATA / "run.toml").workload_for())
    got = []
    for c in chunks:
        got += wl.generate(c)
    want = [log.groups[j % len(log.groups)] for j in range(len(got))]
    assert [[s._target_len for s in g.samples] for g in got] == [
        [min(x, cap) for x in w.lengths] for w in want]
    assert [g.prompt_key for g in got] == [j % len(log.groups) for j in range(len(got))]
    REACHED["examples"] += 1
    for name, hit in (("wrapped", wl.wrapped > 0), ("capped", wl.n_capped > 0),
                      ("several steps", len(log.steps) > 1), ("prompt order", order == "prompt"),
                      ("a prompt in two steps",
                       len({(g.key) for g in log.groups}) < len(log.groups))):
        if hit:
            event(name)
            REACHED[name] += 1


def test_replay_property_reached_its_cases():
    if REACHED["examples"] < 30:
        pytest.skip("the property test did not run first")
    for name in ("wrapped", "capped", "several steps", "prompt order", "a prompt in two steps"):
        assert REACHED[name] >= 3, (name, REACHED)


# -------------------------------------------------------------------------- commands, offline
def test_simulate_replay_prints_what_and_the_caveat():
    r = CliRunner().invoke(main, ["simulate", str(DATA / "replay.toml"), "--json"])
    assert r.exit_code == 0, r.output
    assert CAVEAT in r.stderr and "92 responses resumed from an earlier step" in r.stderr
    assert "more groups than logged: wrap" in r.stderr
    rows = json.loads(r.stdout)
    assert [x["scheduler"] for x in rows] == ["sync", "april"]
    assert "the scenario trains batch_size" not in r.stderr  # the example matches its log
    from aprilsim.workload.replay.spec import scenario_notes

    notes = scenario_notes(_scenario({"replay": "table.csv"}, batch_size=4, group_size=2))
    assert any("the log's steps hold 8 groups x 4 responses; the scenario trains batch_size 4"
               in n for n in notes)


def test_replay_validate_on_the_shipped_example(tmp_path):
    """Done-when: `replay-validate` produces a report on the shipped example; with the run's true
    cost, the replayed sync steps reproduce the run's (unperturbed) rollout times exactly."""
    from aprilsim.validate.synth_log import synthesize, write_table

    out = tmp_path / "rep"
    r = CliRunner().invoke(main, [
        "replay-validate", str(VERL), "--scenario", str(DATA / "run.toml"), "-s", "sync",
        "--tokenizer", str(TOKENIZER), "--timing", str(DATA / "verl" / "metrics.jsonl"),
        "--out", str(out), "-c", "april", "--no-figures"])
    assert r.exit_code == 0, r.output
    rep = json.loads((out / "report.json").read_text())
    (s,) = rep["schedulers"]
    logged = read_step_times(DATA / "verl" / "metrics.jsonl")
    assert s["per_step"]["measured_rollout_s"] == pytest.approx([logged[k] for k in range(1, 6)])
    assert len(s["per_step"]["predicted_rollout_s"]) == 5
    assert s["errors"]["step_rollout_median_abs"] is not None
    assert s["measured"]["offpolicy_token_fraction"] is None
    md = (out / "report.md").read_text()
    assert "| 0 / n/a (n/a) |" in md and "given, not fitted here" in md
    assert "counterfactual april:" in r.stdout and "per-step error" in r.stdout
    # a log that keeps the run's order, made now: the replayed steps are the run's, exactly
    true = synthesize(load_scenario(DATA / "run.toml"), "sync", noise=0.03, noise_seed=2)
    write_table(true, tmp_path / "t.csv", tmp_path / "t_times.csv")
    r = CliRunner().invoke(main, [
        "replay-validate", str(tmp_path / "t.csv"), "--scenario", str(DATA / "run.toml"), "-s",
        "sync", "--timing", str(tmp_path / "t_times.csv"), "--out", str(out), "--no-figures",
        "--force"])
    assert r.exit_code == 0, r.output
    (s,) = json.loads((out / "report.json").read_text())["schedulers"]
    assert s["per_step"]["predicted_rollout_s"] == pytest.approx(true.true_rollout_s, rel=1e-9)
    assert s["per_step"]["measured_rollout_s"] == pytest.approx(true.rollout_s, rel=1e-5)
    assert s["errors"]["step_rollout_median_abs"] < 0.06  # the 3 % noise alone
    # the default preset is 15 % faster than the run's cluster: the report shows the bias
    r = CliRunner().invoke(main, [
        "replay-validate", str(DATA / "table.csv"), "--scenario", str(DATA / "run.toml"), "-s",
        "sync", "--timing", str(DATA / "table_times.csv"), "--preset", "qwen3-4b-h100-tp2",
        "--out", str(out), "--no-figures", "--force"])
    assert r.exit_code == 0, r.output
    e = json.loads((out / "report.json").read_text())["schedulers"][0]["errors"]
    assert -0.2 < e["step_rollout_median"] < -0.08


def test_replay_validate_errors_are_one_line(tmp_path):
    runner = CliRunner()
    r = runner.invoke(main, ["replay-validate", str(DATA / "table.csv"), "--out", str(tmp_path)])
    assert r.exit_code == 2 and "say which scheduler the run used" in r.stderr
    r = runner.invoke(main, ["replay-validate", str(DATA / "table.csv"), "-s", "sync",
                             "--out", str(tmp_path)])
    assert r.exit_code == 2 and "no per-step rollout times" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 + r.stderr.count("aprilsim: replay") + \
        r.stderr.count("aprilsim: note:")


def test_unlogged_prompts_run_to_the_cap(tmp_path):
    """slime's group_index has gaps where the run drew a prompt it never trained (in flight when
    it stopped): `unlogged = "cap"` puts responses that run to max_len there. Before the first
    such prompt was drawn, the replayed APRIL run is the logged one, to float precision."""
    torch = pytest.importorskip("torch")
    from aprilsim.sim.run import simulate
    from aprilsim.validate.synth_log import slime_dumps, synthesize

    truth = synthesize(load_scenario(DATA / "run.toml"), "april", noise=0.0)
    (tmp_path / "rd").mkdir()
    for d in slime_dumps(truth)[0]:
        torch.save(d, tmp_path / "rd" / f"{d['rollout_id']}.pt")
    run = read_run_log(tmp_path / "rd")
    have = {g.key[1] for g in run.groups}
    gaps = sorted(set(range(max(have) + 1)) - have)
    assert gaps  # APRIL left prompts in flight
    first_gap_step = min(truth.drawn_step[k] for k in gaps)  # may be 0: nothing exact then
    sc = _scenario({"replay": str(tmp_path / "rd"), "unlogged": "cap"})
    wl = sc.workload_for()
    assert wl.n_unlogged == len(gaps) and len(wl.groups) == max(have) + 1
    for k in gaps:
        assert wl.groups[k].key == ("unlogged", k) and wl.groups[k].lengths == (1024,) * 4
    got = {}
    for mode in ("skip", "cap"):
        got[mode] = [s.rollout_time_s for s in simulate(
            _scenario({"replay": str(tmp_path / "rd"), "unlogged": mode}), "april").steps]
        assert got[mode][:first_gap_step] == pytest.approx(truth.true_rollout_s[:first_gap_step],
                                                           rel=1e-9)
    assert got["skip"] != got["cap"]
    # "draw": the gaps' responses drawn from the logged lengths, keyed by prompt and response
    a, b, c = (_scenario({"replay": str(tmp_path / "rd"), "unlogged": "draw"},
                         seed=sd).workload_for()
               for sd in (1, 1, 2))
    pool = {x for g in run.groups for x in g.lengths}
    assert all(set(a.groups[k].lengths) <= pool for k in gaps)
    assert [a.groups[k].lengths for k in gaps] == [b.groups[k].lengths for k in gaps] != [
        c.groups[k].lengths for k in gaps]
    # a log without gaps (sync) is replayed alike either way
    same = [[s.rollout_time_s for s in simulate(_scenario(
        {"replay": "table.csv", "order": "prompt", "unlogged": m}), "sync").steps]
        for m in ("skip", "cap")]
    assert same[0] == same[1]
    with pytest.raises(ScenarioError, match="needs the groups in prompt order"):
        _scenario({"replay": "slime/rollout_data", "unlogged": "cap", "order": "step"})


def test_the_worked_example_in_the_docs_is_what_the_commands_print(tmp_path, monkeypatch):
    """docs/replay.md's worked example: its commands run on the shipped example and print the
    lines it quotes (numbers as of the commit that wrote the page)."""
    import re
    import shlex

    page = (Path(__file__).resolve().parents[1] / "docs" / "replay.md").read_text()
    block = page.split("## A worked example", 1)[1].split("## Engine-level", 1)[0]
    commands, lines = [], iter(block.splitlines())
    for ln in lines:
        if ln.startswith("$ "):
            cmd = ln[2:]
            while cmd.endswith("\\"):
                cmd = cmd[:-1] + next(lines).strip()
            commands.append(shlex.split(cmd.split("&& ")[-1])[1:])
    quoted = [ln for ln in block.splitlines()
              if re.match(r"^(sync|april) +[\d,]+ |^\w+: rollout ", ln)]
    assert len(commands) >= 5 and len(quoted) >= 6
    monkeypatch.chdir(DATA)
    printed = ""
    for args in commands:
        if args[0] == "sweep":
            continue  # writes a results file; sweeps are covered by tests/test_sweep.py
        if "--out" in args:
            args[args.index("--out") + 1] = str(tmp_path / f"out{len(printed)}")
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 0, (args, r.output)
        printed += r.stdout
    # the quoted lines are the output at the commit that wrote the page; a later engine or
    # scheduler change may move their numbers, not their shape
    num = re.compile(r"[-+]?\d[\d,]*\.?\d*%?")
    out_lines = printed.splitlines()
    for ln in quoted:
        label = ln.split()[0]
        same = [o for o in out_lines if o.split() and o.split()[0] == label
                and len(num.findall(o)) == len(num.findall(ln))]
        assert same, ln


def test_slime_any_path_template_and_run_config(tmp_path):
    """`--save-debug-rollout-data /x/rollout_{rollout_id}.pt`: the step is the dump's rollout_id;
    `--from-slime SCRIPT` names the run's scheduler (APRIL for a partial-rollout script)."""
    for f in SLIME.glob("*.pt"):
        shutil.copy(f, tmp_path / f"rollout_{f.name}")
    assert read_run_log(tmp_path).groups == read_run_log(SLIME).groups
    out = tmp_path / "rep"
    script = DATA.parent / "april-grpo-run-qwen3-4B-dapo-partial.sh"
    r = CliRunner().invoke(main, ["replay-validate", str(SLIME), "--from-slime", str(script),
                                  "--timing", str(DATA / "slime" / "train.log"), "--out", str(out),
                                  "--no-figures"])
    assert r.exit_code == 0, r.output
    (s,) = json.loads((out / "report.json").read_text())["schedulers"]
    assert s["label"] == "april" and len(s["per_step"]["measured_rollout_s"]) == 5


def test_sweep_accepts_a_replay_scenario(tmp_path):
    """Counterfactual ratios on the same logged responses: every point sees the same log."""
    pd = pytest.importorskip("pandas")
    out = tmp_path / "r.parquet"
    r = CliRunner().invoke(main, ["sweep", str(DATA / "replay.toml"), "--grid",
                                  "schedulers.april.ratio=1.5,3", "-s", "sync", "-s", "april",
                                  "--seeds", "1", "--jobs", "1", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert CAVEAT in r.stderr
    df = pd.read_parquet(out)
    assert set(df["scheduler"]) == {"sync", "april"} and len(df) == 4
    sync = df[df["scheduler"] == "sync"]["rollout_throughput_tok_s"]
    assert sync.nunique() == 1  # sync does not depend on APRIL's ratio: the same list both times


def test_validate_from_log_is_replay_validate(tmp_path):
    """`aprilsim validate SCENARIO --from-log RUN` runs the offline validation (no engines)."""
    from aprilsim.replay_cli import from_log_args

    assert from_log_args(["run.toml", "--from-log", "log.csv", "-s", "sync", "--out", "o"]) == [
        "replay-validate", "log.csv", "-s", "sync", "--out", "o", "--scenario", "run.toml"]
    assert from_log_args(["--from-log=x", "--no-figures"]) == ["replay-validate", "x",
                                                                "--no-figures"]
    out = tmp_path / "rep"
    r = CliRunner().invoke(main, ["validate", str(DATA / "run.toml"), "--from-log",
                                  str(DATA / "table.csv"), "-s", "sync", "--timing",
                                  str(DATA / "table_times.csv"), "--out", str(out), "--no-figures"])
    assert r.exit_code == 0, r.output
    assert "sync: rollout" in r.stdout and (out / "report.md").exists()


PICKLE_REACHED: Counter = Counter()
_plain = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False)
    | st.text(max_size=5),
    lambda kids: (st.lists(kids, max_size=4)
                  | st.dictionaries(st.text(max_size=3), kids, max_size=4)),
    max_leaves=12)


@settings(max_examples=40, deadline=None)
@given(_plain, st.lists(st.tuples(st.sampled_from(["float32", "float64", "int64", "int32", "bool",
                                                     "uint8", "bfloat16"]),
                                   st.lists(st.integers(0, 3), min_size=0, max_size=3),
                                   st.booleans()), max_size=3))
def test_torch_free_reader_matches_torch_load(tmp_path_factory, plain, tensors):
    """Plain values come back equal; tensors as numpy arrays with torch's values (or, for dtypes
    numpy lacks and strided views, a stub with the shape)."""
    torch = pytest.importorskip("torch")
    obj = {"plain": plain, "tensors": []}
    for dtype, shape, transpose in tensors:
        t = (torch.arange(int(torch.tensor(shape).prod()) if shape else 1) % 3).to(
            getattr(torch, dtype))
        t = t.reshape(shape)
        if transpose and t.dim() == 2:
            t = t.t()
            PICKLE_REACHED["strided"] += 1
        obj["tensors"].append(t)
    p = tmp_path_factory.mktemp("pt") / "x.pt"
    torch.save(obj, p)
    got = load_torch_save(p)
    assert got["plain"] == torch.load(p, weights_only=True)["plain"]
    for t, g in zip(obj["tensors"], got["tensors"]):
        if hasattr(g, "dtype"):
            assert list(g.shape) == list(t.shape)
            assert g.tolist() == t.tolist()
            event("tensor read as numpy")
            PICKLE_REACHED["numpy"] += 1
        else:
            assert g.shape == tuple(t.shape)
            event("tensor as a stub")
            PICKLE_REACHED["stub"] += 1
    PICKLE_REACHED["examples"] += 1


def test_torch_free_reader_property_reached_its_cases():
    if PICKLE_REACHED["examples"] < 20:
        pytest.skip("the property test did not run first")
    assert PICKLE_REACHED["numpy"] >= 5 and PICKLE_REACHED["stub"] >= 2, PICKLE_REACHED


def test_replay_validate_help_starts_light():
    """`aprilsim replay-validate --help` loads neither pydantic nor scipy (the start-up rule)."""
    import subprocess
    import sys

    code = ("import sys, json\nfrom aprilsim.cli import main\ntry:\n    main(['replay-validate', "
            "'--help'])\nexcept SystemExit:\n    pass\nprint(json.dumps(sorted({m.split('.')[0] "
            "for m in sys.modules})))")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root,
                         env={**__import__("os").environ, "PYTHONPATH": str(root)}, timeout=120)
    mods = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert "click" in mods and not mods & {"pydantic", "scipy", "torch", "pandas", "real"}
