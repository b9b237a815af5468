"""Build engine requests from the simulator's :class:`aprilsim.types.Sample`.

A simulated sample has only lengths; a live engine needs token ids. Prompt ids are synthesised
deterministically from (group_id, prompt_len) so that the n samples of one group share a prompt
(as in GRPO) and the same workload always produces the same requests. The request runs in replay
mode: EOS is ignored and the engine generates exactly what is left of the target length, capped by
``sample.max_new_tokens`` (the remainder of max_response_len).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from aprilsim.types import Sample

from .protocol import GenerateRequest, SamplingParams

# Ids below this are left alone (special tokens: pad, bos, eos ... in most vocabularies).
FIRST_ORDINARY_ID = 16


def synth_token_ids(key: int, n: int, vocab_size: int, salt: int = 0) -> tuple[int, ...]:
    """``n`` deterministic pseudo-random ordinary token ids in [FIRST_ORDINARY_ID, vocab_size)."""
    if vocab_size <= FIRST_ORDINARY_ID:
        raise ValueError(f"vocab_size must exceed {FIRST_ORDINARY_ID}, got {vocab_size}")
    rng = np.random.default_rng([abs(int(key)), int(salt), 0x5A17])
    return tuple(int(x) for x in rng.integers(FIRST_ORDINARY_ID, vocab_size, size=n))


def prompt_ids_for(sample: Sample, vocab_size: int) -> tuple[int, ...]:
    """The synthetic prompt of ``sample``'s group (shared by every sample of the group)."""
    return synth_token_ids(sample.group_id, max(1, sample.prompt_len), vocab_size)


def tool_output_ids(sample: Sample, turn: int, n: int, vocab_size: int) -> tuple[int, ...]:
    """The ``n`` synthetic ids of episode ``sample``'s tool call after turn ``turn`` (the same
    in every request that carries them, so a prefix cache can hold them)."""
    return synth_token_ids(sample.uid, n, vocab_size, salt=2 + turn)


def episode_context(sample: Sample, output_ids: Sequence[int], vocab_size: int) -> tuple[int, ...]:
    """What follows the prompt in the context of episode ``sample``'s next request: the ids it
    generated (``output_ids``, as many as ``sample.generated``), each turn's followed by its tool
    call's output ids, for the tool calls that returned."""
    ep = sample.episode
    assert ep is not None
    out: list[int] = []
    start = 0
    for k in range(ep.turn):
        end = ep._ends[k]
        out += output_ids[start:end]
        out += tool_output_ids(sample, k, ep._tool_tokens[k], vocab_size)
        start = end
    out += output_ids[start:]
    return tuple(int(t) for t in out)


def request_from_sample(
    sample: Sample,
    vocab_size: int,
    partial_output_ids: Sequence[int] | None = None,
    sampling: SamplingParams | None = None,
    replay: bool = True,
) -> GenerateRequest:
    """The request that (re)submits ``sample``.

    A fresh sample sends its prompt. A resumed sample (``sample.generated > 0``) sends prompt +
    partial output ids; pass the ids the engine returned, or leave None to synthesise filler ids
    of the right length (same KV work, different tokens). ``max_new_tokens`` is
    ``sample.max_new_tokens``; in replay mode ``replay_len`` is what is left of the workload's
    target length.
    """
    if sample.generated > 0 and partial_output_ids is None:
        partial_output_ids = synth_token_ids(sample.uid, sample.generated, vocab_size, salt=1)
    partial = tuple(int(t) for t in (partial_output_ids or ()))
    if len(partial) != sample.generated:
        raise ValueError(
            f"sample {sample.uid}: {len(partial)} partial ids given, "
            f"sample.generated={sample.generated}"
        )
    return GenerateRequest(
        prompt_ids=prompt_ids_for(sample, vocab_size) + partial,
        max_new_tokens=sample.max_new_tokens,
        sampling=sampling or SamplingParams(),
        replay_len=max(0, sample._target_len - sample.generated) if replay else None,
        tag=sample.uid,
    )
