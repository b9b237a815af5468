"""Engine iterations rebuilt from the streamed token timestamps of the requests in flight.

An engine that logs no iterations (vLLM, SGLang) still shows them to its clients: a decode
iteration gives every running request one token, and the streams deliver those tokens at about
the same moment, at the end of the iteration; a request's first token ends the step that
prefilled it. So the arrivals of all the requests one engine serves, sorted in time, fall into
clusters, one per iteration: a new cluster starts where a request already in the current one
receives again, or where the silence since the last arrival is long against a request's own
token gap. From each cluster follow the iteration's rows in the bundled engine's
``/iteration_log`` form: ``t`` (its end), ``phase`` (``prefill`` where it holds first tokens,
with the new requests' input tokens; else ``decode``), ``batch_size``, ``kv_tokens`` (held after
it), ``running``, and ``duration_s``: from the end of the previous iteration while some request
was in flight, else from the latest submission it answers. A chunk that carries k > 1 tokens
(the server coalesced deliveries) stands for the k - 1 preceding iterations the request was not
seen in. The rows feed the same cost fit and pricing as a logged engine's
(:mod:`aprilsim.validate.costfit`, :mod:`aprilsim.validate.pricing`).

What it cannot see: a prefill step that emits no token (a chunked prefill's first chunks), the
split of a mixed vLLM step between its prefill and decode work (the row is a prefill with
``mixed_decode`` running beside it), and the delivery latency (every row ends late by about the
same amount, which cancels in intervals). :func:`match_error` measures how far the rows are from
a logged engine's own.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Any


@dataclass
class StreamLog:
    """One request as its client saw it: when it was sent, its input tokens, and each chunk's
    arrival time and token count."""

    submitted: float
    input_tokens: int
    events: list[tuple[float, int]] = field(default_factory=list)
    finished: float | None = None


def merge_bursts(events: Sequence[tuple[float, int]], burst_s: float) -> list[tuple[float, int]]:
    """A request's chunks that arrive less than ``burst_s`` apart as one chunk at the last one's
    time: a starved server process flushes many iterations' tokens at once (vLLM's API server
    on a loaded CPU), and their arrival times say nothing of when each was made."""
    out: list[tuple[float, int]] = []
    for t, n in events:
        if out and t - out[-1][0] < burst_s:
            out[-1] = (t, out[-1][1] + n)
        else:
            out.append((t, n))
    return out


def _clusters(logs: Sequence[StreamLog], gap_factor: float, burst_s: float = 0.0,
              ) -> list[tuple[float, list[tuple[int, int]]]]:
    """(time, [(request, tokens)]) per iteration, from the sorted arrivals."""
    evs = [merge_bursts(lg.events, burst_s) if burst_s > 0 else lg.events for lg in logs]
    arrivals = sorted((t, i, n) for i, ev in enumerate(evs) for t, n in ev if n > 0)
    if not arrivals:
        return []
    own = [b[0] - a[0] for ev in evs for a, b in zip(ev, ev[1:]) if b[0] > a[0]]
    tol = gap_factor * median(own) if own else float("inf")
    out: list[tuple[float, list[tuple[int, int]]]] = []
    seen: set[int] = set()
    last = None
    for t, i, n in arrivals:
        if not out or i in seen or (last is not None and t - last > tol):
            out.append((t, []))
            seen = set()
        out[-1][1].append((i, n))
        seen.add(i)
        last = t
    return out


def _spread(clusters: list[tuple[float, list[tuple[int, int]]]]
            ) -> list[tuple[float, dict[int, int]]]:
    """Per iteration, request -> tokens: a chunk of k tokens puts its request in the k - 1
    iterations before it where it was not seen (since its previous chunk), and where there are
    fewer such iterations (every stream coalesced at once), adds the missing ones evenly in time
    before the chunk."""
    its: list[list] = [[t, {}] for t, _ in clusters]
    pending: list[tuple[int, int, int]] = []  # (iteration object id, request, tokens)
    for k, (_, got) in enumerate(clusters):
        for i, n in got:
            pending.append((k, i, n))
    objs = list(its)
    last_obj: dict[int, list] = {}
    for k, i, n in pending:
        it = objs[k]
        it[1][i] = 1
        extra = n - 1
        if extra > 0:
            pos = its.index(it)
            lo = its.index(last_obj[i]) if i in last_obj else -1
            j = pos - 1
            while extra > 0 and j > lo:
                if i not in its[j][1]:
                    its[j][1][i] = 1
                    extra -= 1
                j -= 1
            if extra > 0 and lo >= 0:  # iterations no stream showed: evenly before the chunk
                t0, t1 = its[pos - 1][0], it[0]
                for m in range(extra):
                    its.insert(pos + m, [t0 + (t1 - t0) * (m + 1) / (extra + 1), {i: 1}])
            elif extra > 0:
                it[1][i] += extra
        last_obj[i] = it
    return [(t, d) for t, d in its]


BURST_S = 3e-4  # chunks of one request closer than this are one coalesced delivery


def reconstruct(logs: Sequence[StreamLog], gap_factor: float = 0.5, seq0: int = 0,
                burst_s: float = BURST_S) -> list[dict[str, Any]]:
    """One engine's iteration rows (``/iteration_log`` form, ``t`` on the logs' clock) from the
    stream logs of every request it served; ``reconstructed`` marks them."""
    spread = _spread(_clusters(logs, gap_factor, burst_s))
    times = [t for t, _ in spread]
    members = [d for _, d in spread]
    first_of: dict[int, int] = {}
    last_of: dict[int, int] = {}
    for k, d in enumerate(members):
        for i in d:
            first_of.setdefault(i, k)
            last_of[i] = k
    held = {i: lg.input_tokens for i, lg in enumerate(logs)}
    subs = sorted((lg.submitted, i) for i, lg in enumerate(logs))
    sub_t = [s for s, _ in subs]
    rows: list[dict[str, Any]] = []
    admitted: set[int] = set()
    prev_t: float | None = None
    for k, t in enumerate(times):
        new = [i for i in members[k] if first_of[i] == k]
        cont = [i for i in members[k] if first_of[i] != k]
        admitted.update(new)
        for i, n in members[k].items():
            held[i] += n
        # busy since the last step: a request sent by then still had tokens to come
        busy = prev_t is not None and (any(last_of[i] >= k for i in admitted - set(new))
                                       or any(logs[i].submitted <= prev_t for i in members[k]))
        if busy:
            start = prev_t
        else:
            lo = bisect.bisect_right(sub_t, prev_t) if prev_t is not None else 0
            cands = [s for s, i in subs[lo:bisect.bisect_right(sub_t, t)] if i in members[k]]
            start = max(cands) if cands else (prev_t if prev_t is not None else t)
        live = [i for i in admitted if last_of[i] > k]  # a request's last token frees its KV
        row = {"seq": seq0 + k + 1, "t": t, "duration_s": max(t - start, 1e-9),
               "padded_s": max(t - start, 1e-9),
               "kv_tokens": sum(held[i] for i in live), "running": len(live), "retracted": 0,
               "reconstructed": True, "after_idle": not busy}
        if new:
            row.update(phase="prefill", batch_size=len(new),
                       prefill_tokens=sum(logs[i].input_tokens for i in new),
                       mixed_decode=len(cont))
        else:
            row.update(phase="decode", batch_size=len(cont), prefill_tokens=0)
        rows.append(row)
        admitted = {i for i in admitted if last_of[i] > k}
        prev_t = t
    return rows


def match_error(recon: Sequence[dict[str, Any]], logged: Sequence[dict[str, Any]],
                offset: float = 0.0) -> dict[str, float]:
    """How far reconstructed rows are from an engine's logged ones (``t`` + ``offset`` puts the
    reconstruction on the log's clock; the median delivery latency is then taken out): iteration
    counts, the share of logged steps matched by a row of the same phase within half a median
    step, and over the matched ones the share with
    the exact batch size, the median relative error of KV held and of the step interval, and the
    relative error of the summed intervals (what a rollout's time adds up)."""
    from .costfit import interval

    steps = [r for r in logged if r["phase"] in ("decode", "prefill")]
    if not steps or not recon:
        return {"logged": float(len(steps)), "reconstructed": float(len(recon)),
                "matched_share": 0.0}
    iv = {}
    prev = None
    for r in logged:
        if r["phase"] in ("decode", "prefill"):
            iv[r["seq"]] = interval(prev, r)
        prev = r
    tol = 0.5 * median(iv.values())
    rt = [float(r["t"]) + offset for r in recon]
    # the streams see every step late by about the same delivery latency: take it out first
    lags = []
    for r in steps:
        j = bisect.bisect_left(rt, float(r["t"]))
        near = [rt[c] - float(r["t"]) for c in (j - 1, j) if 0 <= c < len(rt)]
        if near:
            lags.append(min(near, key=abs))
    lag = median(lags) if lags else 0.0
    rt = [t - lag for t in rt]
    matched = []
    used: set[int] = set()
    for r in steps:
        j = bisect.bisect_left(rt, float(r["t"]))
        best = None
        for c in (j - 1, j, j + 1):
            if 0 <= c < len(rt) and c not in used and recon[c]["phase"] == r["phase"] \
                    and abs(rt[c] - float(r["t"])) <= tol \
                    and (best is None
                         or abs(rt[c] - float(r["t"])) < abs(rt[best] - float(r["t"]))):
                best = c
        if best is not None:
            used.add(best)
            matched.append((r, recon[best]))
    out = {"logged": float(len(steps)), "reconstructed": float(len(recon)),
           "matched_share": len(matched) / len(steps)}
    if matched:
        out["batch_exact_share"] = (sum(a["batch_size"] == b["batch_size"] for a, b in matched)
                                    / len(matched))
        kv = [abs(b["kv_tokens"] - a["kv_tokens"]) / a["kv_tokens"] for a, b in matched
              if a["kv_tokens"]]
        out["kv_median_rel_err"] = median(kv) if kv else 0.0
        def ref(a: dict[str, Any], b: dict[str, Any]) -> float:  # after idle: the step alone
            return float(a["duration_s"]) if b.get("after_idle") else iv[a["seq"]]
        du = [abs(b["duration_s"] - ref(a, b)) / ref(a, b) for a, b in matched if ref(a, b) > 0]
        out["interval_median_rel_err"] = median(du) if du else 0.0
        tot_l = sum(ref(a, b) for a, b in matched)
        tot_r = sum(b["duration_s"] for _, b in matched)
        out["total_rel_err"] = (tot_r - tot_l) / tot_l if tot_l else 0.0
    return out


def _merge(group: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Consecutive rebuilt rows as one iteration (the engine ran fewer than the streams showed)."""
    last = dict(group[-1])
    pre = [r for r in group if r["phase"] == "prefill"]
    last["duration_s"] = last["padded_s"] = sum(r["duration_s"] for r in group)
    last["after_idle"] = group[0].get("after_idle", False)
    if pre:
        last.update(phase="prefill", batch_size=sum(r["batch_size"] for r in pre),
                    prefill_tokens=sum(r["prefill_tokens"] for r in pre),
                    mixed_decode=max((r["batch_size"] for r in group if r["phase"] == "decode"),
                                     default=0))
    else:
        last["batch_size"] = max(r["batch_size"] for r in group)
    return last


def _split(row: dict[str, Any], k: int) -> list[dict[str, Any]]:
    """One rebuilt row as ``k`` iterations of its shape, evenly in its interval."""
    out = []
    for j in range(k):
        r = dict(row)
        r["duration_s"] = r["padded_s"] = row["duration_s"] / k
        r["t"] = row["t"] - row["duration_s"] * (k - 1 - j) / k
        if j < k - 1 and row["phase"] == "prefill":  # the prefill ends with the last piece
            r.update(phase="decode", batch_size=max(row.get("mixed_decode", 0), 1),
                     prefill_tokens=0)
        r["after_idle"] = row.get("after_idle", False) and j == 0
        out.append(r)
    return out


def fit_counts(rows: Sequence[dict[str, Any]],
               samples: Sequence[tuple[float, float]]) -> list[dict[str, Any]]:
    """Rebuilt rows made to agree with the engine's own iteration counter: ``samples`` are
    (time on the rows' clock, cumulative iterations) read from the engine while it ran (vLLM's
    ``vllm:iteration_tokens_total_count``). Between two samples, the rows there are merged
    (consecutive ones into one) or split until their number is the counter's increase; rows
    after a window without iterations join the next window. Outside the sampled span rows are
    kept as they are."""
    if len(samples) < 2 or not rows:
        return list(rows)
    rows = sorted(rows, key=lambda r: r["t"])
    out: list[dict[str, Any]] = [r for r in rows if r["t"] <= samples[0][0]]
    carry: list[dict[str, Any]] = []
    for (ta, ca), (tb, cb) in zip(samples, samples[1:]):
        win = carry + [r for r in rows if ta < r["t"] <= tb]
        n = int(round(cb - ca))
        if not win or n <= 0:
            carry = win
            continue
        carry = []
        m = len(win)
        if m >= n:
            bounds = [round(j * m / n) for j in range(n + 1)]
            out += [_merge(win[bounds[j]:bounds[j + 1]]) for j in range(n)]
        else:
            per = [n // m + (1 if j < n % m else 0) for j in range(m)]
            for r, k in zip(win, per):
                out += _split(r, k)
    out += carry + [r for r in rows if r["t"] > samples[-1][0]]
    for j, r in enumerate(out):
        r["seq"] = (out[0]["seq"] if out else 1) + j
    return out
