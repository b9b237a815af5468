"""The live runner on in-process bundled engines: the simulator's accounting, the CLI, free mode,
an engine dying mid-rollout, every engine gone."""

from __future__ import annotations

import asyncio
import json

import pytest
from click.testing import CliRunner
from runner_helpers import (
    LOCAL_VOCAB,
    assert_batches,
    assert_ledger,
    live_run,
    local_spec,
    run_local,
    tiny_scenario,
)

from aprilsim.cli import main
from aprilsim.metrics.trace import Trace
from aprilsim.sim.run import simulate
from real.runner.cluster import AllEnginesDown, Cluster
from real.runner.local import start_local

TINY_TOML = """
name = "tiny-live"
steps = 2
warmup_steps = 0
batch_size = 3
group_size = 2
max_response_len = 40
compare = ["sync", "april"]
[cluster]
engines = 2
[trainer]
base_s = 0.01
per_token_s = 0.0
sync_s = 0.01
[lengths]
family = "lognormal"
mu = 2.8
sigma = 0.5
[prompts]
family = "lognormal"
mu = 2.3
sigma = 0.3
max_len = 24
"""

SAME_AS_SIM = ("trained_groups", "trained_samples", "trained_tokens", "trained_prompt_tokens",
               "generated_tokens", "truncated_samples", "staleness", "offpolicy_tokens",
               "wasted_tokens", "discarded_samples", "resumed_tokens", "partial_samples",
               "workload_mean_length")


def test_sync_live_does_what_the_simulation_does():
    """Same seed, same groups: the live sync run trains and generates exactly the simulated
    tokens, step by step, and ends with the same ledger."""
    sc = tiny_scenario()
    live = run_local(sc, "sync")
    sim = simulate(sc, "sync")
    assert_ledger(live)
    assert_batches(live)
    for a, b in zip(live.run.result.steps, sim.steps, strict=True):
        assert {k: getattr(a, k) for k in SAME_AS_SIM} == {k: getattr(b, k) for k in SAME_AS_SIM}
        assert a.rollout_time_s > 0 and a.busy_time_s > 0 and len(a.busy_by_engine_s) == 2
    assert live.run.result.end_state == sim.end_state
    assert list(live.run.result.summary()) == list(sim.summary())


def test_cli_prints_the_keys_of_simulate(tmp_path):
    scenario = tmp_path / "tiny.toml"
    scenario.write_text(TINY_TOML)
    steps_out, trace = tmp_path / "steps.jsonl", tmp_path / "trace.jsonl"
    runner = CliRunner()
    res = runner.invoke(main, ["run", str(scenario), "--local", "2", "-s", "sync", "-s", "april",
                               "--json", "--steps-out", str(steps_out), "--trace", str(trace)])
    assert res.exit_code == 0, res.output
    live = json.loads(res.stdout)
    sim = json.loads(runner.invoke(main, ["simulate", str(scenario), "-s", "sync", "-s", "april",
                                          "--json"]).stdout)
    assert [list(r) for r in live] == [list(r) for r in sim]
    assert [r["scheduler"] for r in live] == ["sync", "april"]
    rows = [json.loads(line) for line in steps_out.read_text().splitlines()]
    assert len(rows) == 4 and set(rows[0]) >= {"scheduler", "warmup", "step", "rollout_time_s"}
    for name in ("sync", "april"):
        tr = Trace.read(tmp_path / f"trace_{name}.jsonl")
        assert tr.source == "live" and tr.scheduler == name and tr.requests and tr.phases
        # every abort's span is kept (validate's abort latency): sent before its requests ended
        aborts = [p for p in tr.phases if p.phase == "abort"]
        aborted = [r for r in tr.requests if r.reason == "abort"]
        assert bool(aborts) == bool(aborted) == (name == "april")
        assert all(p.end_s >= p.start_s for p in aborts)
        if aborts:
            assert min(p.start_s for p in aborts) <= min(r.end_s for r in aborted)
        assert all(r.end_s >= r.submit_s for r in tr.requests)
        assert sum(r.tokens for r in tr.requests) == sum(
            x["generated_tokens"] for x in rows if x["scheduler"] == name) or name == "april"
    assert "tokens/s" in res.stderr and "ms/request" in res.stderr


def test_cli_usage_errors(tmp_path):
    runner = CliRunner()
    res = runner.invoke(main, ["run", "--steps", "1"])
    assert res.exit_code == 2 and "exactly one of" in res.stderr
    res = runner.invoke(main, ["run", "--local", "1", "--reward", "toy"])
    assert res.exit_code == 2 and "--prompts" in res.stderr


def test_free_mode_logs_lengths_that_fit_reads(tmp_path):
    from aprilsim.workload.fitting.readers import read_lengths

    scenario = tmp_path / "tiny.toml"
    scenario.write_text(TINY_TOML)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in (
        {"prompt": "1+1="}, {"input_ids": [20, 21, 22, 23]}, {"prompt": "two", "answer": "2"})))
    lengths = tmp_path / "lengths.jsonl"
    res = CliRunner().invoke(main, ["run", str(scenario), "--local", "1", "-s", "sync",
                                    "--prompts", str(prompts), "--lengths-out", str(lengths),
                                    "--eos-id", "2", "--eos-id", "17", "--eos-id", "18",
                                    "--json"])
    assert res.exit_code == 0, res.output
    row = json.loads(res.stdout)[0]
    assert row["trained_samples"] == 2 * 3 * 2
    logged = [json.loads(line) for line in lengths.read_text().splitlines()]
    assert len(logged) >= 12 and all(1 <= r["response_length"] <= 40 for r in logged)
    assert {r["reward"] for r in logged} <= {0.0, 1.0}
    assert any(r["finish_reason"] == "stop" for r in logged)  # EOS decided some lengths
    data = read_lengths(lengths)
    assert data.n == len(logged)


def _kill(worker) -> None:
    """An in-process engine dies: its step loop is cancelled (in-flight requests come back 503)."""
    worker.inner.runner._task.cancel()


def test_engine_dying_mid_rollout_loses_nothing():
    """One of two engines dies with requests in flight: their partial output is kept, the rest
    goes to the other engine, the run finishes with the simulator's accounting."""
    sc = tiny_scenario(max_len=64, steps=2)

    async def main():
        workers = await start_local(2, local_spec(step_s=0.004))
        cluster = Cluster(workers)

        async def killer():
            while cluster.slots[0].outstanding < 3 or workers[0].engine.generated_total < 40:
                await asyncio.sleep(0.005)
            _kill(workers[0])

        k = asyncio.create_task(killer())
        try:
            return await live_run(sc, "sync", cluster, trace=Trace("sync", 2, source="live"))
        finally:
            k.cancel()
            await cluster.close()

    live = asyncio.run(main())
    faults = live.run.faults
    assert faults and {f.kind for f in faults} == {"engine_died"}
    assert all(f.engine == "local-0" for f in faults)
    assert_ledger(live)
    assert_batches(live)
    failed = [r for r in live.run.runtime.trace.requests if r.reason == "failed"]
    assert failed and any(r.tokens > 0 for r in failed)  # partial output kept, then resumed
    sim = simulate(sc, "sync")
    for a, b in zip(live.run.result.steps, sim.steps, strict=True):
        assert a.trained_tokens == b.trained_tokens and a.generated_tokens == b.generated_tokens


def test_all_engines_gone_stops_the_run():
    sc = tiny_scenario(max_len=64, steps=3)

    async def main():
        workers = await start_local(1, local_spec(step_s=0.004))
        cluster = Cluster(workers)

        async def killer():
            while workers[0].engine.generated_total < 60:
                await asyncio.sleep(0.005)
            _kill(workers[0])

        k = asyncio.create_task(killer())
        try:
            from real.runner.api import build_runtime

            rt = build_runtime(sc, "april", cluster, vocab_size=LOCAL_VOCAB)
            with pytest.raises(AllEnginesDown):
                await rt.run()
            return rt, await rt.final_drain()
        finally:
            k.cancel()
            await cluster.close()

    rt, end = asyncio.run(main())
    assert end["samples_running"] == 0
    assert end["engine_tokens"] == sum(v for k, v in end.items() if k.startswith("tokens_"))
    assert rt.faults and rt.faults[-1].kind == "engine_died"


def test_trainer_callable_and_checkpoint_updates(tmp_path):
    """A user trainer gets each batch; every weight update loads the checkpoint and bumps the
    version on every engine (disaggregated, pausing generation during the sync)."""
    import torch

    from real.torch_engine import ModelConfig, TinyDecoder

    calls: list[tuple[int, int]] = []

    async def train(groups, step):
        calls.append((step, len(groups)))

    spec = local_spec()
    cfg = ModelConfig(vocab_size=spec.vocab_size, d_model=spec.d_model, n_layers=spec.n_layers,
                      n_heads=spec.n_heads, max_context=spec.max_context)
    TinyDecoder.random(cfg, seed=7).save(tmp_path / "ckpt")

    async def main():
        workers = await start_local(2, spec)
        cluster = Cluster(workers)
        try:
            case = await live_run(tiny_scenario(steps=2), "async_one_step", cluster,
                                  train_fn=train, checkpoint=str(tmp_path / "ckpt"))
            return case, workers, [await w.weight_version() for w in workers]
        finally:
            await cluster.close()

    case, workers, versions = asyncio.run(main())
    assert calls == [(0, 4), (1, 4)]
    assert versions == ["2", "2"]
    ref = TinyDecoder.load(tmp_path / "ckpt").state_dict()
    for w in workers:
        got = w.engine.model.state_dict()
        assert all(torch.equal(v, got[k]) for k, v in ref.items())
    assert_ledger(case)
