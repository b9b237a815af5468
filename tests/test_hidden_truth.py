"""The hidden truth (a sample's target length and reward) is written in one place after creation
(`aprilsim.workload.truth`), and one length-scaling rule serves the live replay and its
simulation."""

from __future__ import annotations

import ast
from pathlib import Path

from hypothesis import event, given, settings
from hypothesis import strategies as st

from aprilsim.conformance import small_scenario
from aprilsim.workload.truth import ScaledWorkload, scale_groups, scaled_length

ROOT = Path(__file__).resolve().parents[1]
TRUTH = ("_target_len", "_reward", "_pass_rate")


def _writes(path: Path) -> list[int]:
    """Lines of `path` that assign to a hidden-truth attribute (x._target_len = ...) after
    creation: a constructor setting its own object's field (`self._target_len = ...` inside
    `__init__`, as `Sample`'s written one does) is the creation, not a write."""
    tree = ast.parse(path.read_text())
    creation = {id(n) for f in ast.walk(tree)
                if isinstance(f, ast.FunctionDef) and f.name == "__init__"
                for n in ast.walk(f) if isinstance(n, ast.Assign) and all(
                    isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                    and t.value.id == "self"
                    for t in n.targets)}
    out = []
    for node in ast.walk(tree):
        if id(node) in creation:
            continue
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for t in targets:
            for sub in ast.walk(t):
                if isinstance(sub, ast.Attribute) and sub.attr in TRUTH:
                    out.append(node.lineno)
    return out


def test_the_truth_is_written_only_by_the_truth_module():
    files = [p for d in ("aprilsim", "real") for p in (ROOT / d).rglob("*.py")]
    writers = {str(p.relative_to(ROOT)): lines for p in files if (lines := _writes(p))}
    assert set(writers) == {"aprilsim/workload/truth.py"}, writers
    assert len(files) > 50


@settings(deadline=None)  # the first example imports the live source
@given(scale=st.floats(0.01, 1.0), seed=st.integers(0, 50))
def test_replay_and_its_simulation_scale_alike(scale, seed):
    """The live replay source and the matched simulation draw the very same scaled groups."""
    from real.runner.source import ReplaySource

    sc = small_scenario(seed=seed, max_len=3072)
    live = ReplaySource(sc.workload_for(None), vocab_size=512, scale=scale).new_groups(3, 0)
    sim = ScaledWorkload(sc.workload_for(None), scale).generate(3, 0)
    key = [[(s.prompt_len, s._target_len, s.max_len) for s in g.samples] for g in live]
    assert key == [[(s.prompt_len, s._target_len, s.max_len) for s in g.samples] for g in sim]
    capped = sum(s._target_len == s.max_len for g in live for s in g.samples)
    event("some at the cap" if capped else "none at the cap")


@settings(deadline=None)
@given(target=st.integers(1, 5000), cap=st.integers(2, 5000), scale=st.floats(0.001, 1.0))
def test_scaling_keeps_a_stop_a_stop_and_a_truncation_a_truncation(target, cap, scale):
    g = small_scenario(max_len=cap).workload_for(None).generate(1, 0)[0]
    s = g.samples[0]
    s._target_len, s.max_len = min(target, cap), cap
    was_cut = s._target_len >= s.max_len
    new_max = scaled_length(cap, scale)
    scale_groups([g], scale, new_max)
    event("truncated" if was_cut else "stopped")
    assert s.max_len == new_max and 1 <= s._target_len <= new_max
    assert (s._target_len >= s.max_len) == was_cut or new_max == 1
