"""The four behaviours the simulator and the live runner used to differ on, decided once in the
rollout core (aprilsim/rollout/core.py, docs/concepts.md) and checked here on both drivers: the
simpy simulator and the asyncio live runner on bundled in-process engines."""

from __future__ import annotations

import asyncio
import re

import pytest
from runner_helpers import LOCAL_VOCAB, local_spec, tiny_scenario

from aprilsim.policies.base import (
    AbortAll,
    CloseBatch,
    Discard,
    GroupFinished,
    SampleCapped,
    SampleFinished,
    SamplesReturned,
    SchedulerError,
    Submit,
    UpdateWeights,
)
from aprilsim.policies.registry import make_scheduler
from aprilsim.sim.build import build_simulation
from aprilsim.types import SampleStatus
from real.runner.api import build_runtime
from real.runner.cluster import Cluster
from real.runner.local import start_local
from real.runner.source import ReplaySource

RUNNING_ERROR = re.compile(r"cannot discard sample \d+ in status running")


class Probe:
    """A registered scheduler plus one probe: `extra` submits a fresh group in the same list as
    each UpdateWeights (at most two); `discard` adds a Discard of the samples the probe names
    right after (the in-flight samples after AbortAll, or the extra group after its Submit)."""

    def __init__(self, name: str, *, extra: bool = False, discard: bool = False) -> None:
        self.inner = make_scheduler(name, {})
        self.name, self.mode = f"probe-{name}", self.inner.mode
        self.sample_events = getattr(self.inner, "sample_events", True)
        self.extra, self.discard = extra, discard
        self.mine: set[int] = set()  # the extra groups (hidden from the inner scheduler)
        self.extra_version: dict[int, int] = {}  # extra sample uid -> version when submitted
        self.extra_samples: list = []
        self.submitted: list = []
        self.batches: list = []

    def handle(self, ev, ctx):
        if isinstance(ev, (SampleFinished, SampleCapped)) and ev.sample.group_id in self.mine:
            return ()
        if isinstance(ev, GroupFinished) and ev.group.gid in self.mine:
            return ()
        if isinstance(ev, SamplesReturned):
            ev = SamplesReturned(tuple(s for s in ev.samples if s.group_id not in self.mine))
        acts = list(self.inner.handle(ev, ctx))
        for a in acts:
            if isinstance(a, Submit):
                self.submitted += a.samples
            if isinstance(a, CloseBatch):
                self.batches.append(a.groups)
        if self.discard and any(isinstance(a, AbortAll) for a in acts):
            running = tuple(s for s in self.submitted if s.status is SampleStatus.RUNNING)
            assert running, "the probe needs samples in flight at the abort"
            acts.append(Discard(running))
        if self.extra and len(self.mine) < 2 and any(isinstance(a, UpdateWeights) for a in acts):
            g = ctx.new_groups(1)[0]
            self.mine.add(g.gid)
            self.extra_samples += g.samples
            self.extra_version.update((s.uid, ctx.version) for s in g.samples)
            acts.append(Submit(tuple(g.samples)))
            if self.discard:
                acts.append(Discard(tuple(g.samples)))
        return acts

    def step_stats(self):
        return self.inner.step_stats()


def run_sim(policy, steps: int = 3):
    sc = tiny_scenario(steps=steps, max_len=48)
    return build_simulation(sc, policy).run()


def run_live(policy, steps: int = 3, source_cls=None):
    sc = tiny_scenario(steps=steps, max_len=48)

    async def main():
        cluster = Cluster(await start_local(2, local_spec()))
        try:
            kw = {}
            if source_cls is not None:
                kw["source"] = source_cls(sc.workload_for(None), LOCAL_VOCAB)
            rt = build_runtime(sc, policy, cluster, vocab_size=LOCAL_VOCAB, **kw)
            return await rt.run(), rt
        finally:
            await cluster.close()

    return asyncio.run(main())


DRIVERS = ["sim", "live"]


def run(driver: str, policy, **kw):
    return run_sim(policy) if driver == "sim" else run_live(policy, **kw)[0]


@pytest.mark.parametrize("driver", DRIVERS)
def test_samples_aborted_stay_running_for_the_rest_of_the_list(driver):
    """Decision 1: a Discard right after AbortAll names samples still RUNNING: refused, in both."""
    with pytest.raises(SchedulerError, match=RUNNING_ERROR):
        run(driver, Probe("april", discard=True))


@pytest.mark.parametrize("driver", DRIVERS)
def test_submit_during_a_weight_sync_is_running_at_once(driver):
    """Decision 2: a Submit in the UpdateWeights list is RUNNING at once (a Discard right after is
    refused) and its tokens carry the new version."""
    with pytest.raises(SchedulerError, match=RUNNING_ERROR):
        run(driver, Probe("async_one_step", extra=True, discard=True))
    probe = Probe("async_one_step", extra=True)
    result = run(driver, probe)
    assert probe.extra_samples and result.end_state["samples_running"] == 0
    versions = {(probe.extra_version[s.uid] + 1, seg.version)
                for s in probe.extra_samples for seg in s.segments}
    assert versions and all(want == got for want, got in versions)


@pytest.mark.parametrize("driver", DRIVERS)
def test_truncated_is_counted_by_one_definition(driver):
    """Decision 3: a step's truncated_samples is the number of its trained samples that ended at
    max_response_len (`Sample.truncated`), in both drivers."""
    probe = Probe("sync")
    result = run(driver, probe)
    per_step = [sum(s.truncated for g in b for s in g.samples) for b in probe.batches]
    assert [r.truncated_samples for r in result.steps] == per_step
    assert sum(per_step) > 0  # the tiny scenario's long mode runs into its 48-token cap


class HiddenTruth(ReplaySource):
    """The scenario's workload with the target lengths withheld: the runtime must ask `reveal`
    (no source class is special-cased), and the run must come out as the plain replay's."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.truth: dict[int, int] = {}
        self.asked = 0

    def new_groups(self, n, step, group_size=None):
        groups = super().new_groups(n, step, group_size)
        for g in groups:
            for s in g.samples:
                self.truth[s.uid], s._target_len = s._target_len, None
        return groups

    def request(self, sample, partial_ids, cap):
        sample._target_len = self.truth[sample.uid]
        try:
            return super().request(sample, partial_ids, cap)
        finally:
            if not sample.complete:
                sample._target_len = None

    def reveal(self, sample, how, output_ids, step):
        self.asked += 1
        if sample.generated >= self.truth[sample.uid]:
            sample._target_len = self.truth[sample.uid]
            return True
        return False


def test_completeness_comes_from_the_hidden_truth_or_reveal():
    """Decision 4: where a source withholds the target, the live runtime asks its `reveal`; the
    records equal the plain replay's token for token (the simulator decides by the target)."""
    plain, _ = run_live(make_scheduler("sync", {}))
    hidden, rt = run_live(make_scheduler("sync", {}), source_cls=HiddenTruth)
    assert rt.source.asked > 0
    sim = run_sim(make_scheduler("sync", {}))
    for a, b, c in zip(plain.steps, hidden.steps, sim.steps, strict=True):
        assert a.trained_tokens == b.trained_tokens == c.trained_tokens
        assert a.truncated_samples == b.truncated_samples == c.truncated_samples
