"""The nouns shared by the simulator and the live-engine runner: samples, groups, segments.

A *sample* is one response being generated; a *group* is the n samples of one prompt (GRPO).
A *segment* is a run of tokens of one sample generated under one policy version. These types
carry no clock and no I/O, so `aprilsim.sim` and `real/` can both use them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Final

from aprilsim.sample_error import UnfinishedSampleError


class SampleStatus(str, Enum):
    """Where a sample is in its life; the ledger of conservation is built on this."""

    PENDING = "pending"  # created, never submitted
    RUNNING = "running"  # submitted to an engine, not yet returned
    PARTIAL = "partial"  # returned unfinished (aborted); may be resumed
    DONE = "done"  # finished: stop token or max_response_len
    TRAINED = "trained"  # part of a batch handed to the trainer
    DISCARDED = "discarded"  # thrown away; its tokens count as waste


# Final: C statics in the compiled build (read on every event), not module-dict lookups
_DONE: Final = SampleStatus.DONE
_TRAINED: Final = SampleStatus.TRAINED


class FinishReason(str, Enum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"


# The hot dataclasses write their `__init__` (init=False): the opt-in mypyc build compiles a
# written one, while a generated one stays interpreted (docs/development.md, speed).
@dataclass(slots=True, init=False)
class Segment:
    """`tokens` tokens of one sample generated under policy `version`."""

    version: int
    tokens: int

    def __init__(self, version: int, tokens: int) -> None:
        self.version = version
        self.tokens = tokens


@dataclass(slots=True, eq=False, init=False)
class Episode:
    """The turns of an agentic sample (an episode): its hidden plan and where it is.

    The plan is the workload's hidden truth, as a sample's target length: `_ends[k]` is the
    generated tokens at the end of model turn k (cumulative; the last is the sample's
    `_target_len`), and after every turn but the last a tool call runs `_tool_s[k]` seconds (no
    engine work) and appends `_tool_tokens[k]` tokens to the context (prefilled by the next
    turn, never generated, masked from the loss). `_turn_cap` caps what one turn may generate
    (the per-turn max_new_tokens). A scheduler may read `turn`, `appended`, `calling` and
    `tool_time_s`; the rollout core moves them (`aprilsim.rollout.core`).
    """

    _ends: list[int]
    _tool_s: list[float]
    _tool_tokens: list[int]
    _turn_cap: int
    # where it is (the core moves it; not the constructor's): the model turn in progress, or
    # whose tool call is pending or running; the tool tokens appended to the context so far;
    # whether turn `turn` ended with its tool call pending (or running); the seconds of the
    # tool calls that returned
    turn: int = field(default=0, init=False)
    appended: int = field(default=0, init=False)
    calling: bool = field(default=False, init=False)
    tool_time_s: float = field(default=0.0, init=False)

    def __init__(self, _ends: list[int], _tool_s: list[float], _tool_tokens: list[int],
                 _turn_cap: int) -> None:
        self._ends = _ends
        self._tool_s = _tool_s
        self._tool_tokens = _tool_tokens
        self._turn_cap = _turn_cap
        self.turn = 0
        self.appended = 0
        self.calling = False
        self.tool_time_s = 0.0

    @property
    def turns(self) -> int:
        """Model turns begun so far (the current one included)."""
        return self.turn + 1

    def fresh(self) -> Episode:
        """The same plan, not begun (a re-run of the prompt: `Workload.regenerate`)."""
        return Episode(self._ends, self._tool_s, self._tool_tokens, self._turn_cap)


class GroupCountdown:
    """How many samples of a registered group are not finished yet: the rollout core counts it
    down as they finish (one shared per group; a sample reaches it without a lookup by group id,
    and holding it makes no reference cycle, as a sample holding its group would)."""

    __slots__ = ("left",)

    def __init__(self, left: int) -> None:
        self.left = left


@dataclass(slots=True, eq=False, init=False)
class Sample:
    """One response.

    `_target_len` (the length it will reach, already capped at max_len) and `_reward` are the
    workload's hidden truth: a runtime uses them to decide when a simulated or replayed request
    stops and what it scores; a scheduler cannot see them, as on a live engine, where nobody knows
    when EOS comes or what the verifier will say before the response is done. `reward` is readable
    once the sample is complete. In live free-generation runs both start as None and are filled in
    by the runtime when the response ends.
    """

    uid: int
    group_id: int
    index: int
    prompt_len: int
    _target_len: int | None
    max_len: int
    _reward: float | None
    generated: int = 0
    segments: list[Segment] = field(default_factory=list)
    status: SampleStatus = SampleStatus.PENDING
    submits: int = 0
    submit_version: int = -1
    complete: bool = False  # reached its end (stop token or max_len); set by the runtime
    # request latency (docs/metrics.md), on the driver's clock; -1.0: not yet, or not known
    first_submit_s: float = -1.0  # its first request was sent to the engines
    start_s: float = -1.0  # its first request was first scheduled on an engine (simulated only)
    finish_s: float = -1.0  # it completed (its last request ended at its end)
    # its group's countdown, once the rollout core registered the group (None before)
    countdown: GroupCountdown | None = field(default=None, repr=False, init=False)
    episode: Episode | None = None  # an agentic sample's turns (None: one response)

    def __init__(self, uid: int, group_id: int, index: int, prompt_len: int,
                 _target_len: int | None, max_len: int, _reward: float | None, generated: int = 0,
                 segments: list[Segment] | None = None, status: SampleStatus = SampleStatus.PENDING,
                 submits: int = 0, submit_version: int = -1, complete: bool = False,
                 first_submit_s: float = -1.0, start_s: float = -1.0, finish_s: float = -1.0,
                 episode: Episode | None = None) -> None:
        self.uid = uid
        self.group_id = group_id
        self.index = index
        self.prompt_len = prompt_len
        self._target_len = _target_len
        self.max_len = max_len
        self._reward = _reward
        self.generated = generated
        self.segments = [] if segments is None else segments
        self.status = status
        self.submits = submits
        self.submit_version = submit_version
        self.complete = complete
        self.first_submit_s = first_submit_s
        self.start_s = start_s
        self.finish_s = finish_s
        self.countdown = None
        self.episode = episode

    @property
    def reward(self) -> float:
        """The verifier's reward; only known once the response is complete."""
        if not self.complete or self._reward is None:
            raise UnfinishedSampleError(
                f"sample {self.uid}: the reward of an unfinished response is unknown"
            )
        return self._reward

    @property
    def response_len(self) -> int:
        """Tokens of the response: generated, plus an episode's tool tokens (loss-masked)."""
        ep = self.episode
        return self.generated if ep is None else self.generated + ep.appended

    @property
    def truncated(self) -> bool:
        """True when the response ran into max_response_len (status "truncated" in slime); an
        episode's tool tokens count towards it (its context limit)."""
        return self.complete and self.response_len >= self.max_len

    @property
    def max_new_tokens(self) -> int:
        """What a (re)submission asks the engine for: the remainder of max_response_len (an
        episode's: of its response budget, which its tool tokens use too)."""
        return self.max_len - self.response_len

    @property
    def finished(self) -> bool:
        st = self.status
        return st is _DONE or st is _TRAINED

    @property
    def finish_reason(self) -> FinishReason:
        if not self.complete:
            return FinishReason.ABORT
        return FinishReason.LENGTH if self.truncated else FinishReason.STOP

    def add_tokens(self, tokens: int, version: int) -> None:
        """Record `tokens` newly generated under `version` (merging with the last segment)."""
        if tokens <= 0:
            return
        self.generated += tokens
        if self.segments and self.segments[-1].version == version:
            self.segments[-1].tokens += tokens
        else:
            self.segments.append(Segment(version, tokens))


@dataclass(slots=True, eq=False, init=False)
class Group:
    """The n samples of one prompt; finished when all of its samples are."""

    gid: int
    prompt_len: int
    samples: list[Sample]
    created_step: int
    _pass_rate: float  # hidden truth of the workload (see Sample); schedulers do not read it
    prompt_key: int = -1  # index of the fresh prompt this group runs (the key of its random draws)
    # the prompt's dataset index: the same in every epoch (what a scheduler may key history on)
    prompt_id: int = -1

    def __init__(self, gid: int, prompt_len: int, samples: list[Sample], created_step: int,
                 _pass_rate: float, prompt_key: int = -1, prompt_id: int = -1) -> None:
        self.gid = gid
        self.prompt_len = prompt_len
        self.samples = samples
        self.created_step = created_step
        self._pass_rate = _pass_rate
        self.prompt_key = prompt_key
        self.prompt_id = prompt_id

    @property
    def size(self) -> int:
        return len(self.samples)

    @property
    def finished(self) -> bool:
        for s in self.samples:  # Sample.finished inlined: schedulers ask this on every event
            st = s.status
            if st is not _DONE and st is not _TRAINED:
                return False
        return True

    @property
    def unfinished(self) -> list[Sample]:
        return [s for s in self.samples if not s.finished]

    @property
    def rewards(self) -> list[float]:
        return [s.reward for s in self.samples]

    @property
    def generated(self) -> int:
        return sum(s.generated for s in self.samples)

    def reward_std(self) -> float:
        """The standard deviation of the group's rewards (0: all equal, what DAPO filters)."""
        r = self.rewards
        m = sum(r) / len(r)
        return (sum((x - m) ** 2 for x in r) / len(r)) ** 0.5


def turn_request(s: Sample, ep: Episode, cap: int | None) -> tuple[int, int, int]:
    """The next request of episode `s` (`ep` is `s.episode`): (input tokens: its context so far,
    max new tokens: the rest of its response budget and of its turn's cap, at most `cap` where
    given, tokens it will generate: the rest of its turn)."""
    g = s.generated
    start = ep._ends[ep.turn - 1] if ep.turn else 0
    max_new = min(s.max_len - g - ep.appended, ep._turn_cap - (g - start))
    if cap is not None and cap < max_new:
        max_new = cap
    return s.prompt_len + g + ep.appended, max_new, min(ep._ends[ep.turn] - g, max_new)


def samples_of(groups: Iterable[Group]) -> tuple[Sample, ...]:
    """Every sample of `groups`, group by group (what a Submit or Discard of whole groups
    carries; compiled, one loop instead of a generator per sample in the schedulers)."""
    out: list[Sample] = []
    for g in groups:
        out.extend(g.samples)
    return tuple(out)


def unfinished_of(groups: Iterable[Group]) -> tuple[Sample, ...]:
    """The unfinished samples of `groups`, group by group (`Group.unfinished` of each)."""
    out: list[Sample] = []
    for g in groups:
        out.extend(g.unfinished)
    return tuple(out)


def make_groups(gid0: int, uid0: int, step: int, max_len: int, prompt_lens: Sequence[int],
                target_lens: Sequence[Sequence[int | None]],
                rewards: Sequence[Sequence[float | None]], pass_rates: Sequence[float],
                prompt_keys: Sequence[int], prompt_ids: Sequence[int]) -> list[Group]:
    """New groups gid0, gid0 + 1, ... (samples uid0, uid0 + 1, ...), one per prompt: group g
    holds one PENDING sample per entry of `target_lens[g]`, with the rewards of `rewards[g]`.

    What `Workload.generate` builds for every sample of a run. Compiled (the opt-in mypyc
    build), the loop calls the native constructors directly, without argument parsing; the
    rows are typed as sequences of objects, so their ints and floats are stored as they are
    (no unboxing and re-boxing)."""
    groups: list[Group] = []
    uid = uid0
    for g in range(len(prompt_lens)):
        gid = gid0 + g
        pl = prompt_lens[g]
        lens = target_lens[g]
        rews = rewards[g]
        samples: list[Sample] = []
        for i in range(len(lens)):
            samples.append(Sample(uid + i, gid, i, pl, lens[i], max_len, rews[i]))
        uid += len(lens)
        groups.append(Group(gid, pl, samples, step, pass_rates[g], prompt_keys[g], prompt_ids[g]))
    return groups
