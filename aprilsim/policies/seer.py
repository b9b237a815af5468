"""`seer` and `seer_history`: length-aware synchronous rollout after Seer (arXiv 2511.14617).

Seer stays on-policy (one step's groups, trained when all are done, as `sync`) and attacks the
long tail with what a group's responses share, their length:

* context-aware scheduling: one response per group runs first as a probe (top priority); what it
  shows, its finished length or, while it runs, its progress, estimates the group's length, and
  the group's other pieces are admitted approximately longest-first (`Submit.priority` = the
  estimate in tokens);
* divided rollout: a response is generated in pieces of at most `chunk` tokens
  (`Submit.max_new_tokens`); each piece that comes back unfinished (`SampleCapped`) is sent again
  to the engine with the most room (`Submit.route = MOST_ROOM`), which balances load and KV as
  the batch thins out. Seer moves a piece's KV through a global KV pool (Mooncake): with
  `migrate_kv = true`, the default, so does this one (`Submit.keep_kv`; the transfer is priced by
  `[cluster] kv_transfer`, a global pool by default; live engines re-prefill); with false, the
  resumed piece re-prefills what it carries (prompt + output so far), a cost Seer does not pay.

`seer_history` estimates a group's length from the same prompt's responses in earlier epochs
(RhymeRL, arXiv 2508.18588, uses the previous epoch the same way): no probe where the prompt was
seen before. How well that predicts is the workload's to decide: its prompt effect
(`workload.prompt_share`) and drift; prompts repeat only with `workload.dataset_prompts` set.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from aprilsim.policies.base import (
    MOST_ROOM,
    Action,
    CloseBatch,
    Context,
    Event,
    GroupFinished,
    Mode,
    RolloutStarted,
    SampleCapped,
    SampleFinished,
    Submit,
)
from aprilsim.types import Group, Sample

ROUTES = ("most_room", "router")


@dataclass
class SeerScheduler:
    """Seer: probe one response per group, the rest longest-first by its estimate, in pieces to the engine with room."""

    name: ClassVar[str] = "seer"
    mode: ClassVar[Mode] = "colocated"
    variants: ClassVar[tuple[dict[str, object], ...]] = (
        {"hold": True, "route": "router", "chunk": 300},
        {"chunk": 0, "probe": False},
        {"chunk": 300, "migrate_kv": False},  # priorities, routing by room, re-prefill
        {"history": True, "chunk": 400},
    )
    chunk: int = 2048  # tokens per piece (0: a response in one piece)
    probe: bool = True  # one response per group first, at top priority
    hold: bool = False  # the group's other responses wait until its probe has shown something
    route: str = "most_room"  # pieces to the engine with the most room, or "router" (the runtime's)
    history: bool = False  # estimate from the same prompt's earlier epochs (`seer_history`)
    migrate_kv: bool = True  # a piece's KV moves through the pool (simulated): no re-prefill
    _done: list[Group] = field(default_factory=list, repr=False)
    _est: dict[int, int] = field(default_factory=dict, repr=False)  # group -> length estimate
    _probe: dict[int, int] = field(default_factory=dict, repr=False)  # group -> its probe's uid
    _held: dict[int, list[Sample]] = field(default_factory=dict, repr=False)
    _seen: dict[int, float] = field(default_factory=dict, repr=False)  # prompt id -> mean length
    _stats: dict[str, float] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.chunk < 0:
            raise ValueError(f"{self.name}: chunk must be >= 0 (0: no pieces)")
        if self.route not in ROUTES:
            raise ValueError(f"{self.name}: route must be one of {ROUTES}, not {self.route!r}")

    def handle(self, event: Event, ctx: Context) -> Sequence[Action]:
        """Probe each new group, then send its pieces longest-first to the engine with room."""
        if isinstance(event, RolloutStarted):
            return self._start(ctx)
        if isinstance(event, SampleCapped):  # a piece came back: its progress, then the next piece
            s = event.sample
            self._learn(s, ctx)
            self._count("pieces_resent")
            return [*self._release(s.group_id), self._piece((s,), s.group_id)]
        if isinstance(event, SampleFinished):
            s = event.sample
            self._learn(s, ctx)
            return self._release(s.group_id)
        if isinstance(event, GroupFinished):
            g = event.group
            if self.history and g.prompt_id >= 0:
                self._seen[g.prompt_id] = sum(s.generated for s in g.samples) / g.size
            self._est.pop(g.gid, None)
            self._probe.pop(g.gid, None)
            self._done.append(g)
            if len(self._done) == ctx.batch_size:
                return [CloseBatch(tuple(self._done))]
        return ()

    def _start(self, ctx: Context) -> list[Action]:
        self._done = []
        top = ctx.max_len + 1  # above every length estimate
        probes: list[Sample] = []
        rest: list[Sample] = []
        out: list[Action] = []
        for g in ctx.new_groups(ctx.batch_size):
            prior = self._seen.get(g.prompt_id) if self.history and g.prompt_id >= 0 else None
            if prior is not None:  # seen in an earlier epoch: longest-first at once, no probe
                self._est[g.gid] = int(prior)
                out.append(self._piece(tuple(g.samples), g.gid))
                self._count("history_groups")
            elif self.probe:
                self._probe[g.gid] = g.samples[0].uid
                probes.append(g.samples[0])
                if self.hold:
                    self._held[g.gid] = g.samples[1:]
                else:
                    rest += g.samples[1:]
            else:
                rest += g.samples
        if probes:
            out.insert(0, self._submit(tuple(probes), top))
        if rest:
            out.append(self._submit(tuple(rest), 0))
        return out

    def _learn(self, s: Sample, ctx: Context) -> None:
        """A piece of `s` ended: its group is at least as long as what `s` generated."""
        gid = s.group_id
        if s.generated > self._est.get(gid, -1):
            self._est[gid] = s.generated

    def _release(self, gid: int) -> list[Action]:
        """The probe of `gid` showed its first piece or its end: the held siblings go now."""
        held = self._held.pop(gid, None)
        return [self._piece(tuple(held), gid)] if held else []

    def _piece(self, samples: tuple[Sample, ...], gid: int) -> Submit:
        """The next piece of `samples`, at their group's estimate (longest first)."""
        return self._submit(samples, self._est.get(gid, 0))

    def _submit(self, samples: tuple[Sample, ...], priority: int) -> Submit:
        return Submit(samples, self.chunk or None, priority=priority,
                      route=MOST_ROOM if self.route == "most_room" else None,
                      keep_kv=self.migrate_kv)

    def _count(self, key: str) -> None:
        self._stats[key] = self._stats.get(key, 0.0) + 1.0

    def step_stats(self) -> dict[str, float]:
        """This step's counts (pieces resent, groups estimated from history); reset on read."""
        out, self._stats = self._stats, {}
        return out


@dataclass
class SeerHistoryScheduler(SeerScheduler):
    """Seer with history: a group's length estimate is its prompt's mean length in earlier epochs (probe when unseen)."""

    name: ClassVar[str] = "seer_history"
    variants: ClassVar[tuple[dict[str, object], ...]] = ({"chunk": 500, "hold": True},)
    history: bool = True
