"""Agentic rollouts' figures: per step (`AgentStep`) and per run (`agent_summary`).

Only runs whose samples are episodes (`[workload.episodes]`) carry them: a step record gets an
`agent` record and the summary the keys below, so single-turn runs keep their exact records.
Tokens generated, tokens prefilled and tool time are separate quantities everywhere (docs/
metrics.md, "Agentic rollouts").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from aprilsim.types import Sample

__all__ = ["AGENT_KEYS", "AgentStep", "agent_lines", "agent_summary", "turn_lags"]


@dataclass
class AgentStep:
    """What the episodes of one training step did (docs/metrics.md, "Agentic rollouts")."""

    tool_calls: int = 0  # tool calls that returned during the rollout phase
    tool_time_s: float = 0.0  # their seconds, summed
    tool_wait_s: float = 0.0  # rollout seconds with every episode in flight in a tool call
    cache_hit_tokens: int = 0  # input tokens the engines' prefix cache served (not computed)
    trained_episodes: int = 0
    trained_turns: int = 0  # model turns of the trained episodes
    trained_tool_tokens: int = 0  # tool tokens in their contexts (prefilled, loss-masked)
    trained_context_tokens: int = 0  # their final contexts: prompt + generated + tool tokens
    trained_versions: int = 0  # distinct policy versions per trained episode, summed
    trained_offpolicy_turns: int = 0  # trained turns begun under a version older than trained

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def turn_lags(s: Sample, trainer_version: int) -> tuple[int, int]:
    """(distinct policy versions of episode `s`'s tokens, its turns whose oldest token is older
    than `trainer_version`): a turn's tokens are those between two of its plan's turn ends."""
    ep = s.episode
    if ep is None or not s.segments:
        return 0, 0
    versions = {seg.version for seg in s.segments}
    spans = []  # (first token, past the last, version) of each segment
    pos = 0
    for seg in s.segments:
        spans.append((pos, pos + seg.tokens, seg.version))
        pos += seg.tokens
    stale = start = 0
    for end in ep._ends[: ep.turn + 1]:
        end = min(end, s.generated)
        vs = [v for a, b, v in spans if a < end and b > start]
        if vs and min(vs) < trainer_version:
            stale += 1
        start = end
    return len(versions), stale


AGENT_KEYS = ("episodes_per_s", "turns_per_episode", "tool_wait_share", "tool_time_s",
              "tool_calls", "prefilled_tokens", "cache_hit_share", "mean_context_tokens",
              "context_growth_per_turn", "tool_tokens", "policy_versions_per_episode",
              "offpolicy_turn_fraction")


def agent_summary(steps: Sequence[Any], samples_per_s: float) -> dict[str, Any]:
    """The run's agentic figures over `steps` (StepRecords; {} when none has an `agent`)."""
    recs = [s.agent for s in steps if getattr(s, "agent", None) is not None]
    if not recs:
        return {}
    roll = sum(s.rollout_time_s for s in steps)
    eps = sum(a.trained_episodes for a in recs)
    turns = sum(a.trained_turns for a in recs)
    prefilled = sum(s.prefill_tokens for s in steps)
    hits = sum(a.cache_hit_tokens for a in recs)
    ctx = sum(a.trained_context_tokens for a in recs)
    prompt = sum(s.trained_prompt_tokens for s in steps)
    return {
        "episodes_per_s": samples_per_s,
        "turns_per_episode": turns / eps if eps else 0.0,
        "tool_wait_share": sum(a.tool_wait_s for a in recs) / roll if roll else 0.0,
        "tool_time_s": sum(a.tool_time_s for a in recs),
        "tool_calls": sum(a.tool_calls for a in recs),
        "prefilled_tokens": prefilled,
        "cache_hit_share": hits / (hits + prefilled) if hits + prefilled else 0.0,
        "mean_context_tokens": ctx / eps if eps else 0.0,
        "context_growth_per_turn": (ctx - prompt) / turns if turns else 0.0,
        "tool_tokens": sum(a.trained_tool_tokens for a in recs),
        "policy_versions_per_episode": sum(a.trained_versions for a in recs) / eps if eps else 0.0,
        "offpolicy_turn_fraction": (sum(a.trained_offpolicy_turns for a in recs) / turns
                                    if turns else 0.0),
    }


def agent_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The block `aprilsim simulate` prints for agentic runs (one line per scheduler; with
    several seeds, `rows` holds each scheduler's first-seed row, or the means)."""
    rows = [r for r in rows if "turns_per_episode" in r]
    if not rows:
        return []
    heads = ["scheduler", "episodes/s", "turns/ep", "tool-wait", "tool s", "generated",
             "prefilled", "cache hit", "context", "growth/turn", "versions/ep", "off-pol turns"]
    cells = [[r["scheduler"], f"{r['episodes_per_s']:.3f}", f"{r['turns_per_episode']:.2f}",
              f"{r['tool_wait_share']:.1%}", f"{r['tool_time_s']:,.0f}",
              f"{r['generated_tokens']:,.0f}", f"{r['prefilled_tokens']:,.0f}",
              f"{r['cache_hit_share']:.1%}", f"{r['mean_context_tokens']:,.0f}",
              f"{r['context_growth_per_turn']:,.0f}", f"{r['policy_versions_per_episode']:.2f}",
              f"{r['offpolicy_turn_fraction']:.1%}"] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]

    def line(xs: list[str]) -> str:
        return "  ".join(x.rjust(w) if i else x.ljust(w)
                         for i, (x, w) in enumerate(zip(xs, widths)))

    title = ("episodes (docs/agents.md): tool-wait = share of rollout time every episode in "
             "flight waits on a tool; generated and prefilled tokens and tool seconds apart:")
    return [title, line(heads), *map(line, cells)]
