"""What speculative drafts know across the engines of one run: the group's and the prompt's text.

A draft server is global in Seer (arXiv 2511.14617: one Distributed Grouped Draft Server builds a
group's draft from all its responses wherever they run) and in RhymeRL (arXiv 2508.18588: the
prompt's responses in earlier epochs). One `DraftBoard` per run plays that server: the runtime
stamps each request as it sends it (its group, sample, prompt, policy version, what it carries,
what is left of its response), and each engine reports what its requests generated as they leave
(`speculative.SpeculativeCost.finished`). A request's acceptance (1/Q units) is then:

* "group": p0 + (p_max - p0) x covered, covered = the mean over its n - 1 siblings of 1 for a
  finished one and min(1, reported / mine) for the others, where `reported` is what a sibling
  had generated when its last request left an engine (a piece, an abort) and `mine` what this
  sample carried in: a sibling's text is draft material for the part of this response it
  covers. Sibling tokens reach the board when a request leaves its engine (Seer's pieces report
  every `chunk` tokens; a request decoded in one piece reports when it finishes).
* "history": p_max x (1 - staleness)^(age - 1) when the prompt was generated under an earlier
  version (age: versions since the latest such response), p0 when it was not.
* "model": p x (1 - staleness)^(version - draft version), the draft retrained every
  `retrain_every` versions (never: trained on version 0).

An engine reads the board when its own requests arrive or leave (`SpeculativeCost`), so a step's
acceptance is fixed between the engine's events, as its cost must be (docs/simulator.md): what
another engine reports is seen at this engine's next event. Both engines read it at the same
instants, so the fast and the reference engine agree. No I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aprilsim.engine.speculative_spec import Q, SpeculativeSpec


@dataclass(slots=True)
class Stamp:
    """What the runtime knows of a request when it sends it."""

    group: int
    n: int  # the group's size
    uid: int  # its sample
    prompt: int  # the prompt id (-1: none)
    version: int  # the policy version it is generated under
    carried: int  # tokens the sample had generated before this request
    left: int  # tokens the sample has still to generate (its response's end)


@dataclass
class _Group:
    reported: dict[int, int] = field(default_factory=dict)  # sample -> tokens generated so far
    finished: set[int] = field(default_factory=set)


class DraftBoard:
    """The run's draft material: requests stamped at send, reported as they leave."""

    def __init__(self, spec: SpeculativeSpec) -> None:
        self.spec = spec
        self.stamps: dict[int, Stamp] = {}  # rid -> its stamp
        self.groups: dict[int, _Group] = {}
        self.seen: dict[int, tuple[int, int]] = {}  # prompt -> (latest version, the one before)

    def stamp(self, rid: int, st: Stamp) -> None:
        """The runtime sends request `rid` (before the engine sees it)."""
        self.stamps[rid] = st
        g = self.groups.setdefault(st.group, _Group())
        g.reported[st.uid] = max(g.reported.get(st.uid, 0), st.carried)

    def report(self, rid: int, tokens: int, reason: str) -> None:
        """Request `rid` left its engine having generated `tokens` (finished, capped, aborted)."""
        st = self.stamps.pop(rid, None)
        if st is None:
            return
        g = self.groups.setdefault(st.group, _Group())
        g.reported[st.uid] = max(g.reported.get(st.uid, 0), st.carried + tokens)
        if reason != "abort" and tokens >= st.left:  # the sample's response is complete
            g.finished.add(st.uid)
            if st.prompt >= 0:
                latest, before = self.seen.get(st.prompt, (-1, -1))
                if st.version > latest:
                    self.seen[st.prompt] = (st.version, latest)

    def units(self, rid: int) -> int:
        """Request `rid`'s acceptance in 1/Q units as of now (its acceptance model)."""
        spec, st = self.spec, self.stamps.get(rid)
        if st is None:
            return round((spec.p0 if spec.acceptance != "model" else spec.p) * Q)
        if spec.acceptance == "group":
            return spec.group_units(self._covered(st))
        if spec.acceptance == "history":
            latest, before = self.seen.get(st.prompt, (-1, -1))
            v = latest if latest < st.version else before
            if v < 0:
                return round(spec.p0 * Q)
            return spec.aged_units(spec.p_max, st.version - v - 1)
        r = spec.retrain_every
        trained = (st.version // r) * r if r > 0 else 0
        return spec.aged_units(spec.p, st.version - trained)

    def _covered(self, st: Stamp) -> float:
        """The share of this request's siblings whose text covers its position."""
        if st.n < 2:
            return 0.0
        g = self.groups.get(st.group)
        if g is None:
            return 0.0
        mine = max(st.carried, 1)
        total = 0.0
        for uid, tokens in g.reported.items():
            if uid == st.uid:
                continue
            total += 1.0 if uid in g.finished else min(1.0, tokens / mine)
        return total / (st.n - 1)
