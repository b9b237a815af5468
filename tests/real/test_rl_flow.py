"""An RL framework's rollout flow against bundled servers behind the real sglang-router.

generate with return_logprob -> abort_all fanned out to the workers -> pause, update weights from
disk, continue -> resume each sample with prompt + partial tokens and the reduced
max_new_tokens; response tokens are rebuilt from ``output_token_logprobs`` (as rollout code does)
and must equal ``output_ids``. Also the RL control endpoints one by one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import aiohttp
import pytest
from conftest import VOCAB, Proc, run, served_logprobs, start_router, start_server, stop_all
from http_util import call, internal

from real.clients.sglang import SGLangClient
from real.torch_engine import ModelConfig, TinyDecoder

SERVED = ModelConfig(vocab_size=VOCAB, d_model=64, n_layers=2, n_heads=4, max_context=2048)


@pytest.fixture(scope="module")
def cluster(tmp_logs) -> Iterator[tuple[Proc, list[Proc]]]:
    workers: list[Proc] = []
    router = None
    try:
        workers = [start_server(tmp_logs), start_server(tmp_logs)]
        router = start_router(tmp_logs, [w.url for w in workers])
        yield router, workers
    finally:
        stop_all([*workers, *([router] if router is not None else [])])


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("ckpt") / "step-1"
    TinyDecoder.random(SERVED, seed=7).save(path)
    return str(path)


def _rebuild(resp: dict) -> list[int]:
    """What slime-style rollout code does: response tokens from the log-prob triples."""
    return [t[1] for t in resp["meta_info"]["output_token_logprobs"]]


def test_rollout_abort_update_weights_resume(cluster, checkpoint):
    router, workers = cluster
    max_new, n = 600, 6
    prompts = [[50 + i, 60 + i, 70 + i] for i in range(n)]

    async def main():
        async with aiohttp.ClientSession() as s:
            async def gen(prompt, max_new_tokens, seed):
                body = {"input_ids": prompt, "return_logprob": True, "sampling_params": {
                    "max_new_tokens": max_new_tokens, "temperature": 1.0, "ignore_eos": True,
                    "sampling_seed": seed}}
                async with s.post(router.url + "/generate", json=body) as r:
                    assert r.status == 200, await r.text()
                    return await r.json()

            tasks = [asyncio.create_task(gen(p, max_new, i)) for i, p in enumerate(prompts)]
            deadline = time.monotonic() + 30
            while sum(internal(w.url)["num_running_reqs"] for w in workers) < n:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)
            async with SGLangClient(router.url) as client:
                assert sorted(await client.workers()) == sorted(w.url for w in workers)
                await client.abort_all()  # POST /abort_request to every worker
            first = await asyncio.gather(*tasks)

            # the weight update an RL trainer does between steps
            for w in workers:
                assert call(w.url, "/pause_generation", {"mode": "in_place"})[0] == 200
                status, body = call(w.url, "/update_weights_from_disk",
                                    {"model_path": checkpoint, "weight_version": "step-1"})
                assert status == 200 and body["success"], body
                assert "Weight version updated to step-1" in body["message"]
                assert call(w.url, "/continue_generation", {})[0] == 200

            second = await asyncio.gather(*(
                gen(p + r["output_ids"], max_new - len(r["output_ids"]), 100 + i)
                for i, (p, r) in enumerate(zip(prompts, first, strict=True))))
            return first, second

    first, second = run(main())
    for r in first:
        assert r["meta_info"]["finish_reason"]["type"] == "abort"
        assert 0 < len(r["output_ids"]) < max_new
        assert _rebuild(r) == r["output_ids"]  # no response token is lost
        assert r["meta_info"]["weight_version"] == "default"
    for a, b in zip(first, second, strict=True):
        assert b["meta_info"]["finish_reason"]["type"] == "length"
        assert _rebuild(b) == b["output_ids"]
        assert len(a["output_ids"]) + len(b["output_ids"]) == max_new
        assert b["meta_info"]["weight_version"] == "step-1"
        assert all(lp <= 0 for lp, _, _ in b["meta_info"]["output_token_logprobs"])
    # the weights really changed, to the checkpoint's: log-probs match the new model, not the old
    prompt = [11, 12, 13]

    def ref_logprobs(model: TinyDecoder, out: list[int]) -> list[float]:
        lp = served_logprobs(model, prompt + out)
        return [float(lp[len(prompt) - 1 + i, t]) for i, t in enumerate(out)]

    for w in workers:
        status, r = call(w.url, "/generate", {"input_ids": prompt, "return_logprob": True,
                                              "sampling_params": {"max_new_tokens": 6,
                                                                  "ignore_eos": True}})
        got = [t[0] for t in r["meta_info"]["output_token_logprobs"]]
        assert got == pytest.approx(ref_logprobs(TinyDecoder.load(checkpoint), r["output_ids"]),
                                    abs=1e-4)
        assert got != pytest.approx(ref_logprobs(TinyDecoder.random(SERVED, seed=0),
                                                 r["output_ids"]), abs=1e-3)
        assert call(w.url, "/get_weight_version")[1] == {"weight_version": "step-1"}
        assert call(w.url, "/get_model_info")[1]["weight_version"] == "step-1"
        state = internal(w.url)
        assert state["num_running_reqs"] == 0 and state["kv_used_tokens"] == 0
        assert state["free_slots"] == 8


@pytest.fixture(scope="module")
def control_server(tmp_logs) -> Iterator[Proc]:
    p = start_server(tmp_logs, "--enable-memory-saver")
    try:
        yield p
    finally:
        p.stop()


def test_pause_holds_requests_until_continue(control_server):
    url = control_server.url
    assert call(url, "/pause_generation", {"mode": "abort"})[1] == {
        "message": "Generation paused successfully.", "status": "ok"}

    async def main():
        async with aiohttp.ClientSession() as s:
            body = {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 4,
                                                             "ignore_eos": True}}
            task = asyncio.create_task(s.post(url + "/generate", json=body))
            await asyncio.sleep(0.5)
            held = internal(url)
            assert not task.done()
            assert call(url, "/continue_generation", {})[1]["status"] == "ok"
            resp = await task
            return held, await resp.json()

    held, out = run(main())
    assert held["paused"] and held["num_waiting_reqs"] == 1 and held["num_running_reqs"] == 0
    assert len(out["output_ids"]) == 4
    status, err = call(url, "/pause_generation", {"mode": "sideways"})
    assert status == 400 and "mode" in err["message"]


def test_release_and_resume_memory_occupation(control_server):
    url = control_server.url
    body = {"input_ids": [7, 8, 9], "sampling_params": {"max_new_tokens": 5, "temperature": 0,
                                                        "ignore_eos": True}}
    before = call(url, "/generate", body)[1]["output_ids"]
    assert call(url, "/release_memory_occupation", {})[0] == 200
    assert internal(url)["memory_released"] == ["kv_cache", "weights"]

    async def main():
        async with aiohttp.ClientSession() as s:
            task = asyncio.create_task(s.post(url + "/generate", json=body))
            await asyncio.sleep(0.4)
            assert not task.done()  # nothing runs while the memory is released
            assert call(url, "/resume_memory_occupation", {"tags": ["weights", "kv_cache"]})[0] \
                == 200
            return await (await task).json()

    after = run(main())["output_ids"]
    assert after == before  # the same weights came back
    assert internal(url)["memory_released"] == []
    status, err = call(url, "/release_memory_occupation", {"tags": ["gpu_magic"]})
    assert status == 400 and "gpu_magic" in err["error"]["message"]


def test_weights_updated_while_released_are_the_ones_resumed(control_server, tmp_path):
    """Colocated training: release, write new weights, resume: the new weights serve."""
    url = control_server.url
    TinyDecoder.random(SERVED, seed=11).save(tmp_path / "w11")
    body = {"input_ids": [7, 8, 9], "return_logprob": True,
            "sampling_params": {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True}}
    assert call(url, "/release_memory_occupation", {"tags": ["weights"]})[0] == 200
    status, r = call(url, "/update_weights_from_disk", {"model_path": str(tmp_path / "w11"),
                                                        "weight_version": "w11"})
    assert status == 200 and r["success"]
    assert call(url, "/resume_memory_occupation", {})[0] == 200
    out = call(url, "/generate", body)[1]
    model = TinyDecoder.random(SERVED, seed=11)
    ids = [7, 8, 9] + out["output_ids"]
    lp = served_logprobs(model, ids)
    want = [float(lp[2 + i, t]) for i, t in enumerate(out["output_ids"])]
    assert [x[0] for x in out["meta_info"]["output_token_logprobs"]] == pytest.approx(want,
                                                                                      abs=1e-4)
    assert out["meta_info"]["weight_version"] == "w11"


def test_update_weights_from_disk_failures_keep_serving(control_server, tmp_path):
    url = control_server.url
    status, body = call(url, "/update_weights_from_disk", {"model_path": str(tmp_path / "nope")})
    assert status == 400 and body["success"] is False
    other = TinyDecoder.random(ModelConfig(vocab_size=VOCAB, d_model=32, n_layers=1, n_heads=2),
                               seed=1)
    other.save(tmp_path / "other")
    status, body = call(url, "/update_weights_from_disk", {"model_path": str(tmp_path / "other")})
    assert status == 400 and body["success"] is False and "does not match" in body["message"]
    status, body = call(url, "/update_weights_from_disk", {"model_path": "x", "bogus": 1})
    assert status == 400 and "bogus" in body["message"]
    assert call(url, "/generate", {"input_ids": [1, 2], "sampling_params": {
        "max_new_tokens": 2, "ignore_eos": True}})[0] == 200


def test_info_endpoints_frameworks_check(control_server):
    url = control_server.url
    status, models = call(url, "/v1/models")
    assert status == 200 and models["object"] == "list"
    card = models["data"][0]
    assert card["id"] == "aprilsim/tiny-random" and card["max_model_len"] == 2048
    assert call(url, "/v1/models/aprilsim/tiny-random")[1]["id"] == card["id"]
    assert call(url, "/v1/models/nope")[0] == 404
    info = call(url, "/server_info")[1]
    for key in ("enable_memory_saver", "weight_version", "tokenizer_path", "max_total_num_tokens",
                "max_running_requests", "context_length", "page_size", "version"):
        assert key in info, key
    assert info["enable_memory_saver"] is True
    assert call(url, "/update_weight_version", {"new_version": "v9"})[1]["new_version"] == "v9"
    assert call(url, "/get_weight_version")[1] == {"weight_version": "v9"}
    status, err = call(url, "/no/such/endpoint")
    assert status == 404 and err["message"]
