"""The hidden truth of a sample (its target length and reward): every write after creation is here.

A workload draws the truth when it creates a sample; afterwards only three things may change it,
all through this module: scaling a workload's lengths for a small engine (`scale_groups`, used by
the live replay source and by the simulation that matches it), and learning it when a free
response ends or a logged one is replayed (`reveal`). The rollout core and the engines' drivers
read it; schedulers never do (docs/concepts.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aprilsim.types import Episode, Group, Sample


def scaled_length(x: int, factor: float) -> int:
    """`x` tokens scaled by `factor`, rounded, at least 1."""
    return max(1, int(round(x * factor)))


def scale_groups(groups: Sequence[Group], factor: float, max_len: int) -> None:
    """Scale every length of `groups` in place (prompt, target, max_response_len -> `max_len`).

    A sample at the cap stays at the cap and one below stays below it, so scaling never turns a
    stop into a truncation (or back).
    """
    if factor == 1:
        return
    below = max(1, max_len - 1)
    for g in groups:
        g.prompt_len = scaled_length(g.prompt_len, factor)
        for s in g.samples:
            at_cap = s._target_len is not None and s._target_len >= s.max_len
            s.prompt_len = g.prompt_len
            s.max_len = max_len
            if s.episode is not None:
                _scale_episode(s, factor, max_len)
            elif s._target_len is not None:
                s._target_len = (max_len if at_cap
                                 else min(below, scaled_length(s._target_len, factor)))


def _scale_episode(s: Sample, factor: float, max_len: int) -> None:
    """Scale an episode's plan: each turn's tokens and each tool call's output (at least one
    token a turn), planned again within `max_len` (`episodes.plan_episode`)."""
    from aprilsim.workload.episodes import plan_episode

    ep = s.episode
    assert ep is not None
    turns = [b - a for a, b in zip([0, *ep._ends[:-1]], ep._ends)]
    cap = min(max_len, scaled_length(ep._turn_cap, factor))
    ends, secs, toks = plan_episode([scaled_length(n, factor) for n in turns], ep._tool_s,
                                    [int(round(t * factor)) for t in ep._tool_tokens], max_len, cap)
    s.episode = Episode(ends, secs, toks, cap)
    s._target_len = ends[-1]


def reveal(sample: Sample, target_len: int, reward: float | None = None) -> None:
    """The response ended: its length is `target_len` (and its reward, when given), from now on."""
    sample._target_len = target_len
    if reward is not None:
        sample._reward = float(reward)


class ScaledWorkload:
    """A workload whose lengths are multiplied by `scale` (in (0, 1]), as a live replay on a small
    engine runs it; everything else is delegated to the wrapped workload."""

    def __init__(self, workload: Any, scale: float) -> None:
        if not 0 < scale <= 1:
            raise ValueError(f"scale must lie in (0, 1], got {scale}")
        self._w, self.scale = workload, scale
        self.max_len = scaled_length(workload.max_len, scale)
        self.group_size = workload.group_size
        self.prompt_lengths = _ScaledMean(workload.prompt_lengths, scale)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._w, name)

    def generate(self, n: int, step: int, group_size: int | None = None) -> list[Group]:
        """`n` fresh groups, scaled."""
        groups = self._w.generate(n, step, group_size)
        scale_groups(groups, self.scale, self.max_len)
        return groups

    def regenerate(self, groups: Sequence[Group], step: int, group_size: int) -> list[Group]:
        """Fresh groups for the prompts of `groups` (scaled already: their lengths are copied)."""
        return self._w.regenerate(list(groups), step, group_size)

    def expected_length(self, step: int) -> float:
        """The workload's mean capped response length at `step`, scaled."""
        return self._w.expected_length(step) * self.scale


class _ScaledMean:
    """A length model seen only through `mean()` (what the simulation's peak-rate figure asks)."""

    def __init__(self, model: Any, scale: float) -> None:
        self._m, self._f = model, scale

    def mean(self) -> float:
        return float(self._m.mean()) * self._f
