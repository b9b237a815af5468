"""aprilsim's sglang rules against SGLang 0.5.23's own scheduler, step by step (issue 34).

The traces in tests/data/engine_traces/sglang-0.5.23/ were recorded by driving SGLang's scheduling
code (`experiments/sglang_trace_harness.py`); this replays them through aprilsim's
ReferenceEngine with no SGLang install, chunked prefill pass by pass as SGLang admits it
(`Rules.select_pass`). Every workload is equal on every step but one whose requests arrive at the
very step of an abort (`ARRIVES_AT_ABORT`: SGLang queues them before the abort's last decode step,
so its new-token ratio is never reset; the simulator's abort is one call, after which it submits
them to an empty engine, whose ratio it resets). Every workload must agree on exactly as many
steps as `expected.json` says (written by `experiments/check_sglang_traces.py
--write-expected`): a rule that moves away from SGLang, or towards it, changes a count and fails
here until the expected file is re-measured. The CI subset (`CI_BUDGET` recorded steps) runs in
seconds; the whole file with `APRILSIM_ALL_TRACES=1`. Re-recording against SGLang is opt-in
(`APRILSIM_RECORD_SGLANG=1`, and sglang 0.5.23 importable here or in the interpreter
`APRILSIM_SGLANG_PYTHON` names).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from aprilsim.engine.families import sglang_replay
from aprilsim.engine.families.sglang import SGLangFamily
from aprilsim.engine.families.sglang_replay import compare, load

HERE = os.path.join(os.path.dirname(__file__), "data", "engine_traces", "sglang-0.5.23")
TRACE = os.path.join(HERE, "traces.jsonl.gz")
CI_BUDGET = 1_000_000  # recorded steps replayed in CI (the replay runs ~60k steps a second)
ARRIVES_AT_ABORT = {"w02013"}  # the one stored workload with arrivals at an abort's step


def _workloads() -> list[dict]:
    """The workloads replayed here: all with APRILSIM_ALL_TRACES, else the file's first ones
    up to CI_BUDGET recorded steps."""
    out, steps = [], 0
    every = os.environ.get("APRILSIM_ALL_TRACES") == "1"
    for w in load(TRACE):
        if not every and steps + w["counts"]["steps"] > CI_BUDGET:
            continue
        steps += w["counts"]["steps"]
        out.append(w)
    return out


def test_replay_agrees_with_recorded_sglang_steps() -> None:
    """Each replayed workload agrees with SGLang on every step (`ARRIVES_AT_ABORT` apart), on
    exactly the expected number of steps, and the replayed set reaches what the check is about
    (retractions, chunked prefills: passes that leave a request unfinished, aborts, ratio
    decays), with chunked prefill on and off."""
    with open(os.path.join(HERE, "expected.json")) as f:
        expected = json.load(f)
    t0 = time.process_time()
    ws = _workloads()
    reach = {"retractions": 0, "chunked_steps": 0, "aborts": 0, "ratio_decays": 0, "steps": 0}
    exact = {True: 0, False: 0}  # workloads equal on every step, chunked prefill on / off
    for w in ws:
        ag = compare(w)
        assert [ag.steps, ag.equal] == expected[w["id"]], (w["id"], ag.first_diff)
        assert ag.ok or w["id"] in ARRIVES_AT_ABORT, (w["id"], ag.first_diff)
        exact[w["config"]["chunked_prefill_size"] > 0] += ag.ok
        for k in reach:
            reach[k] += w["counts"][k]
    print(f"SGLang traces: {len(ws)} workloads equal on every step (chunked prefill on / off): "
          f"{exact[True]} / {exact[False]}, reach {reach}, replayed in "
          f"{time.process_time() - t0:.1f} s CPU")
    assert len(ws) >= 20 and exact[True] >= 10 and exact[False] >= 10
    assert reach["retractions"] >= 100 and reach["chunked_steps"] >= 1_000
    assert reach["aborts"] >= 5 and reach["ratio_decays"] >= 100_000


def test_the_replay_sees_a_changed_rule(monkeypatch) -> None:
    """The comparison is not vacuous: replaying a retracting workload with SGLang's tail requeue
    swapped for head requeue makes some step differ."""
    w = next(w for w in _workloads() if w["counts"]["retractions"] > 0
             and w["config"]["chunked_prefill_size"] <= 0)
    assert compare(w).ok
    real = sglang_replay.sglang_spec
    monkeypatch.setattr(sglang_replay, "sglang_spec",
                        lambda cfg: replace(real(cfg), family=SGLangFamily(retract_to="head",
                                                                           abort_steps=1)))
    assert not compare(w).ok


def test_the_replay_sees_a_changed_chunked_prefill_rule(monkeypatch) -> None:
    """Chunked prefill's per-pass admission has teeth: if the pass that ends a chunked request's
    prefill admitted no one else (one request per pass), a chunked workload differs."""
    from collections import deque

    from aprilsim.engine.families.sglang import SGLangRules

    w = next(w for w in _workloads() if w["counts"]["chunked_steps"] > 50
             and w["id"] not in ARRIVES_AT_ABORT)
    assert compare(w).ok
    real = SGLangRules.select_pass

    def alone(self, at):  # the queue unseen while a request is unfinished
        return real(self, at if at.partial is None else replace(at, waiting=deque()))

    monkeypatch.setattr(SGLangRules, "select_pass", alone)
    ag = compare(w)
    assert not ag.ok and ag.first_kind == "prefill pass", ag.first_diff


def _sglang_python() -> str | None:
    """An interpreter where sglang imports: APRILSIM_SGLANG_PYTHON (e.g. a venv with SGLang
    0.5.23 on CPU), else this one if sglang imports here, else None."""
    given = os.environ.get("APRILSIM_SGLANG_PYTHON")
    if given:
        return given
    return sys.executable if importlib.util.find_spec("sglang") is not None else None


@pytest.mark.skipif(os.environ.get("APRILSIM_RECORD_SGLANG") != "1" or _sglang_python() is None,
                    reason="opt-in: APRILSIM_RECORD_SGLANG=1 and sglang 0.5.23 importable here "
                           "or in APRILSIM_SGLANG_PYTHON")
def test_rerecording_reproduces_the_stored_trace() -> None:
    """Recording the first stored workloads again against the installed SGLang gives the same
    steps (`sglang_trace_harness.py rerecord`)."""
    harness = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "experiments", "sglang_trace_harness.py")
    python = _sglang_python()
    assert python is not None
    out = subprocess.run([python, harness, "rerecord", TRACE, "2"], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    assert out.stdout.count("records equal") == 2
