"""aprilsim's sglang rules against SGLang 0.5.23's own scheduler, step by step (issue 34).

The traces in tests/data/engine_traces/sglang-0.5.23/ were recorded by driving SGLang's scheduling
code (`experiments/sglang_trace_harness.py`); this replays them through aprilsim's
ReferenceEngine with no SGLang install. Every workload must agree on exactly as many steps as
`expected.json` says (written by `experiments/check_sglang_traces.py --write-expected`): a rule
that moves away from SGLang, or towards it, changes a count and fails here until the expected
file is re-measured. The CI subset (`CI_BUDGET` recorded steps) runs in seconds; the whole file
with `APRILSIM_ALL_TRACES=1`. Re-recording against SGLang is opt-in (`APRILSIM_RECORD_SGLANG=1`, and
sglang 0.5.23 importable here or in the interpreter `APRILSIM_SGLANG_PYTHON` names).
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
CI_BUDGET = 1_000_000  # recorded steps replayed in CI (the replay runs ~70k steps a second)


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
    """Each replayed workload agrees with SGLang on the expected number of steps, and the
    replayed set reaches what the check is about (retractions, chunked prefills, aborts, ratio
    decays, workloads equal throughout)."""
    with open(os.path.join(HERE, "expected.json")) as f:
        expected = json.load(f)
    t0 = time.process_time()
    ws = _workloads()
    reach = {"retractions": 0, "chunked_steps": 0, "aborts": 0, "ratio_decays": 0, "steps": 0}
    whole = unchunked = 0
    for w in ws:
        ag = compare(w)
        assert [ag.steps, ag.equal] == expected[w["id"]], (w["id"], ag.first_diff)
        whole += ag.ok
        if w["config"]["chunked_prefill_size"] <= 0:  # modelled exactly: every step equal
            assert ag.ok, (w["id"], ag.first_diff)
            unchunked += 1
        for k in reach:
            reach[k] += w["counts"][k]
    print(f"SGLang traces: {len(ws)} workloads ({unchunked} chunked prefill off), reach {reach}, "
          f"replayed in {time.process_time() - t0:.1f} s CPU")
    assert len(ws) >= 20 and unchunked >= 10
    assert reach["retractions"] >= 100 and reach["chunked_steps"] >= 100
    assert reach["aborts"] >= 5 and reach["ratio_decays"] >= 100_000
    assert whole >= len(ws) // 4  # workloads equal on every step


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
