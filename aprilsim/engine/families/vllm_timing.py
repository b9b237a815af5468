"""What both engines' vLLM steppers share: the price of a step, the check that a request fits,
and how an engine's calls meet vLLM's steps (docs/simulator.md, "vLLM family").

A vLLM step computes, for each request it schedules, n new tokens over c tokens already in KV.
Rows of one token (decodes, and a prefill's last token) are its decode part: B of them reading
K = the sum of their c, priced as a decode iteration f(B) + g(B)*K. Rows of more tokens are its
prefill part: N tokens in R rows, attention sum((c+n)^2 - c^2) = Q, priced p0 + p1*N + p2*Q +
pr*R. A step costs the sum of the parts it has; a pure-decode step is exactly a decode iteration,
so a stretch of them takes `decode_span` in closed form.

The calls: a request submitted at `now` joins the first step that starts at or after `now`
(one already planned at `now` admits it as if it had been queued before: `VllmSteps.admit_more`);
an abort lands between steps (`abort_after_steps`: the step in flight, one starting at `now`
included, completes, then k more with the queue set aside); `pause` lets the step in flight
complete (one planned later waits for `until`) and starts none before `until` (a weight update
reaches vLLM's engine core between steps); `abort_all` stops at `now` (the step in flight
computes nothing: its tokens are lost, what it scheduled stays scheduled).
"""

from __future__ import annotations

from typing import Any

from aprilsim.engine.request import Completion, Request, check_requests


def step_time(cost: Any, decode: tuple[int, int],
              prefill: tuple[int, int, int]) -> tuple[float, float]:
    """(seconds of a step, of which its prefill part): `decode` = (b rows, over k KV tokens),
    `prefill` = (tokens, attention term sq, rows)."""
    b, k = decode
    tokens, sq, rows = prefill
    pre = cost.prefill_time(tokens, sq, 1, rows) if rows else 0.0
    if b:
        return cost.decode_time(b, k) + pre, pre
    return pre, pre


def check_blocks(reqs: list[Request], rules: Any) -> None:
    """Requests no vLLM engine under `rules` could serve: each must fit (its input and every
    token but its last) in the KV blocks alone and, with chunked prefill off, in one step's
    token budget (a preempted request recomputes them all at once; vLLM then requires
    max_num_batched_tokens >= max_model_len)."""
    check_requests(reqs, rules.kv_capacity)
    block = rules.block_size
    blocks = rules.kv_capacity // block
    for r in reqs:
        most = r.input_len + r.shared + r.max_new - 1
        if -(-most // block) > blocks:
            raise ValueError(f"request {r.rid} can never fit in the KV cache's {blocks} blocks "
                             f"of {block} tokens")
        if not rules.chunking and most > rules.budget:
            raise ValueError(f"request {r.rid}: {most} tokens exceed max_num_batched_tokens "
                             f"{rules.budget} with chunked prefill off (vLLM requires "
                             "max_num_batched_tokens >= max_model_len then)")


def finished(r: Request, t: float) -> Completion:
    """The completion of a request that reached its end (its stop token or its cap)."""
    return Completion(r.rid, r.gen, "length" if r.gen == r.max_new else "stop", t)


def postpone(engine: Any, until: float) -> None:
    """The step (or span) `engine` planned, not yet started, starts at `until` if later: a
    pause that came before it began (what it computes does not depend on when it runs)."""
    if until > engine.t:
        engine.t_event = until + (engine.t_event - engine.t)
        engine.t = until
