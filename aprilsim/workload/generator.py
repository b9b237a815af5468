"""The seeded generator of GRPO groups: prompt lengths, response lengths, rewards.

Lengths are drawn through a Gaussian copula so that any length family keeps its marginal law while
samples of one prompt share a prompt-level effect:
z = sqrt(rho) * u_prompt + sqrt(1-rho) * u_sample, length = F^-1(Phi(z)).
For a lognormal, rho is exactly the share of log-variance between prompts.
The pass rate of a prompt is Beta(alpha, beta), linked to the same u_prompt with correlation
`difficulty_length_corr` (positive: long prompts are hard, so they fail more, as in reasoning RL).

Common random numbers: every draw of group k (its prompt length, prompt effect, pass rate, and each
sample's length and reward) is a pure function of (seed, k, sample index), by counter-based random
numbers (`counter_rng`). Group k is therefore the same whatever the scheduler, the over-provision
ratio, the number of engines or how many groups were drawn at once; only drift, which scales
lengths by the step at which the group is drawn, can differ.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import repeat

import numpy as np

from aprilsim.native import compiled_modules
from aprilsim.types import Group, Sample, make_groups
from aprilsim.workload import counter_rng as crn
from aprilsim.workload.drift import Drift, NoDrift
from aprilsim.workload.episodes import EpisodeModel, TurnLengths
from aprilsim.workload.lengths import LengthModel, Parametric, cap_lengths

# compiled, `make_groups` calls the native constructors directly; interpreted, a map over the
# class (a C-level loop) is the faster way to build the samples
_NATIVE_GROUPS = "aprilsim.types" in compiled_modules()


@dataclass(frozen=True)
class RewardModel:
    """Per-prompt pass rate ~ Beta(alpha, beta); each sample's reward is Bernoulli(pass rate)."""

    alpha: float = 1.0
    beta: float = 1.0
    difficulty_length_corr: float = 0.0

    def __post_init__(self) -> None:
        if self.alpha <= 0 or self.beta <= 0:
            raise ValueError("reward alpha and beta must be positive")
        if not -1.0 <= self.difficulty_length_corr <= 1.0:
            raise ValueError("difficulty_length_corr must lie in [-1, 1]")


@dataclass
class Workload:
    """An endless, seeded stream of groups. Same arguments + seed => the same groups, in order."""

    lengths: LengthModel
    max_len: int
    group_size: int = 8
    prompt_lengths: LengthModel = field(
        default_factory=lambda: Parametric("lognormal", {"mu": 6.0, "sigma": 0.5})
    )
    max_prompt_len: int = 4096
    prompt_share: float = 0.3
    rewards: RewardModel = field(default_factory=RewardModel)
    drift: Drift = field(default_factory=NoDrift)
    seed: int = 0
    dataset_prompts: int = 0  # > 0: a dataset of this many prompts, re-run epoch after epoch
    # agentic: every sample is an episode of turns and tool calls (`lengths`: per turn)
    episodes: EpisodeModel | None = None

    def __post_init__(self) -> None:
        if self.max_len < 1 or self.group_size < 1 or self.max_prompt_len < 1:
            raise ValueError("max_len, group_size and max_prompt_len must be >= 1")
        if not 0.0 <= self.prompt_share < 1.0:
            raise ValueError("prompt_share must lie in [0, 1)")
        if self.dataset_prompts < 0:
            raise ValueError("dataset_prompts must be >= 0 (0: every prompt is new)")
        self._next_gid = 0  # ids of groups handed out (fresh and re-run)
        self._next_uid = 0
        self._next_prompt = 0  # index of the next fresh prompt: the key of its random numbers

    @property
    def agentic(self) -> bool:
        """Whether its samples are episodes (`[workload.episodes]`)."""
        return self.episodes is not None

    def expected_length(self, step: int = 0) -> float:
        """Mean capped response length at `step` (numerical; the workload mean of length bias)."""
        scale = self.drift.scale(step)
        cache = self.__dict__.setdefault("_mean_cache", {})
        if scale not in cache:
            if self.episodes is not None:  # generated tokens per episode, every turn together
                cache[scale] = self.episodes.mean_generated(
                    TurnLengths(self.lengths, self.prompt_share, scale, self.max_len))
                return cache[scale]
            q = (np.arange(4000) + 0.5) / 4000
            cache[scale] = float(cap_lengths(self.lengths.ppf(q) * scale, self.max_len).mean())
        return cache[scale]

    def generate(self, n_groups: int, step: int = 0, group_size: int | None = None) -> list[Group]:
        """Draw `n_groups` new groups for training step `step` (drift uses the step).

        `group_size` overrides the workload's samples per prompt (over-provisioned responses).
        """
        if n_groups <= 0:
            return []
        n = self.group_size if group_size is None else group_size
        if n < 1:
            raise ValueError("group_size must be >= 1")
        seed = self.seed
        keys = np.arange(self._next_prompt, self._next_prompt + n_groups, dtype=np.int64)
        # the prompt's own draws (length, effect, pass rate) follow the dataset index, the
        # responses' the fresh index: an epoch re-runs a prompt with new responses
        pids = keys % self.dataset_prompts if self.dataset_prompts else keys
        idx = np.arange(n, dtype=np.int64)
        u_prompt = crn.normals(seed, crn.PROMPT_EFFECT, pids)
        u_sample = crn.normals(seed, crn.SAMPLE_EFFECT, keys, idx)
        rho = self.prompt_share
        z = np.sqrt(rho) * u_prompt[:, None] + np.sqrt(1.0 - rho) * u_sample
        from scipy import special, stats  # on first use: the CLI starts without scipy

        scale = self.drift.scale(step)
        episodes = None
        if self.episodes is not None:
            episodes = self.episodes.draw(seed, keys, n, u_prompt,
                                          TurnLengths(self.lengths, rho, scale, self.max_len))
            resp = np.array([[e._ends[-1] for e in row] for row in episodes], dtype=np.int64)
        else:
            raw = self.lengths.ppf(special.ndtr(z))
            if scale != 1.0:  # x * 1.0 is x: no pass without drift
                raw = raw * scale
            resp = cap_lengths(raw, self.max_len)
        prompts = cap_lengths(
            self.prompt_lengths.ppf(crn.uniforms(seed, crn.PROMPT_LEN, pids)), self.max_prompt_len
        )
        c = self.rewards.difficulty_length_corr
        z_pass = -c * u_prompt + np.sqrt(1.0 - c * c) * crn.normals(seed, crn.PASS_RATE, pids)
        pass_rate = stats.beta.ppf(special.ndtr(z_pass), self.rewards.alpha, self.rewards.beta)
        rewards = (crn.uniforms(seed, crn.REWARD, keys, idx) < pass_rate[:, None]).astype(float)

        resp_l, rew_l, prom_l = resp.tolist(), rewards.tolist(), prompts.tolist()
        pass_l, keys_l, pids_l = pass_rate.tolist(), keys.tolist(), pids.tolist()
        gid0, uid0 = self._next_gid, self._next_uid
        build = make_groups if _NATIVE_GROUPS else _map_groups
        groups = build(gid0, uid0, step, self.max_len, prom_l, resp_l, rew_l, pass_l, keys_l,
                       pids_l)
        if episodes is not None:
            for g, row in zip(groups, episodes):
                for smp, ep in zip(g.samples, row):
                    smp.episode = ep
        uid = uid0 + n_groups * n
        self._next_gid += n_groups
        self._next_prompt += n_groups
        self._next_uid = uid
        return groups

    def regenerate(self, groups: list[Group], step: int, group_size: int) -> list[Group]:
        """Re-run the prompts of `groups` from scratch: new groups (new ids, no tokens) with the
        same prompt, pass rate, and the response lengths and rewards of their first `group_size`
        samples (a proxy for "this prompt is long again"). Draws no random numbers."""
        out = []
        uid = self._next_uid
        for j, g in enumerate(groups):
            gid = self._next_gid + j
            if group_size > g.size:
                raise ValueError(f"cannot regenerate {group_size} samples from a group of {g.size}")
            samples = [
                Sample(uid + i, gid, i, g.prompt_len, s._target_len, s.max_len, s._reward,
                       episode=None if s.episode is None else s.episode.fresh())
                for i, s in enumerate(g.samples[:group_size])
            ]
            uid += group_size
            out.append(Group(gid, g.prompt_len, samples, step, g._pass_rate, g.prompt_key,
                             g.prompt_id))
        self._next_gid += len(groups)
        self._next_uid = uid
        return out


def _map_groups(gid0: int, uid0: int, step: int, max_len: int, prompt_lens: list[int],
                target_lens: list[list[int]], rewards: list[list[float]], pass_rates: list[float],
                prompt_keys: list[int], prompt_ids: list[int]) -> list[Group]:
    """`types.make_groups` for the interpreted build: each group's samples in one C-level map
    over the class (the same groups, built faster when the constructor is interpreted)."""
    groups = []
    uid = uid0
    for g, pl in enumerate(prompt_lens):
        gid = gid0 + g
        lens = target_lens[g]
        n = len(lens)
        samples = list(map(Sample, range(uid, uid + n), repeat(gid, n), range(n), repeat(pl, n),
                           lens, repeat(max_len, n), rewards[g]))
        uid += n
        groups.append(Group(gid, pl, samples, step, pass_rates[g], prompt_keys[g], prompt_ids[g]))
    return groups
