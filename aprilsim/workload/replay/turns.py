"""Multi-turn (agentic) responses in run logs: turns, per-turn lengths, tool tokens, tool time.

A multi-turn response interleaves the model's tokens with tool outputs appended to the context.
The frameworks log it as one response: slime's ``Sample`` has ``tokens`` (prompt + response),
``response_length`` (every response token, tool outputs included) and ``loss_mask`` (one 0/1 per
response token: 1 for the model's, 0 for a tool's, as slime's multi-turn generate functions
build it, e.g. ``examples/search-r1``), and ``non_generation_time`` (seconds the sample spent
outside generation: its tool calls); verl's agent loop dumps decoded text only, in which a tool
response sits between markers (``<tool_response>...</tool_response>`` in the Hermes/Qwen
template its tool agent loop renders), so the text splits into turns and the run's tokenizer
counts each part.

`LoggedTurns` is what replay needs of one such response: the tokens the model generated per turn
and, between two turns, each tool call's output tokens and, where logged, its seconds. Replay
then runs it as an episode (`aprilsim.types.Episode`): its generated tokens are the model's
exactly, its tool tokens are prefilled by the next turn, and its tool calls wait their time.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aprilsim.types import Episode

__all__ = ["LoggedTurns", "episode_of", "episodes_table", "turns_from_mask", "turns_from_text"]

# verl's tool agent loop: a tool response rendered by the Hermes/Qwen chat template, decoded with
# the special tokens skipped ("user\n<tool_response>\n...\n</tool_response>\nassistant\n")
VERL_TOOL_PATTERN = (r"(?:user\s*)?(?:<tool_response>.*?</tool_response>\s*)+"
                     r"(?:assistant\s*)?")


@dataclass(frozen=True)
class LoggedTurns:
    """One multi-turn response: generated tokens per model turn, and per tool call between two
    turns its output tokens and seconds (None: not logged)."""

    lengths: tuple[int, ...]
    tool_tokens: tuple[int, ...]
    tool_s: tuple[float, ...] | None = None
    trailing_tool_tokens: int = 0  # a tool output after the last model turn (the run stopped)

    def __post_init__(self) -> None:
        if not self.lengths or min(self.lengths) < 1:
            raise ValueError("a multi-turn response needs model turns of at least one token")
        if len(self.tool_tokens) != len(self.lengths) - 1:
            raise ValueError("one tool call between two model turns")

    @property
    def generated(self) -> int:
        """Tokens the model generated (every turn)."""
        return sum(self.lengths)


def _runs(mask: Sequence[Any]) -> list[tuple[int, int]]:
    """(value, length) of each maximal run of equal values in a 0/1 mask."""
    out: list[tuple[int, int]] = []
    for x in mask:
        v = 1 if int(x) else 0
        if out and out[-1][0] == v:
            out[-1] = (v, out[-1][1] + 1)
        else:
            out.append((v, 1))
    return out


def turns_from_mask(mask: Sequence[Any], tool_seconds: float | None = None) -> LoggedTurns | None:
    """The turns of a slime response from its ``loss_mask`` (None: a single-turn response, or a
    mask with no model token). Tool outputs before the first model token are context, not a
    turn (they are left out); `tool_seconds` (slime's ``non_generation_time``) is split evenly
    over the tool calls, the share a call took not being logged."""
    runs = _runs(mask)
    while runs and runs[0][0] == 0:
        runs.pop(0)
    trailing = runs.pop()[1] if runs and runs[-1][0] == 0 else 0
    lengths = tuple(n for v, n in runs if v == 1)
    tools = tuple(n for v, n in runs if v == 0)
    if len(lengths) < 2:  # one model turn: a plain response of sum(mask) tokens
        return None
    secs = None
    if tool_seconds is not None and tool_seconds > 0 and tools:
        secs = (float(tool_seconds) / len(tools),) * len(tools)
    return LoggedTurns(lengths, tools, secs, trailing)


def turns_from_text(text: str, count: Callable[[str], int], pattern: str = VERL_TOOL_PATTERN,
                    eos_tokens: int = 0) -> LoggedTurns | None:
    """The turns of a decoded multi-turn response (verl's dumps): the text split at the tool
    responses `pattern` matches, each part counted by `count` (the run's tokenizer); the last
    turn gets `eos_tokens` (the EOS the decoding skipped). None: no tool response in it."""
    parts = re.split(f"({pattern})", text, flags=re.DOTALL)
    model = parts[0::2]
    tools = parts[1::2]
    if not tools:
        return None
    lengths: list[int] = []
    tool_tokens: list[int] = []
    pending = 0  # tool tokens since the last model turn
    for k, part in enumerate(model):
        n = count(part)
        if n and lengths:
            tool_tokens.append(pending)
        if n:
            lengths.append(n)
            pending = 0
        if k < len(tools):  # before the first turn: context; between turns: one call's output
            pending += count(tools[k]) if lengths else 0
    if not lengths:
        return None
    lengths[-1] += eos_tokens
    return LoggedTurns(tuple(lengths), tuple(tool_tokens), None, pending)


def episode_of(turns: LoggedTurns, max_len: int, tool_s: float) -> Episode:
    """The episode replay runs for a logged multi-turn response: its turns and tool calls as
    logged (cut at `max_len`, the response budget), each call `tool_s` seconds where the log
    has no time for it; a turn may generate up to `max_len`."""
    from aprilsim.workload.episodes import plan_episode

    secs = list(turns.tool_s) if turns.tool_s is not None else [tool_s] * len(turns.tool_tokens)
    ends, s, toks = plan_episode(list(turns.lengths), secs, list(turns.tool_tokens), max_len,
                                 max_len)
    return Episode(ends, s, toks, max_len)


def episodes_table(turns: Sequence[LoggedTurns]) -> dict[str, Any]:
    """A `[workload.episodes]` table fitted to logged multi-turn responses: the turns' range,
    each tool call's output tokens and (where logged) seconds as empirical laws (their values,
    at most 2,000, evenly picked), and `per_turn_lengths`: every turn's generated tokens, to fit
    the per-turn `[lengths]` model with `aprilsim fit` (left out of the table itself)."""
    if not turns:
        raise ValueError("no multi-turn responses to fit")

    def empirical(xs: list[float]) -> dict[str, Any]:
        xs = sorted(xs)
        step = max(1, len(xs) // 2000)
        return {"family": "empirical", "values": xs[::step]}

    counts = [len(t.lengths) for t in turns]
    tokens = [float(x) for t in turns for x in t.tool_tokens]
    table: dict[str, Any] = {"min_turns": min(counts), "max_turns": max(counts)}
    if tokens:
        table["tool_tokens"] = empirical(tokens)
    secs = [s for t in turns if t.tool_s is not None for s in t.tool_s]
    if secs:
        table["tool_s"] = empirical(secs)
    return {"episodes": table,
            "per_turn_lengths": [n for t in turns for n in t.lengths]}
