"""Random workloads for golden engine traces (issue 34): what a recording harness feeds a real
scheduler and what the replay feeds aprilsim.

A workload is plain JSON: an engine `config` and `requests`, each with a prompt (`prompt_len`
tokens; requests of one `group` share the same prompt token ids, `prompt_seed` makes them),
`max_new_tokens`, the output length the stub model stops at (`target_len`: it emits a stop token
as that token; == max_new_tokens: a length finish) and the scheduler step it arrives at
(`arrival_step`). `abort_all_steps` lists steps at whose start every request on the engine is
aborted (APRIL's abort at the end of a rollout step; aprilsim's engines abort all at once, so
per-request aborts are not drawn). Scale: users' (caps up to 16k, 100-1,000 requests, KV small
enough to force retractions), kept within what one CPU core records in seconds to a minute.
"""

from __future__ import annotations

import math
import random
from typing import Any

CAPS = (1024, 2048, 4096, 8192, 16384)


def _lognormal_len(rng: random.Random, median: float, sigma: float, lo: int, hi: int) -> int:
    """A length drawn lognormally around `median`, clamped to [lo, hi]."""
    return max(lo, min(hi, int(median * math.exp(rng.gauss(0.0, sigma)))))


def _requests(rng: random.Random, n: int, cap: int, arrival_span: int,
              ratios: tuple[float, ...] = (0.1, 0.25, 0.5)) -> list[dict[str, Any]]:
    """`n` requests in groups sharing a prompt, lengths lognormal under the cap."""
    out: list[dict[str, Any]] = []
    ratio = rng.choice(ratios)  # median output / cap (reasoning mixes)
    group = 0
    while len(out) < n:
        size = min(n - len(out), rng.choice((1, 2, 4, 8, 16)))
        prompt_len = _lognormal_len(rng, rng.choice((150, 400, 900)), 0.6, 16, 3000)
        arrival = 0 if rng.random() < 0.5 else rng.randrange(arrival_span + 1)
        seed = rng.randrange(1 << 30)
        for _ in range(size):
            target = _lognormal_len(rng, ratio * cap, 1.0, 1, cap)
            out.append({"rid": len(out), "group": group, "prompt_len": prompt_len,
                        "prompt_seed": seed, "max_new_tokens": cap, "target_len": target,
                        "arrival_step": arrival})
        group += 1
    return out


def make_workload(seed: int, *, big: bool = False, tight: bool = False) -> dict[str, Any]:
    """One random workload (`big`: a 16k cap and hundreds of requests, minutes of CPU;
    `tight`: long outputs on a smaller KV cache, which retracts more often)."""
    rng = random.Random(seed)
    cap = 16384 if big else rng.choice(CAPS[1:4])
    n = rng.randint(300, 1000) if big else rng.randint(100, 200)
    ratios = (0.25, 0.5) if tight else (0.1, 0.25, 0.5)
    reqs = _requests(rng, n, cap, arrival_span=rng.choice((0, 200, 2000)), ratios=ratios)
    need = max(r["prompt_len"] + r["max_new_tokens"] for r in reqs)
    demand = sum(r["prompt_len"] + r["target_len"] for r in reqs)
    mean = demand / len(reqs)  # room for 10-50 average requests (5-15 tight): retractions
    kv = max(need + 64, int(mean * (rng.uniform(5, 15) if tight else rng.uniform(10, 50))))
    chunk = rng.choice((0, 0, 256, 1024, 8192))
    cfg = {"kv_tokens": kv, "max_running_requests": rng.choice((32, 64, 128, 256)),
           "chunked_prefill_size": chunk, "max_prefill_tokens": rng.choice((4096, 16384)),
           "page_size": 1, "radix_cache": False, "schedule_policy": "fcfs",
           "overlap_schedule": False}
    aborts: list[int] = []
    if rng.random() < 0.4:  # abort everything mid-run, later requests arrive after it
        at = rng.randint(50, 3000)
        aborts.append(at)
        extra = _requests(rng, rng.randint(20, 100), cap, arrival_span=100)
        for r in extra:
            r["rid"] += len(reqs)
            r["group"] += 1_000_000
            r["arrival_step"] += at + rng.choice((2, 10, 50))  # after the abort landed
        reqs += extra
    return {"id": f"w{seed:05d}", "seed": seed, "config": cfg, "requests": reqs,
            "abort_all_steps": aborts}
