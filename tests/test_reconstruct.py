"""Iterations rebuilt from streamed token timestamps (aprilsim.validate.reconstruct): exact on a
synthetic engine whose deliveries jitter less than a step, close under coalesced chunks, and
checked against the bundled engine's own iteration log in process."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, event, given, settings, target
from hypothesis import strategies as st

from aprilsim.validate.reconstruct import StreamLog, match_error, reconstruct


def synthetic(seed: int, n_req: int = 12, jitter: float = 0.1, coalesce: float = 0.0):
    """A toy continuous-batching engine: (stream logs its clients saw, its true iteration rows).
    Waiting requests are prefilled together in one step (first tokens), then every running
    request gets one token per decode step; deliveries arrive up to ``jitter`` of a step late;
    with ``coalesce`` > 0 that share of chunks is merged into the next one."""
    rng = random.Random(seed)
    reqs = [dict(sub=rng.uniform(0, 0.3), inp=rng.randint(4, 200), gen=rng.randint(1, 30))
            for _ in range(n_req)]
    logs = [StreamLog(submitted=r["sub"], input_tokens=r["inp"]) for r in reqs]
    t, seq, rows = 0.0, 0, []
    waiting = sorted(range(n_req), key=lambda i: reqs[i]["sub"])
    running: dict[int, int] = {}  # request -> tokens so far
    while waiting or running:
        ready = [i for i in waiting if reqs[i]["sub"] <= t]
        if not ready and not running:
            t = reqs[waiting[0]]["sub"] + 1e-4
            continue
        seq += 1
        if ready:
            dur = 0.002 + 1e-6 * sum(reqs[i]["inp"] for i in ready)
            t += dur
            for i in ready:
                waiting.remove(i)
                running[i] = 1
            batch, phase, new = len(ready), "prefill", ready
        else:
            dur = 0.001 + 2e-5 * len(running)
            t += dur
            new = list(running)
            for i in new:
                running[i] += 1
            batch, phase = len(new), "decode"
        for i in new:
            logs[i].events.append((t + rng.uniform(0, jitter * 0.001), 1))
        done = [i for i, g in running.items() if g >= reqs[i]["gen"]]
        for i in done:
            del running[i]
            logs[i].finished = t + 0.0002
        kv = sum(reqs[i]["inp"] + g for i, g in running.items())
        rows.append({"seq": seq, "t": t, "phase": phase, "batch_size": batch, "duration_s": dur,
                     "prefill_tokens": (sum(reqs[i]["inp"] for i in new) if phase == "prefill"
                                        else 0),
                     "kv_tokens": kv, "running": len(running)})
    if coalesce:
        for lg in logs:
            ev, out = lg.events, []
            for e in ev:
                if out and rng.random() < coalesce:
                    out[-1] = (e[0], out[-1][1] + e[1])
                else:
                    out.append(e)
            lg.events = out
    return logs, rows


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), n=st.integers(1, 24))
def test_exact_on_an_engine_whose_deliveries_jitter_less_than_a_step(seed, n):
    logs, truth = synthetic(seed, n)
    rows = reconstruct(logs)
    m = match_error(rows, truth)
    event(f"iterations {'<= 20' if len(truth) <= 20 else '> 20'}")
    event("prefill steps "
          f"{'one' if sum(r['phase'] == 'prefill' for r in truth) == 1 else 'several'}")
    target(float(len(truth)), label="iterations")
    assert len(rows) == len(truth)
    assert [r["phase"] for r in rows] == [r["phase"] for r in truth]
    assert [r["batch_size"] for r in rows] == [r["batch_size"] for r in truth]
    assert [r["kv_tokens"] for r in rows] == [r["kv_tokens"] for r in truth]
    assert m["matched_share"] == 1.0 and m["batch_exact_share"] == 1.0
    # intervals: each true step's duration, up to the delivery jitter (0.1 ms)
    busy = [(a, b) for a, b in zip(rows, truth) if a["duration_s"] < 0.05]
    assert all(abs(a["duration_s"] - b["duration_s"]) <= 2e-4 for a, b in busy[1:])


def test_coalesced_chunks_stand_for_the_steps_they_missed():
    """A chunk carrying two tokens counts its request in the step before too, so batch sizes
    and KV stay right where the server merged deliveries."""
    logs, truth = synthetic(3, 16, coalesce=0.15)
    assert any(n > 1 for lg in logs for _, n in lg.events)
    rows = reconstruct(logs)
    m = match_error(rows, truth)
    assert m["matched_share"] >= 0.95
    assert m["batch_exact_share"] >= 0.9
    assert abs(m["total_rel_err"]) < 0.05


def test_no_logs_no_rows():
    assert reconstruct([]) == []
    assert reconstruct([StreamLog(0.0, 5)]) == []
    assert match_error([], [{"seq": 1, "t": 1.0, "phase": "decode",
                             "duration_s": 0.1}])["matched_share"] == 0.0


@pytest.mark.slow
def test_against_the_bundled_engines_own_iteration_log():
    """In process: staggered requests on one bundled engine, its token stream rebuilt and
    compared with the iterations it logged (both clocks: the log's t is time.time())."""
    pytest.importorskip("torch")
    import asyncio
    import time

    import torch

    from real.clients.connect import stamped
    from real.protocol import GenerateRequest
    from real.runner.local import LocalSpec, start_local

    async def main():
        torch.set_num_threads(1)
        [w] = await start_local(1, LocalSpec())
        e = stamped(w)
        rng = random.Random(0)

        async def one(i: int) -> None:
            await asyncio.sleep(rng.random() * 0.4)
            n, g = rng.randint(8, 200), rng.randint(4, 50)
            ids = tuple(3 + (i * 31 + j) % 500 for j in range(n))
            r = await e.generate(GenerateRequest(prompt_ids=ids, max_new_tokens=g, replay_len=g))
            assert not r.error

        off = time.time() - time.monotonic()
        try:
            await asyncio.gather(*(one(i) for i in range(20)))
        finally:
            await w.close()
        return [r.to_dict() for r in w.engine.iterations], e.take(), off

    logged, logs, off = asyncio.run(main())
    m = match_error(reconstruct(logs), logged, offset=off)
    print("reconstruction vs /iteration_log:", m)
    # the structure holds under load; the timing follows the event loop's delivery (measured:
    # quiet 97-99 % matched, 0.3-1 % interval error; beside other jobs 59-72 %, 15-18 %)
    assert abs(m["reconstructed"] - m["logged"]) <= 0.1 * m["logged"]
    assert m["batch_exact_share"] >= 0.85
    assert m["matched_share"] >= 0.5
    assert m["interval_median_rel_err"] <= 0.3
    assert abs(m["total_rel_err"]) <= 0.25


def test_engine_counts_merge_or_split_the_rebuilt_iterations():
    """Between two counter samples, rows are merged or split to the counter's increase; time
    and tokens are kept."""
    from aprilsim.validate.reconstruct import fit_counts

    def row(t, phase="decode", b=4):
        return {"seq": 0, "t": t, "phase": phase, "batch_size": b,
                "prefill_tokens": 40 if phase == "prefill" else 0,
                "kv_tokens": 100, "running": b, "duration_s": 0.01, "padded_s": 0.01}

    rows = [row(0.01 * i) for i in range(1, 21)]  # 20 rows in (0, 0.2]
    rows[0] = row(0.01, "prefill")
    samples = [(0.0, 0), (0.1, 5), (0.2, 15)]  # the engine ran 5, then 10
    out = fit_counts(rows, samples)
    assert len(out) == 15
    assert sum(r["duration_s"] for r in out) == pytest.approx(0.2)
    assert sum(r["prefill_tokens"] for r in out) == 40 and out[0]["phase"] == "prefill"
    assert [r["seq"] for r in out] == list(range(out[0]["seq"], out[0]["seq"] + 15))
    more = fit_counts(rows, [(0.0, 0), (0.2, 50)])
    assert len(more) == 50 and sum(r["duration_s"] for r in more) == pytest.approx(0.2)
    assert sum(r["prefill_tokens"] for r in more) == 40
    assert fit_counts(rows, [(0.0, 0)]) == rows
