"""Random engine workloads at users' scale, the same kind for every engine family.

A workload is what a rollout sends one engine: requests (prompt token content, a `max_tokens` cap
and the length at which the stub model emits a stop token), their arrival steps, aborts at given
steps and resubmitted partials (APRIL: an aborted request's prompt plus the tokens it had made,
sent again), under one engine's limits. Token content is synthetic but real: prompts are runs of a
fixed pseudo-random token table, so requests of one GRPO group share their prompt, and every
prompt of a workload may share a system prefix; outputs are the table at a per-request offset, so
a resubmitted partial's prompt matches the blocks its parent left in the prefix cache.

The golden-trace recorder (experiments/record_engine_traces.py) and the replay test both read
workloads from the trace files; `make_workload(seed, index)` only makes new ones.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

TABLE_BITS = 18
TABLE_MASK = (1 << TABLE_BITS) - 1
STRIDE = 40503  # odd: distinct sources start at distinct table offsets
STOP_TOKEN = 3  # never in the table (whose tokens are 10..32009): the stub's end-of-sample token
OUTPUT_SRC_BASE = 1 << 24  # token source of request r's outputs: OUTPUT_SRC_BASE + r
SYSTEM_SRC = 1  # the source of a workload's shared system prefix
SHAPES = ("batch", "waves", "stream", "april")


@lru_cache(maxsize=1)
def token_table() -> list[int]:
    """The fixed pseudo-random token table (a 64-bit LCG; the same on every machine)."""
    x = 0x9E3779B97F4A7C15
    out = []
    for _ in range(1 << TABLE_BITS):
        x = (x * 6364136223846793005 + 1442695040888963407) & 0xFFFF_FFFF_FFFF_FFFF
        out.append(10 + (x >> 33) % 32000)
    return out


def source_tokens(src: int, start: int, length: int) -> list[int]:
    """Tokens `start .. start+length` of token source `src` (a slice of the table, wrapping)."""
    table = token_table()
    i = (src * STRIDE + start) & TABLE_MASK
    out = table[i:i + length]
    while len(out) < length:
        out += table[:length - len(out)]
    return out


def output_token(rid: int, index: int, target: int, max_tokens: int) -> int:
    """What the stub model samples as request `rid`'s output token `index` (0-based): the stop
    token at `target - 1` when the request would stop before its cap, else its output source."""
    if index == target - 1 and target < max_tokens:
        return STOP_TOKEN
    return source_tokens(OUTPUT_SRC_BASE + rid, index, 1)[0]


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request of a workload; its id is its index in `Workload.requests`.

    `segments` are (source, length) runs making the prompt. A resubmitted partial has
    `continues` = the aborted request it continues: its prompt is the parent's prompt and outputs
    at the abort, its cap and target the parent's less what the parent made (so `segments`,
    `max_tokens` and `target` are unused, -1); it is sent only if the abort caught the parent.
    """

    arrive: int
    segments: tuple[tuple[int, int], ...]
    max_tokens: int
    target: int
    continues: int = -1

    def prompt_tokens(self) -> list[int]:
        """The prompt's tokens (not for a resubmitted partial: the driver builds those)."""
        out: list[int] = []
        for src, n in self.segments:
            out += source_tokens(src, 0, n)
        return out


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """One engine's limits, family-neutral: KV capacity in tokens, most running requests, tokens
    per step (the chunked-prefill budget), the model length, the prefix cache; and the vLLM-only
    knobs (KV watermark fraction, the full-prompt admission check) other families ignore."""

    kv_tokens: int
    max_running: int
    step_tokens: int
    max_model_len: int
    prefix_caching: bool = True
    watermark: float = 0.0
    reserve_full_prompt: bool = True


@dataclass(frozen=True, slots=True)
class Workload:
    """Requests, aborts ((step, request id), applied in order before that step) and limits."""

    name: str
    shape: str
    limits: EngineLimits
    requests: tuple[RequestSpec, ...]
    aborts: tuple[tuple[int, int], ...]

    def to_json(self) -> dict[str, Any]:
        """A compact JSON form: requests as [arrive, flat segments, max_tokens, target,
        continues]."""
        lim = self.limits
        return {
            "name": self.name, "shape": self.shape,
            "limits": [lim.kv_tokens, lim.max_running, lim.step_tokens, lim.max_model_len,
                       int(lim.prefix_caching), lim.watermark, int(lim.reserve_full_prompt)],
            "requests": [[r.arrive, [x for s in r.segments for x in s], r.max_tokens, r.target,
                          r.continues] for r in self.requests],
            "aborts": [list(a) for a in self.aborts],
        }

    @staticmethod
    def from_json(d: dict[str, Any]) -> Workload:
        """The inverse of `to_json`."""
        kv, run, step, mml, pc, wm, full = d["limits"]
        reqs = tuple(
            RequestSpec(a, tuple(zip(seg[::2], seg[1::2], strict=True)), mt, tg, c)
            for a, seg, mt, tg, c in d["requests"])
        return Workload(d["name"], d["shape"],
                        EngineLimits(kv, run, step, mml, bool(pc), wm, bool(full)), reqs,
                        tuple((s, r) for s, r in d["aborts"]))


def _lognormal(rng: random.Random, median: float, sigma: float) -> float:
    """A log-normal draw from `rng.random()` alone (Box-Muller), stable across Python versions."""
    u1, u2 = 1.0 - rng.random(), rng.random()
    z = math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)
    return median * math.exp(sigma * z)


def _pick(rng: random.Random, options: tuple[Any, ...]) -> Any:
    return options[int(rng.random() * len(options))]


@dataclass(slots=True)
class _Draw:
    """The per-workload choices the request generator reads."""

    rng: random.Random
    max_model_len: int
    cap: int
    prompt_median: float
    output_median: float
    system_len: int
    group: int


def _prompt_len(d: _Draw) -> int:
    hi = min(8192, d.max_model_len - 64)
    n = int(_lognormal(d.rng, d.prompt_median, 0.7))
    if d.rng.random() < 0.02:  # a few long prompts
        n = int(hi * (0.5 + 0.5 * d.rng.random()))
    return max(1, min(hi - d.system_len, n))


def _target(d: _Draw) -> int:
    """Output length: most short, a tail toward the cap (steps stay bounded, caps stay 16k)."""
    t = int(_lognormal(d.rng, d.output_median, 1.0))
    if d.rng.random() < 0.06:
        t = int(d.rng.random() * min(d.cap, 2500))
    return max(1, min(d.cap, t))


def _groups(d: _Draw, n_requests: int, first_src: int) -> list[list[RequestSpec]]:
    """GRPO groups of `d.group` samples of one prompt (arrival 0; the shape moves them)."""
    out = []
    src = first_src
    while sum(len(g) for g in out) < n_requests:
        seg = ((SYSTEM_SRC, d.system_len),) if d.system_len else ()
        seg += ((src, _prompt_len(d)),)
        out.append([RequestSpec(0, seg, d.cap, _target(d)) for _ in range(d.group)])
        src += 1
    return out


def _long_tail(d: _Draw, groups: list[list[RequestSpec]], n_long: int) -> None:
    """Give `n_long` random requests a target near (or at) the cap: the 16k tail."""
    for _ in range(n_long):
        g = groups[int(d.rng.random() * len(groups))]
        i = int(d.rng.random() * len(g))
        t = d.cap if d.rng.random() < 0.3 else int(d.cap * (0.5 + 0.5 * d.rng.random()))
        g[i] = RequestSpec(g[i].arrive, g[i].segments, g[i].max_tokens, max(1, t))


def _limits(d: _Draw, n_requests: int) -> EngineLimits:
    """Limits with KV from a twelfth to 1.3 times the running requests' demand (many
    preempt), never less than one request of the model's length."""
    rng = d.rng
    run = _pick(rng, (8, 16, 32, 64, 128, 256))
    step = max(run, _pick(rng, (256, 512, 1024, 2048, 4096, 8192, 16384)))
    demand = min(run, n_requests) * (d.system_len + d.prompt_median * 1.3 + d.output_median * 2)
    kv = int(demand * 10 ** (rng.random() * 1.2 - 1.1))
    kv = max(kv, d.max_model_len + 64 * (1 + int(rng.random() * 16)))
    wm = _pick(rng, (0.01, 0.05)) if rng.random() < 0.2 else 0.0
    return EngineLimits(kv, run, step, d.max_model_len, rng.random() >= 0.1, wm,
                        rng.random() >= 0.1)


def _arrange(d: _Draw, shape: str, groups: list[list[RequestSpec]]
             ) -> tuple[list[RequestSpec], list[tuple[int, int]]]:
    """Arrival steps by shape, aborts, and resubmitted partials; returns (requests, aborts)."""
    rng = d.rng
    reqs: list[RequestSpec] = []
    aborts: list[tuple[int, int]] = []
    if shape == "april":
        return _april_rounds(d, groups)
    spread = 0 if shape == "batch" else int(rng.random() * 3000)
    waves = 1 + int(rng.random() * 4)
    for gi, g in enumerate(groups):
        if shape == "waves":
            t = (gi * waves // len(groups)) * max(1, spread // waves)
        elif shape == "stream":
            t = int(rng.random() * spread)
        else:
            t = 0
        reqs += [RequestSpec(t, r.segments, r.max_tokens, r.target) for r in g]
    reqs.sort(key=lambda r: r.arrive)
    frac = _pick(rng, (0.0, 0.02, 0.05, 0.15))
    for rid in range(len(reqs)):
        if rng.random() < frac:
            t = reqs[rid].arrive + int(rng.random() * 600)
            aborts.append((t, rid))
            if rng.random() < 0.5:
                reqs.append(RequestSpec(t + int(rng.random() * 100), (), -1, -1, rid))
    aborts.sort()
    return _by_arrival(reqs, aborts)


def _april_rounds(d: _Draw, groups: list[list[RequestSpec]]
                  ) -> tuple[list[RequestSpec], list[tuple[int, int]]]:
    """APRIL: each round submits fresh groups, then aborts all its unfinished requests at the
    round's end and resubmits them (prompt + partial output) with the next round's groups."""
    rng = d.rng
    rounds = 2 + int(rng.random() * 3)
    per = max(1, len(groups) // rounds)
    reqs: list[RequestSpec] = []
    aborts: list[tuple[int, int]] = []
    t = 0
    live: list[int] = []
    for k in range(rounds):
        for g in groups[k * per:(k + 1) * per if k < rounds - 1 else len(groups)]:
            for r in g:
                live.append(len(reqs))
                reqs.append(RequestSpec(t, r.segments, r.max_tokens, r.target))
        end = t + 100 + int(rng.random() * 900)
        if k == rounds - 1:
            break
        for rid in live:
            aborts.append((end, rid))
        t = end + int(rng.random() * 20)
        nxt = []
        for rid in live:
            nxt.append(len(reqs))
            reqs.append(RequestSpec(t, (), -1, -1, rid))
        live = nxt
    return _by_arrival(reqs, aborts)


def _by_arrival(reqs: list[RequestSpec], aborts: list[tuple[int, int]]
                ) -> tuple[list[RequestSpec], list[tuple[int, int]]]:
    """Renumber requests in arrival order (stable), so ids follow submission order."""
    order = sorted(range(len(reqs)), key=lambda i: reqs[i].arrive)
    new_id = {old: new for new, old in enumerate(order)}
    out = []
    for old in order:
        r = reqs[old]
        c = new_id[r.continues] if r.continues >= 0 else -1
        out.append(RequestSpec(r.arrive, r.segments, r.max_tokens, r.target, c))
    return out, sorted((t, new_id[rid]) for t, rid in aborts)


def make_workload(seed: int, index: int) -> Workload:
    """Workload `index` of the family `seed`: deterministic in (seed, index)."""
    rng = random.Random(seed * 1_000_003 + index)
    mml = _pick(rng, (4096, 8192, 16384, 16384, 16384))
    cap = min(mml, _pick(rng, (1024, 2048, 4096, 8192, 16384)))
    if rng.random() < 0.25:
        cap = mml  # prompt + cap exceeds the model length: some stop at max_model_len
    d = _Draw(rng, mml, cap, _pick(rng, (48.0, 200.0, 600.0, 1500.0)),
              _pick(rng, (24.0, 80.0, 250.0)),
              _pick(rng, (0, 0, 16, 100, 512, 1000)), _pick(rng, (1, 4, 8, 16)))
    n_requests = int(100 * 10 ** (rng.random() ** 1.5))  # 100 to 1,000, more of the fewer
    groups = _groups(d, n_requests, SYSTEM_SRC + 1)
    _long_tail(d, groups, _pick(rng, (0, 0, 1, 1, 2, 3)))
    shape = _pick(rng, SHAPES)
    reqs, aborts = _arrange(d, shape, groups)
    return Workload(f"s{seed}-{index}", shape, _limits(d, n_requests), tuple(reqs),
                    tuple(aborts))
