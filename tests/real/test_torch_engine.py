"""The bundled torch engine: KV-cache correctness, continuous batching, admission, abort."""

from __future__ import annotations

import asyncio

import pytest
import torch
from conftest import run
from real_scenarios import scenario_abort_and_resume, scenario_generate_replay

from aprilsim.types import FinishReason
from real.protocol import Engine, GenerateRequest, SamplingParams
from real.torch_engine import BatchEngine, EngineConfig, EngineRequest, ModelConfig, TinyDecoder
from real.torch_engine.local import LocalEngine

CFG = ModelConfig(vocab_size=128, d_model=64, n_layers=2, n_heads=4, max_context=512)


@pytest.fixture(scope="module")
def model() -> TinyDecoder:
    return TinyDecoder.random(CFG, seed=3)


def _drain(engine: BatchEngine, max_steps: int = 10_000):
    finished, kinds = {}, []
    for _ in range(max_steps):
        if not engine.has_work:
            break
        out = engine.step()
        kinds.append((out.kind, len(engine.running)))
        for f in out.finished:
            finished[f.rid] = f
    assert not engine.has_work
    return finished, kinds


def test_batched_cached_decode_matches_full_forward(model):
    """Greedy outputs of continuous batching with the KV cache == a cache-free reference."""
    eng = BatchEngine(model, EngineConfig(max_running_requests=3))
    reqs = [EngineRequest(f"r{i}", [(7 * i + j) % 100 + 16 for j in range(5 + 3 * i)], 12,
                          ignore_eos=True, temperature=0.0) for i in range(5)]
    for r in reqs:
        eng.add(r)
    finished, _ = _drain(eng)
    for r in reqs:
        ids = list(r.prompt_ids)
        for _ in range(12):
            ids.append(int(model.forward_full(torch.tensor(ids))[-1].argmax()))
        assert finished[r.rid].output_ids == ids[len(r.prompt_ids):]
        assert finished[r.rid].reason == {"type": "length", "length": 12}


def test_admission_respects_max_running_and_kv_budget(model):
    eng = BatchEngine(model, EngineConfig(max_running_requests=4, kv_budget_tokens=100))
    for i in range(6):  # each needs 10 + 20 = 30 KV tokens: the budget admits 3, not 4
        eng.add(EngineRequest(f"r{i}", [20 + i] * 10, 20, ignore_eos=True))
    finished, kinds = _drain(eng)
    assert max(n for _, n in kinds) == 3
    assert all(len(f.output_ids) == 20 for f in finished.values())
    assert eng.reserved_tokens == 0 and len(eng.pool.free) == 4
    eng2 = BatchEngine(model, EngineConfig(max_running_requests=2))
    for i in range(5):
        eng2.add(EngineRequest(f"r{i}", [20] * 4, 6, ignore_eos=True))
    _, kinds2 = _drain(eng2)
    assert max(n for _, n in kinds2) == 2
    # prefill first, then decode: each admission is a prefill step, the rest decode
    assert [k for k, _ in kinds2].count("prefill") == 3


def test_requests_that_never_fit_are_rejected(model):
    eng = BatchEngine(model, EngineConfig(max_running_requests=2, kv_budget_tokens=50))
    with pytest.raises(ValueError, match="context"):
        eng.add(EngineRequest("a", [20] * 10, 600))
    # SGLang's limits: max_req_len = min(context - 1, budget - 1) = 49, prompts of
    # max_req_len - 5 = 44 tokens or more are refused, max_new_tokens is clipped to fit.
    with pytest.raises(ValueError, match=r"Input length \(44 tokens\) exceeds the maximum "
                                         r"allowed length \(44 tokens\)"):
        eng.add(EngineRequest("b", [20] * 44, 5))
    clipped = EngineRequest("b2", [20] * 10, 60)
    eng.add(clipped)
    assert clipped.max_new_tokens == 49 - 10 - 1
    with pytest.raises(ValueError, match="vocabulary"):
        eng.add(EngineRequest("c", [500], 5))
    eng.add(EngineRequest("d", [20], 5))
    with pytest.raises(ValueError, match="duplicate"):
        eng.add(EngineRequest("d", [20], 5))


def test_eos_stops_unless_replay(model):
    eng = BatchEngine(model, EngineConfig())
    eng.add(EngineRequest("probe", [30, 31], 3, temperature=0.0, ignore_eos=True))
    first = _drain(eng)[0]["probe"].output_ids[0]
    eng.add(EngineRequest("stop", [30, 31], 10, temperature=0.0, stop_token_ids=(first,)))
    eng.add(EngineRequest("replay", [30, 31], 10, temperature=0.0, stop_token_ids=(first,),
                          ignore_eos=True))
    fin = _drain(eng)[0]
    assert (fin["stop"].output_ids == [first]
            and fin["stop"].reason == {"type": "stop", "matched": first})
    assert len(fin["replay"].output_ids) == 10


def test_abort_running_returns_partial_queued_returns_nothing(model):
    eng = BatchEngine(model, EngineConfig(max_running_requests=2))
    for i in range(3):
        eng.add(EngineRequest(f"job-{i}", [20 + i] * 3, 50, ignore_eos=True))
    for _ in range(6):
        eng.step()
    ended = {f.rid: f for f in eng.abort(rid="job-", abort_all=False)}
    assert set(ended) == {"job-0", "job-1", "job-2"}
    assert ended["job-2"].queued and ended["job-2"].output_ids == []
    assert ended["job-2"].reason["message"] == "Abort in waiting queue"
    for rid in ("job-0", "job-1"):
        assert not ended[rid].queued and 1 <= len(ended[rid].output_ids) < 50
        assert ended[rid].reason["type"] == "abort"
    assert not eng.has_work and eng.reserved_tokens == 0


def test_sampling_is_seeded(model):
    def once(seed):
        eng = BatchEngine(model, EngineConfig())
        eng.add(EngineRequest("x", [40, 41], 20, ignore_eos=True, temperature=1.0, seed=seed))
        return _drain(eng)[0]["x"].output_ids

    assert once(5) == once(5)
    assert once(5) != once(6)


def test_checkpoint_roundtrip(model, tmp_path):
    model.save(tmp_path / "ckpt")
    loaded = TinyDecoder.load(tmp_path / "ckpt")
    ids = torch.tensor([20, 21, 22, 23])
    assert torch.equal(loaded.forward_full(ids), model.forward_full(ids))
    assert TinyDecoder.random(CFG, seed=3).state_dict()["tok.weight"].equal(model.tok.weight)


def test_local_engine_speaks_the_protocol(model):
    async def main():
        eng = BatchEngine(model, EngineConfig(max_running_requests=4, min_step_seconds=0.002))
        async with LocalEngine(eng) as local:
            assert isinstance(local, Engine)
            await scenario_generate_replay(local, CFG.vocab_size)
            first, _ = await scenario_abort_and_resume(local, CFG.vocab_size, n=6, length=300,
                                                       min_running=4)
            info = await local.server_info()
            items = [x async for x in local.stream(GenerateRequest((20, 21), 5, replay_len=5))]
            return first, info, items

    first, info, items = run(main())
    queued = [r for r in first if not r.output_ids]
    assert len(queued) == 2 and all(r.prompt_tokens is None for r in queued)
    assert info.max_running_requests == 4 and info.kv_capacity_tokens == 4 * 512
    assert [len(i.new_ids) for i in items[:-1]] == [1] * 5
    assert items[-1].finish_reason is FinishReason.LENGTH and len(items[-1].output_ids) == 5


def test_local_engine_reports_unservable_request(model):
    async def main():
        async with LocalEngine(BatchEngine(model, EngineConfig())) as local:
            return await asyncio.wait_for(
                local.generate(GenerateRequest((20,), 5000, SamplingParams())), timeout=10)

    res = run(main())
    assert res.failed and "context" in res.error and res.finish_reason is FinishReason.ABORT


def test_dense_decode_attends_the_pool_in_place_with_the_same_logits():
    """The GPU path (attend every slot of the pool in place, each row masked to its own
    positions) gives the gather path's logits, whichever slots the batch holds."""
    from real.torch_engine.model import KVPool, ModelConfig, TinyDecoder

    cfg = ModelConfig(vocab_size=97, d_model=32, n_layers=2, n_heads=4, max_context=40)
    model = TinyDecoder.random(cfg, seed=3)
    gen = torch.Generator().manual_seed(1)
    for slots_used in ([0, 1, 2, 3, 4, 5, 6, 7], [5, 2, 7], [3]):
        pool = KVPool(cfg, 8, 40, "cpu", torch.float32)
        lens = []
        for s in slots_used:
            n = int(torch.randint(3, 20, (1,), generator=gen))
            model.prefill(torch.randint(0, 97, (n,), generator=gen), pool, s)
            lens.append(n)
        ids = torch.randint(0, 97, (len(slots_used),), generator=gen)
        pos, slots = torch.tensor(lens), torch.tensor(slots_used)
        k0, v0 = pool.k.clone(), pool.v.clone()
        a = model.decode(ids, pos, slots, pool, dense=False)
        pool.k, pool.v = k0, v0
        b = model.decode(ids, pos, slots, pool, dense=True)
        assert torch.allclose(a, b, atol=1e-5), (slots_used, (a - b).abs().max())
