"""Agentic episodes: a sample made of model turns and tool calls, drawn with common random numbers.

An episode (`aprilsim.types.Episode`) is a group member whose hidden truth is a plan of turns:
per turn the tokens the model generates, then, unless it is the last, a tool call that takes
some seconds (no engine work) and appends some tokens to the context (prefilled by the next
turn, never generated, masked from the loss). It ends on an answer (its last planned turn), at
`max_turns` (the plan never has more), or at the context limit: its response (generated plus
tool tokens) reaches `max_response_len`, and the turn that reaches it is cut there (truncated).

Every draw of sample j of group k is a pure function of (seed, k, j, turn), by counter-based
random numbers (`counter_rng.turn_uniforms`), so every scheduler sees the same episodes. Hard
prompts (a high prompt effect, the one that lengthens a group's responses) take more turns and
longer ones: the number of turns and each turn's length share the prompt effect through the
same Gaussian copula as single-turn lengths, with the workload's `prompt_share`.

`aprilsim.types.turn_request` is the one rule that turns an episode's state into the request of
its next turn (what the simulated engines' `RequestBuilder` and the live replay source build).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from aprilsim.types import Episode, turn_request
from aprilsim.workload import counter_rng as crn
from aprilsim.workload.lengths import LengthModel, cap_lengths

__all__ = ["Draw", "EpisodeModel", "TurnLengths", "Uniform", "plan_episode", "turn_request"]

_MEAN_KEY0 = 1 << 40  # prompt keys of the fixed sample behind `EpisodeModel.mean_generated`
_MEAN_GROUPS = 512


class Draw(Protocol):
    """A positive quantity drawn by its quantile function (a length model, `Uniform`)."""

    def ppf(self, q: np.ndarray) -> np.ndarray: ...

    def mean(self) -> float: ...


@dataclass(frozen=True)
class Uniform:
    """Uniform on [low, high]."""

    low: float
    high: float

    def __post_init__(self) -> None:
        if not 0 <= self.low <= self.high:
            raise ValueError(f"uniform: need 0 <= low <= high, got low {self.low}, "
                             f"high {self.high}")

    def ppf(self, q: np.ndarray) -> np.ndarray:
        return self.low + (self.high - self.low) * np.asarray(q, float)

    def mean(self) -> float:
        return (self.low + self.high) / 2


def plan_episode(lengths: list[int], tool_s: list[float], tool_tokens: list[int], max_len: int,
                 turn_cap: int) -> tuple[list[int], list[float], list[int]]:
    """The plan of an episode whose turns would generate `lengths` (each at most `turn_cap`),
    with tool calls after each but the last, cut at the context limit: the response (generated
    and tool tokens) never passes `max_len`; a tool output is cut to leave the next turn one
    token, and the turn that reaches `max_len` is the last (truncated). Returns the cumulative
    generated tokens at each turn's end, and the kept tool calls' seconds and tokens."""
    ends: list[int] = []
    secs: list[float] = []
    toks: list[int] = []
    gen = resp = 0
    last = len(lengths) - 1
    for k, n in enumerate(lengths):
        n = min(max(1, n), turn_cap, max_len - resp)
        gen += n
        resp += n
        ends.append(gen)
        if k == last or resp >= max_len:
            break
        t = min(max(0, tool_tokens[k]), max_len - resp - 1)
        secs.append(tool_s[k])
        toks.append(t)
        resp += t
    return ends, secs, toks


@dataclass(frozen=True)
class TurnLengths:
    """How an episode's turn lengths are drawn: the workload's length model (per turn), the
    prompt effect's share of each draw (`prompt_share`), the step's drift scale, and the
    context limit (`max_response_len`)."""

    model: LengthModel
    rho: float
    scale: float
    max_len: int


@dataclass(frozen=True)
class EpisodeModel:
    """`[workload.episodes]`: how many turns, and per tool call its latency and output tokens.

    Turn lengths follow the workload's length model (`[lengths]`: per turn), capped at
    `max_turn_len` (the per-turn max_new_tokens; None: max_response_len)."""

    max_turns: int
    min_turns: int = 1
    tool_s: Draw = Uniform(0.1, 1.0)
    tool_tokens: Draw = Uniform(40.0, 200.0)
    max_turn_len: int | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.min_turns <= self.max_turns:
            raise ValueError(f"need 1 <= min_turns <= max_turns, got {self.min_turns} and "
                             f"{self.max_turns}")
        if self.max_turn_len is not None and self.max_turn_len < 1:
            raise ValueError("max_turn_len must be >= 1")

    def turn_cap(self, max_len: int) -> int:
        """What one turn may generate at most."""
        return max_len if self.max_turn_len is None else min(self.max_turn_len, max_len)

    def draw(self, seed: int, keys: np.ndarray, n: int, u_prompt: np.ndarray,
             how: TurnLengths) -> list[list[Episode]]:
        """The episodes of groups `keys` (their fresh-prompt indices), `n` each: turn counts and
        turn lengths through the copula on `u_prompt` (share `how.rho`), tool calls
        independent."""
        from scipy import special  # on first use: the CLI starts without scipy

        rho, max_len = how.rho, how.max_len

        idx = np.arange(n, dtype=np.int64)
        span = self.max_turns - self.min_turns + 1
        z_n = np.sqrt(rho) * u_prompt[:, None] + np.sqrt(1.0 - rho) * crn.normals(
            seed, crn.TURNS, keys, idx)
        turns = np.minimum(self.min_turns + np.floor(special.ndtr(z_n) * span).astype(np.int64),
                           self.max_turns)
        t = self.max_turns
        u_turn = special.ndtri(crn.turn_uniforms(seed, crn.TURN_EFFECT, keys, idx, t))
        z = np.sqrt(rho) * u_prompt[:, None, None] + np.sqrt(1.0 - rho) * u_turn
        raw = how.model.ppf(special.ndtr(z))
        if how.scale != 1.0:
            raw = raw * how.scale
        cap = self.turn_cap(max_len)
        lens = cap_lengths(raw, cap).tolist()
        secs = self.tool_s.ppf(crn.turn_uniforms(seed, crn.TOOL_SECONDS, keys, idx, t)).tolist()
        toks = np.rint(self.tool_tokens.ppf(
            crn.turn_uniforms(seed, crn.TOOL_TOKENS, keys, idx, t))).astype(np.int64).tolist()
        out: list[list[Episode]] = []
        for i, row in enumerate(turns.tolist()):
            eps = []
            for j, k in enumerate(row):
                ends, s, tk = plan_episode(lens[i][j][:k], secs[i][j], toks[i][j], max_len, cap)
                eps.append(Episode(ends, s, tk, cap))
            out.append(eps)
        return out

    def mean_generated(self, how: TurnLengths) -> float:
        """Mean generated tokens per episode (a fixed sample of episodes: deterministic)."""
        keys = np.arange(_MEAN_KEY0, _MEAN_KEY0 + _MEAN_GROUPS, dtype=np.int64)
        u_prompt = crn.normals(0, crn.PROMPT_EFFECT, keys)
        eps = self.draw(0, keys, 4, u_prompt, how)
        return float(np.mean([e._ends[-1] for row in eps for e in row]))


def draw_from_dict(d: dict[str, Any], where: str) -> Draw:
    """A tool-call quantity from a scenario table: `{low, high}` (uniform) or a length model."""
    d = dict(d)
    if "family" not in d:
        unknown = sorted(set(d) - {"low", "high"})
        if unknown or "low" not in d or "high" not in d:
            raise ValueError(f"{where}: give {{low = ..., high = ...}} (uniform) or a length "
                             f"model {{family = ..., ...}}")
        lo, hi = d["low"], d["high"]
        for v in (lo, hi):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v):
                raise ValueError(f"{where}: low and high must be finite numbers, got {v!r}")
        try:
            return Uniform(float(lo), float(hi))
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
    from aprilsim.workload.lengths import length_model_from_dict

    return length_model_from_dict(d)
