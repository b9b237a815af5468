"""A run's log as replay sees it: per step, the groups drawn (prompt length, the n response
lengths, rewards), and per step the rollout time the framework measured.

Readers (slime's debug rollout dumps, verl's rollout dumps, tables) turn their files into
`LoggedRow`s; `RunLog.from_rows` groups them. Group order is the log's: steps ascending, and
within a step the order in which a group's first sample appears. Pure data, no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

from aprilsim.workload.replay.turns import LoggedTurns


class ReplayLogError(ValueError):
    """A run log cannot be replayed; the message is one line."""


@dataclass(frozen=True)
class LoggedRow:
    """One logged response: its step, its prompt's key, and what was measured of it."""

    step: int
    key: Hashable  # prompt/group identity within the step (group_index, prompt id, prompt text)
    length: int  # response tokens, final (a resumed partial counts with all its segments)
    prompt_len: int | None = None
    reward: float | None = None
    resumed: bool = False  # began in an earlier step (aborted, then resumed)
    status: str | None = None  # as logged: completed, truncated, aborted, ...
    turns: LoggedTurns | None = None  # a multi-turn response: `length` is its generated tokens


@dataclass(frozen=True)
class LoggedGroup:
    """The n responses of one prompt in one logged step."""

    step: int
    key: Hashable
    lengths: tuple[int, ...]
    prompt_len: int | None
    rewards: tuple[float, ...] | None  # None when any sample's reward is missing
    resumed: int = 0  # samples that began in an earlier step
    turns: tuple[LoggedTurns | None, ...] | None = None  # per response, where multi-turn

    @property
    def size(self) -> int:
        return len(self.lengths)


@dataclass
class RunLog:
    """A whole run: groups in the log's order, per-step rollout times where logged, notes."""

    groups: list[LoggedGroup]
    source: str = "<rows>"
    fmt: str = "rows"
    rollout_s: dict[int, float] = field(default_factory=dict)  # step -> logged rollout seconds
    notes: list[str] = field(default_factory=list)
    config: dict[str, object] = field(default_factory=dict)  # what the log says of the run
    timing: str = ""  # the timing key the rollout times were read under, and what it spans

    @classmethod
    def from_rows(cls, rows: Iterable[LoggedRow], source: str = "<rows>", fmt: str = "rows",
                  notes: Iterable[str] = (), order: str = "step") -> RunLog:
        """Group rows by (step, key): steps ascending, groups in first-appearance order; with
        `order="prompt"`, groups by their prompt index instead (keys ("group", int): slime's
        ``group_index`` counts prompts in the order the run drew them, so a partial-rollout run's
        prompts come back in draw order, not in the order they were trained)."""
        by: dict[tuple[int, Hashable], list[LoggedRow]] = {}
        for r in rows:
            if r.length < 0:
                raise ReplayLogError(f"{source}: step {r.step}: negative "
                                     f"response length {r.length}")
            by.setdefault((r.step, r.key), []).append(r)
        if not by:
            raise ReplayLogError(f"{source}: no responses found")
        keys = list(by)
        if order == "prompt":
            bad = [k for _, k in keys if not (isinstance(k, tuple) and len(k) == 2
                                              and isinstance(k[1], int))]
            if bad:
                raise ReplayLogError(f"{source}: order = \"prompt\" needs integer prompt indices; "
                                     f"found {bad[0]!r}")
            idx = sorted(range(len(keys)),
                         key=lambda i: (keys[i][1][1], keys[i][0]))  # type: ignore[index]
        elif order == "step":
            idx = sorted(range(len(keys)), key=lambda i: (keys[i][0], i))
        else:
            raise ValueError(f"order must be step or prompt, got {order!r}")
        groups = []
        for i in idx:
            step, key = keys[i]
            rs = by[(step, key)]
            prompts = {r.prompt_len for r in rs if r.prompt_len is not None}
            rewards = [r.reward for r in rs]
            groups.append(LoggedGroup(
                step=step, key=key, lengths=tuple(int(r.length) for r in rs),
                prompt_len=max(prompts) if prompts else None,
                rewards=(None if any(x is None for x in rewards)
                         else tuple(float(x) for x in rewards)),
                resumed=sum(r.resumed for r in rs),
                turns=tuple(r.turns for r in rs) if any(r.turns for r in rs) else None))
        return cls(groups, source=source, fmt=fmt, notes=list(notes))

    # ------------------------------------------------------------------ views
    @property
    def steps(self) -> list[int]:
        """The logged steps, ascending."""
        return sorted({g.step for g in self.groups})

    def groups_of(self, step: int) -> list[LoggedGroup]:
        """The groups logged at `step`, in the log's order."""
        return [g for g in self.groups if g.step == step]

    @property
    def group_size(self) -> int:
        """The most common number of responses per prompt (ties: the larger)."""
        c = Counter(g.size for g in self.groups)
        return max(c, key=lambda n: (c[n], n))

    @property
    def batch_size(self) -> int:
        """The most common number of groups per step (ties: the larger)."""
        c = Counter(g.step for g in self.groups)
        per = Counter(c.values())
        return max(per, key=lambda n: (per[n], n))

    @property
    def n_samples(self) -> int:
        """Responses in the log."""
        return sum(g.size for g in self.groups)

    @property
    def max_length(self) -> int:
        """The longest logged response."""
        return max(max(g.lengths) for g in self.groups)

    def describe(self) -> str:
        """One line: what the log holds."""
        resumed = sum(g.resumed for g in self.groups)
        sizes = sorted({g.size for g in self.groups})
        n = str(sizes[0]) if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]}"
        has = [w for w, ok in (("prompt lengths",
                                all(g.prompt_len is not None for g in self.groups)),
                               ("rewards", all(g.rewards is not None for g in self.groups)),
                               ("rollout times", bool(self.rollout_s))) if ok]
        out = (f"{self.source} ({self.fmt}): {len(self.steps)} steps, {len(self.groups)} groups of "
               f"{n} responses, {self.n_samples} responses, longest {self.max_length} tokens")
        if has:
            out += "; with " + ", ".join(has)
        if resumed:
            out += (f"; {resumed} responses resumed from an earlier step, counted with their "
                    "final length")
        return out
