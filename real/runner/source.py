"""Where a live run's groups come from: the scenario's workload (replay) or a prompt file (free).

Both offer what a scheduler's ``ctx.new_groups`` / ``ctx.regenerate`` reach (the rollout core
registers the groups they draw) plus what the live driver needs: the request for a
(re)submission and, for free generation only, ``reveal``: when a response ends, whether it is
complete, and then its hidden truth (target length, reward). A replayed sample carries its truth
from the start, so the rollout core decides by it alone, exactly as in simulation.

*Replay* (default): the scenario's seeded workload draws the same groups as ``aprilsim simulate``
(common random numbers); each request asks for what is left of the sample's target length with
EOS ignored, so the engine generates exactly the simulated lengths. ``scale`` multiplies every
length (prompt, response, max_response_len; rounded, at least 1) so that a CPU engine can run a
GPU-sized scenario: a sample at the cap stays at the cap.

*Free*: prompts from JSONL (``input_ids`` or ``prompt`` text, optional ``answer``), lengths decided
by the model's EOS, rewards from a function; every completed sample's length is logged as JSONL
(``response_length``, ``prompt_id``, ``step``...) for ``aprilsim fit``.
"""

from __future__ import annotations

import importlib
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

from aprilsim.types import FinishReason, Group, Sample, turn_request
from aprilsim.workload import truth
from aprilsim.workload.generator import Workload
from aprilsim.workload.truth import ScaledWorkload
from real.protocol import GenerateRequest, SamplingParams
from real.samples import FIRST_ORDINARY_ID, episode_context, prompt_ids_for

RewardFn = Callable[[dict, list[int], Sample], float]


class LiveSource(Protocol):
    """What the live runtime asks of a source."""

    max_len: int
    group_size: int

    def new_groups(self, n: int, step: int, group_size: int | None = None) -> list[Group]: ...

    def regenerate(self, groups: Sequence[Group], step: int, group_size: int) -> list[Group]: ...

    def request(self, sample: Sample, partial_ids: Sequence[int],
                cap: int | None) -> GenerateRequest: ...

    def reveal(self, sample: Sample, how: str, output_ids: Sequence[int], step: int) -> bool: ...

    def expected_length(self, step: int) -> float: ...


class ReplaySource:
    """The scenario's workload, lengths scaled by ``scale``, replayed with EOS ignored."""

    def __init__(self, workload: Workload, vocab_size: int, scale: float = 1.0,
                 sampling: SamplingParams | None = None) -> None:
        self.workload = ScaledWorkload(workload, scale)  # the one length-scaling rule
        self.vocab_size, self.scale = vocab_size, scale
        self.max_len = self.workload.max_len
        self.group_size = workload.group_size
        self.sampling = sampling or SamplingParams()

    @property
    def agentic(self) -> bool:
        """Whether its samples may be episodes (the workload's)."""
        return bool(getattr(self.workload, "agentic", False))

    def new_groups(self, n: int, step: int, group_size: int | None = None) -> list[Group]:
        return self.workload.generate(n, step, group_size)

    def regenerate(self, groups: Sequence[Group], step: int, group_size: int) -> list[Group]:
        return self.workload.regenerate(groups, step, group_size)

    def request(self, sample: Sample, partial_ids: Sequence[int],
                cap: int | None) -> GenerateRequest:
        g = sample.generated
        ep = sample.episode
        if ep is not None:  # its next turn: the context so far, tool outputs included
            n_in, max_new, target = turn_request(sample, ep, cap)
            prompt = prompt_ids_for(sample, self.vocab_size) + episode_context(
                sample, partial_ids, self.vocab_size)
            assert len(prompt) == n_in
            return GenerateRequest(prompt_ids=prompt, max_new_tokens=max_new,
                                   sampling=self.sampling, replay_len=target, tag=sample.uid)
        prompt = prompt_ids_for(sample, self.vocab_size) + tuple(partial_ids)
        left = sample.max_len - g
        return GenerateRequest(prompt_ids=prompt,
                               max_new_tokens=left if cap is None else min(cap, left),
                               sampling=self.sampling, replay_len=sample._target_len - g,
                               tag=sample.uid)

    def reveal(self, sample: Sample, how: str, output_ids: Sequence[int], step: int) -> bool:
        """Never asked: a replayed sample's target is known from the start."""
        return sample.generated >= sample._target_len

    def expected_length(self, step: int) -> float:
        return self.workload.expected_length(step)


# ------------------------------------------------------------------------------ free mode
def byte_token_ids(text: str, vocab_size: int) -> tuple[int, ...]:
    """A toy tokenizer for the bundled engine: one id per UTF-8 byte, above the special ids."""
    span = vocab_size - FIRST_ORDINARY_ID
    return tuple(FIRST_ORDINARY_ID + (b % span) for b in text.encode()) or (FIRST_ORDINARY_ID,)


def toy_verifier(prompt: dict, output_ids: list[int], sample: Sample) -> float:
    """1.0 when the response contains the prompt's ``answer`` ids (a list, or text through the
    byte tokenizer at the vocabulary of 512), else 0.0; without an answer, 1.0 when the last
    token id is even (a coin that a random model flips)."""
    ans = prompt.get("answer")
    if ans is None:
        return float(bool(output_ids) and output_ids[-1] % 2 == 0)
    ids = list(ans) if isinstance(ans, list) else list(byte_token_ids(str(ans), 512))
    n = len(ids)
    return float(any(output_ids[i:i + n] == ids for i in range(len(output_ids) - n + 1)))


def load_callable(spec: str) -> Callable[..., Any]:
    """``module:function`` (``examples`` and the working directory are importable)."""
    mod, sep, attr = spec.partition(":")
    if not sep or not mod or not attr:
        raise ValueError(f"{spec!r} is not module:function")
    try:
        fn = getattr(importlib.import_module(mod), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"cannot load {spec!r}: {e}") from None
    if not callable(fn):
        raise ValueError(f"{spec!r} is not callable")
    return fn


def read_prompts(path: str | Path, vocab_size: int) -> list[tuple[dict, tuple[int, ...]]]:
    """(record, prompt ids) for each JSONL line with ``input_ids`` or ``prompt``."""
    out = []
    with Path(path).open() as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                raise ValueError(f"{path}:{n}: not JSON") from None
            if isinstance(rec.get("input_ids"), list) and rec["input_ids"]:
                ids = tuple(int(t) for t in rec["input_ids"])
                if max(ids) >= vocab_size or min(ids) < 0:
                    raise ValueError(f"{path}:{n}: a token id is outside the "
                                     f"vocabulary [0, {vocab_size})")
            elif isinstance(rec.get("prompt"), str):
                ids = byte_token_ids(rec["prompt"], vocab_size)
            else:
                raise ValueError(f"{path}:{n}: needs 'input_ids' (a list) or 'prompt' (text)")
            out.append((rec, ids))
    if not out:
        raise ValueError(f"{path}: no prompts")
    return out


class FreeSource:
    """Prompts from a file, lengths decided by the model's EOS, rewards from ``reward``."""

    def __init__(self, prompts: list[tuple[dict, tuple[int, ...]]], *, group_size: int,
                 max_len: int,
                 reward: RewardFn = toy_verifier, eos_ids: Sequence[int] = (2,),
                 temperature: float = 1.0, seed: int = 0, lengths_log: IO[str] | None = None,
                 label: str = "") -> None:
        self.prompts, self.group_size, self.max_len = prompts, group_size, max_len
        self.reward, self.eos_ids, self.temperature, self.seed = (reward, tuple(eos_ids),
                                                                  temperature, seed)
        self.lengths_log, self.label = lengths_log, label
        self._next_prompt = self._next_gid = self._next_uid = 0
        self._record: dict[int, int] = {}  # gid -> prompt index
        self._lengths: list[int] = []

    def _group(self, key: int, step: int, n: int) -> Group:
        _, ids = self.prompts[key % len(self.prompts)]
        gid = self._next_gid
        self._next_gid += 1
        samples = [Sample(self._next_uid + i, gid, i, len(ids), None, self.max_len, None)
                   for i in range(n)]
        self._next_uid += n
        self._record[gid] = key
        return Group(gid, len(ids), samples, step, math.nan, key)

    def new_groups(self, n: int, step: int, group_size: int | None = None) -> list[Group]:
        size = self.group_size if group_size is None else group_size
        out = [self._group(self._next_prompt + j, step, size) for j in range(n)]
        self._next_prompt += n
        return out

    def regenerate(self, groups: Sequence[Group], step: int, group_size: int) -> list[Group]:
        return [self._group(g.prompt_key, step, group_size) for g in groups]

    def request(self, sample: Sample, partial_ids: Sequence[int],
                cap: int | None) -> GenerateRequest:
        _, ids = self.prompts[self._record[sample.group_id] % len(self.prompts)]
        left = sample.max_len - sample.generated
        sampling = SamplingParams(temperature=self.temperature, stop_token_ids=self.eos_ids,
                                  seed=(self.seed * 1_000_003 + sample.uid * 97
                                        + sample.submits) % 2**31)
        return GenerateRequest(prompt_ids=ids + tuple(partial_ids),
                               max_new_tokens=left if cap is None else min(cap, left),
                               sampling=sampling, tag=sample.uid)

    def reveal(self, sample: Sample, how: str, output_ids: Sequence[int], step: int) -> bool:
        """The response just ended (``how``: stop, length, abort or failed): complete when the
        model stopped or it reached max_response_len; then its length and reward are known."""
        done = how == FinishReason.STOP.value or sample.generated >= sample.max_len
        if not done:
            return False
        key = self._record[sample.group_id]
        rec, _ = self.prompts[key % len(self.prompts)]
        truth.reveal(sample, sample.generated, self.reward(rec, list(output_ids), sample))
        self._lengths.append(sample.generated)
        if self.lengths_log is not None:
            self.lengths_log.write(json.dumps({
                "response_length": sample.generated, "prompt_id": key, "step": step,
                "finish_reason": "length" if sample.generated >= sample.max_len else "stop",
                "reward": sample._reward, "scheduler": self.label}) + "\n")
        return True

    def expected_length(self, step: int) -> float:
        """The mean length observed so far (free mode has no workload model)."""
        return sum(self._lengths) / len(self._lengths) if self._lengths else 0.0
