"""Shared by the runner tests: a tiny scenario, clusters of bundled engines, one live run + spy."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parents[1]
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from sched_helpers import USER_SCHEDULER  # noqa: E402, F401 - puts examples/ on sys.path

from aprilsim.config import Scenario  # noqa: E402
from aprilsim.conformance import (  # noqa: E402
    BatchRecorder,
    ConformanceRun,
    check_batches,
    check_ledger,
    check_max_length,
    small_scenario,
)
from aprilsim.policies.registry import make_scheduler  # noqa: E402
from real.runner.api import LiveRun, build_runtime  # noqa: E402
from real.runner.cluster import Cluster  # noqa: E402
from real.runner.local import LocalSpec, start_local  # noqa: E402

LOCAL_VOCAB = 256


def tiny_scenario(*, batch: int = 4, group: int = 3, max_len: int = 48, steps: int = 3,
                  seed: int = 0, alpha: float = 1.0, beta: float = 1.0,
                  schedulers: dict[str, dict[str, Any]] | None = None) -> Scenario:
    """Seconds on a CPU: ~12-token prompts, responses of ~15 and ~40 tokens capped at max_len."""
    return small_scenario(
        name="tiny-live", seed=seed, steps=steps, warmup=0, batch=batch, group=group,
        max_len=max_len, rewards=(alpha, beta), schedulers=schedulers,
        trainer={"base_s": 0.01, "per_token_s": 0.0, "sync_s": 0.01},
        lengths={"family": "lognormal_mixture", "weights": [0.7, 0.3], "mus": [2.7, 3.7],
                 "sigmas": [0.5, 0.5]},
        prompts={"family": "lognormal", "mu": 2.5, "sigma": 0.3, "max_len": 32})


def local_spec(step_s: float = 0.002) -> LocalSpec:
    return LocalSpec(vocab_size=LOCAL_VOCAB, d_model=32, n_layers=1, n_heads=2, max_context=128,
                     max_running_requests=16, min_step_seconds=step_s)


@dataclass
class LiveCase:
    run: LiveRun
    spy: BatchRecorder
    scenario: Scenario


async def live_run(scenario: Scenario, name: str, cluster: Cluster, settings: dict | None = None,
                   vocab: int = LOCAL_VOCAB, notify: Any = None, **kw: Any) -> LiveCase:
    """One live run of ``name`` on ``cluster``; ``notify`` hears the engine events and the
    cluster's silence notes as they happen (as `aprilsim run` prints them)."""
    spy = BatchRecorder(make_scheduler(name, settings if settings is not None
                                       else scenario.settings_for(name)))
    rt = build_runtime(scenario, spy, cluster, vocab_size=vocab, **kw)
    rt.notify = cluster.on_note = notify
    result = await rt.run()
    return LiveCase(LiveRun(result, rt, list(rt.faults)), spy, scenario)


def run_local(scenario: Scenario, name: str, settings: dict | None = None, n: int = 2,
              **kw: Any) -> LiveCase:
    """One live run on ``n`` fresh in-process engines, in a fresh event loop."""
    async def main() -> LiveCase:
        cluster = Cluster(await start_local(n, local_spec()))
        try:
            return await live_run(scenario, name, cluster, settings, **kw)
        finally:
            await cluster.close()
    return asyncio.run(main())


def as_conformance_run(case: LiveCase) -> ConformanceRun:
    """The live run in the shape aprilsim.conformance's checks read (the runtime has `groups`)."""
    return ConformanceRun(case.run.runtime,  # type: ignore[arg-type]
                          case.spy, case.scenario, case.run.result)


def assert_ledger(case: LiveCase) -> None:
    """The simulator's conservation ledger and max-length checks (the very same functions), plus
    what only a live run can lose: every streamed id is kept with its sample."""
    r, rt = case.run.result, case.run.runtime
    check_ledger(as_conformance_run(case), "live")
    check_max_length(as_conformance_run(case), "live")
    assert r.end_state["samples_running"] == 0
    for g in rt.groups.values():
        for s in g.samples:
            assert len(rt._ids.get(s.uid, [])) == s.generated


def assert_batches(case: LiveCase) -> None:
    """N finished groups per step (or a documented short batch), each sample at its target."""
    check_batches(as_conformance_run(case), "live")
