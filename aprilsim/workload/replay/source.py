"""The replay workload: a run log's groups handed out in the log's order, exactly as logged.

Fresh group j is the log's group j (steps in order, then the order within the step), with its
logged prompt length, the n logged response lengths (final lengths: a response the run aborted
and resumed counts with all its segments) and its logged rewards. Which scheduler asks, how many
it asks for at once, the ratio or the cluster change nothing, so common random numbers hold as
for the seeded generator. What the log lacks (prompt lengths, rewards) is drawn from the
scenario's models keyed by the log index, the same way for every scheduler.

Edge cases, each defined here once:

- more groups than the log holds: ``exhausted="stop"`` raises `ReplayExhausted`; ``"wrap"``
  starts again at the log's first group (a wrapped group repeats its lengths) and logs one
  warning per run saying so;
- more responses per prompt than logged (``group_size`` above the logged n, e.g. tail batching's
  extra responses): response i takes the logged response i mod n; fewer: the first ones;
- re-run prompts (``regenerate``: tail batching, dynamic sampling): the re-run responds with
  the lengths and rewards of the group it re-runs, as for the seeded generator (no new draw);
- a logged length above ``max_len`` is capped there (the run counts as truncated);
- a multi-turn response (slime's ``loss_mask``, `turns.py`) replays as an episode: its logged
  turns generate, its tool outputs are prefilled by the next turn and each tool call waits
  its logged seconds (else ``tool_s``); its length is the tokens the model generated.

Drift is in the logged lengths already; the step a group is drawn at does not scale it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from aprilsim.types import Episode, Group, Sample
from aprilsim.workload import counter_rng as crn
from aprilsim.workload.generator import Workload
from aprilsim.workload.replay.log import LoggedGroup, ReplayLogError, RunLog
from aprilsim.workload.replay.turns import episode_of

log = logging.getLogger("aprilsim.replay")

EXHAUSTED = ("stop", "wrap")
UNLOGGED_STREAM = 101  # counter_rng stream of the lengths drawn for unlogged prompts
# prompts the run drew but never trained: leave out, run to the cap, or draw from the logged lengths
UNLOGGED = ("skip", "cap", "draw")
CAVEAT = ("replay caveat: every response keeps its logged length; a scheduler that would have "
          "aborted a response earlier is given the logged length for it (its resumed remainder "
          "is what the logged run generated)")


class ReplayExhausted(ReplayLogError):
    """A scheduler asked for more groups than the log holds, with ``exhausted = "stop"``."""


@dataclass(frozen=True)
class _Mean:
    """A length model seen only through ``mean()`` (what the simulation's peak rate asks)."""

    value: float

    def mean(self) -> float:
        return self.value


class ReplayWorkload:
    """A `Workload` (same calls) whose groups are a run log's, in order; see the module doc."""

    def __init__(self, run: RunLog, *, max_len: int, exhausted: str = "wrap",
                 fallback: Workload | None = None, unlogged: str = "skip") -> None:
        if exhausted not in EXHAUSTED:
            raise ValueError(f"exhausted must be one of {', '.join(EXHAUSTED)}, got {exhausted!r}")
        if unlogged not in UNLOGGED:
            raise ValueError(f"unlogged must be one of {', '.join(UNLOGGED)}, got {unlogged!r}")
        if max_len < 1:
            raise ValueError("max_len must be >= 1")
        if not run.groups:
            raise ReplayLogError(f"{run.source}: no groups to replay")
        self.run = run
        self.max_len = int(max_len)
        self.tool_s = 0.5  # seconds per tool call where a multi-turn log has none (the spec's)
        self.agentic = any(g.turns is not None for g in run.groups)  # multi-turn responses
        self.group_size = run.group_size
        self.exhausted = exhausted
        self.n_unlogged = 0
        self._seed = fallback.seed if fallback is not None else 0
        self._log = (list(run.groups) if unlogged == "skip"
                     else self._with_unlogged(run.groups, unlogged))
        self._fill = self._fill_missing(fallback)
        capped = np.minimum(np.concatenate([np.asarray(g.lengths) for g in run.groups]),
                            self.max_len)
        self._mean_len = float(capped.mean())
        prompts = [p for p, _, _ in self._fill]
        self.prompt_lengths = _Mean(float(np.mean(prompts)))
        self.n_capped = int(sum(int(x > self.max_len) for g in self._log for x in g.lengths))
        self.drawn = 0  # fresh groups handed out
        self.wrapped = 0  # of which repeats of the log (exhausted = "wrap")
        self.stretched = 0  # groups given more responses than logged
        self._next_gid = 0
        self._next_uid = 0

    @property
    def groups(self) -> list[LoggedGroup]:
        """The groups handed out in turn (the log's, with unlogged prompts where filled in)."""
        return self._log

    def _with_unlogged(self, groups: list[LoggedGroup], mode: str) -> list[LoggedGroup]:
        """Prompts the run drew but never trained (gaps in the prompt indices: still in flight
        when the run stopped, or dropped) as groups whose responses run to `max_len` ("cap") or
        are drawn from the logged lengths ("draw": keyed by the prompt index and the response,
        common random numbers)."""
        idx = [g.key[1] for g in groups if isinstance(g.key, tuple) and len(g.key) == 2
               and isinstance(g.key[1], int)]
        if len(idx) != len(groups) or idx != sorted(idx):
            raise ReplayLogError(f"{self.run.source}: unlogged = \"cap\" needs the groups in "
                                 "prompt order (order = \"prompt\")")
        have = set(idx)
        pool = np.sort(np.concatenate([np.asarray(g.lengths) for g in groups]))
        n = self.group_size
        out, it = [], iter(groups)
        for k in range(min(idx), max(idx) + 1):
            if k in have:
                out.append(next(it))
                continue
            if mode == "cap":
                lengths = (self.max_len,) * n
            else:
                u = crn.uniforms(self._seed, UNLOGGED_STREAM, np.array([k]), np.arange(n))[0]
                lengths = tuple(int(x) for x in pool[np.minimum((u * pool.size).astype(int),
                                                                pool.size - 1)])
            out.append(LoggedGroup(step=-1, key=("unlogged", k), lengths=lengths,
                                   prompt_len=None, rewards=None))
            self.n_unlogged += 1
        return out

    # ------------------------------------------------------------------ what the log lacks
    def _fill_missing(self, fb: Workload | None) -> list[tuple[int, tuple[float, ...], float]]:
        """Per log group: prompt length, rewards (logged, else drawn keyed by the log index) and
        pass rate (the mean logged reward, else drawn)."""
        need = [i for i, g in enumerate(self._log) if g.prompt_len is None or g.rewards is None]
        drawn: list[Group] = []
        if need:
            if fb is None:
                raise ReplayLogError(f"{self.run.source}: the log lacks prompt lengths or rewards "
                                     "and no scenario models were given to draw them")
            # group i's draws are keyed by its log index i and sample index (common random
            # numbers): one call for indices 0..max, each group's first `size` samples used
            fb._next_prompt = 0
            drawn = fb.generate(max(need) + 1, 0, group_size=max(g.size for g in self._log))
        out = []
        for i, g in enumerate(self._log):
            d = drawn[i] if i < len(drawn) else None
            prompt = (g.prompt_len if g.prompt_len is not None
                      else d.prompt_len)  # type: ignore[union-attr]
            if g.rewards is not None:
                rewards, rate = g.rewards, float(np.mean(g.rewards)) if g.rewards else 0.0
            else:
                rewards = tuple(s._reward for s in d.samples)  # type: ignore[union-attr]
                rate = d._pass_rate  # type: ignore[union-attr]
            out.append((max(1, int(prompt)), rewards, rate))
        return out

    # ------------------------------------------------------------------ the Workload calls
    def expected_length(self, step: int = 0) -> float:
        """Mean logged response length (capped): the workload mean of length bias."""
        return self._mean_len

    def _index(self, j: int) -> int:
        n = len(self._log)
        if j < n:
            return j
        if self.exhausted == "stop":
            raise ReplayExhausted(
                f"replay: the scheduler asked for group {j + 1} but {self.run.source} holds "
                f"{n} groups ({len(self.run.steps)} steps); run fewer steps, or set "
                "lengths.exhausted = \"wrap\" to start again at the log's first group")
        if j == n:
            log.warning("replay: all %d logged groups used; group %d onwards repeat the log from "
                        "its first group (lengths.exhausted = \"wrap\")", n, n + 1)
        self.wrapped += 1
        return j % n

    def _group(self, i: int, gid: int, step: int, n: int) -> Group:
        g: LoggedGroup = self._log[i]
        prompt, rewards, rate = self._fill[i]
        if n > g.size:
            self.stretched += 1
            if self.stretched == 1:
                log.warning("replay: a scheduler asked for %d responses per prompt; the log holds "
                            "%d: response i repeats logged response i mod %d", n, g.size, g.size)
        lens = [min(g.lengths[k % g.size], self.max_len) for k in range(n)]
        eps = self._episodes(g, n)
        uid = self._next_uid
        samples = [Sample(uid + k, gid, k, prompt, lens[k] if eps[k] is None else eps[k]._ends[-1],
                          self.max_len, rewards[k % g.size], episode=eps[k]) for k in range(n)]
        self._next_uid += n
        return Group(gid, prompt, samples, step, rate, i)

    def _episodes(self, g: LoggedGroup, n: int) -> list[Episode | None]:
        """The episodes of `n` responses of logged group `g` (multi-turn ones: their tool tokens
        prefilled), None for single-turn ones; response k repeats logged response k mod size."""
        if g.turns is None:
            return [None] * n
        out: list[Episode | None] = []
        for k in range(n):
            turns = g.turns[k % g.size]
            out.append(None if turns is None else episode_of(turns, self.max_len, self.tool_s))
        return out

    def generate(self, n_groups: int, step: int = 0, group_size: int | None = None) -> list[Group]:
        """The next `n_groups` logged groups (fresh prompts), whatever the step."""
        if n_groups <= 0:
            return []
        groups = []
        for _ in range(n_groups):
            i = self._index(self.drawn)
            size = self._log[i].size if group_size is None else group_size
            if size < 1:
                raise ValueError("group_size must be >= 1")
            groups.append(self._group(i, self._next_gid, step, size))
            self._next_gid += 1
            self.drawn += 1
        return groups

    def regenerate(self, groups: Sequence[Group], step: int, group_size: int) -> list[Group]:
        """Re-run the prompts of `groups`: new groups with the lengths and rewards of their first
        `group_size` samples (as `Workload.regenerate`; draws nothing)."""
        out = []
        for g in groups:
            if group_size > g.size:
                raise ValueError(f"cannot regenerate {group_size} samples from a group of {g.size}")
            uid, gid = self._next_uid, self._next_gid
            samples = [Sample(uid + k, gid, k, g.prompt_len, s._target_len, s.max_len, s._reward,
                              episode=None if s.episode is None else s.episode.fresh())
                       for k, s in enumerate(g.samples[:group_size])]
            self._next_uid += group_size
            self._next_gid += 1
            out.append(Group(gid, g.prompt_len, samples, step, g._pass_rate, g.prompt_key))
        return out

    def usage(self) -> str:
        """One line: how much of the log a run used."""
        n = len(self._log)
        out = f"replay: {self.drawn} fresh groups drawn of the log's {n}"
        if self.n_unlogged:
            out += f" ({self.n_unlogged} unlogged prompts filled in)"
        if self.wrapped:
            out += f"; {self.wrapped} of them repeat the log from its first group (wrap)"
        if self.stretched:
            out += f"; {self.stretched} given more responses than logged"
        return out
