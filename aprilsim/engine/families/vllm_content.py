"""Synthetic token ids for the simulator's requests, so that vLLM's prefix cache (which hashes
tokens) sees what a live engine would: the same prompt has the same tokens, and a sample's
output tokens are its own, the same in every request that carries them.

A request (`Request`) holds no tokens; its content is read from its keys:

* the prompt: `prompt` (the workload's prompt id: the same in every epoch and every group
  regenerated from it), else the group key of a shared prefix (`prefix`), else a prompt of its
  own. Token j of prompt p is `prompt_token(p, j)` whatever the prompt's length;
* the sample: `seq` (the sample's id), else a sample of its own. Output token j of sample s is
  `sample_token(s, j)`: a resumed request carries the first `carried` of them in its input, and
  generates `carried`, `carried + 1`, ... next.

So a request's input is the prompt's `prompt_len(r)` tokens then the sample's first `carried`.
`content(r)` gives both keys and the lengths. The ids are disjoint ints (a kind in the low two
bits, the position in the low 24 bits above an id: no two (kind, id, position) share one), so two
token sequences are equal exactly when they come from the same prompt and the same sample. The
per-iteration reference engine feeds these tokens to `VllmSteps` (which hashes them, as vLLM
does); the fast engine keys the same blocks without building them: block i of a prompt by the
prompt's key and i, a sample's blocks by the sample's key and their index.
"""

from __future__ import annotations

from dataclasses import dataclass

from aprilsim.engine.request import Request

POS_BITS = 24  # positions below 2**24 (16M tokens) in one prompt or sample
STOP = -1  # the token a request samples last when it stops before its cap (never a content id)
_PROMPT, _SAMPLE, _OWN_PROMPT, _OWN_SAMPLE = 0, 1, 2, 3


@dataclass(frozen=True, slots=True)
class Content:
    """What a request's tokens are: its prompt's key and length, its sample's key, and how many
    of the sample's output tokens its input carries."""

    prompt_key: int
    prompt_len: int
    sample_key: int
    carried: int

    def input_tokens(self) -> list[int]:
        """The request's input: the prompt, then the sample's carried output."""
        p, s = self.prompt_key, self.sample_key
        return [p | j for j in range(self.prompt_len)] + [s | j for j in range(self.carried)]

    def output_token(self, i: int) -> int:
        """The request's i-th generated token (the sample's `carried + i`-th)."""
        return self.sample_key | (self.carried + i)


def keys(r: Request) -> tuple[int, int, int]:
    """(prompt key, prompt length, sample key) of request `r` (module docstring)."""
    if r.prompt >= 0:
        p = (r.prompt * 4 + _PROMPT) << POS_BITS
    elif r.shared and r.prefix >= 0:
        p = (r.prefix * 4 + _PROMPT) << POS_BITS
    else:
        p = (r.rid * 4 + _OWN_PROMPT) << POS_BITS
    s = (r.seq * 4 + _SAMPLE) << POS_BITS if r.seq >= 0 else (r.rid * 4 + _OWN_SAMPLE) << POS_BITS
    return p, r.input_len + r.shared - r.carried, s


def content(r: Request) -> Content:
    """The content of request `r` (module docstring)."""
    p, n, s = keys(r)
    return Content(p, n, s, r.carried)
