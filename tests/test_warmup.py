"""One warm-up clamp for every command: what a summary leaves out, never all of a run."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from test_engine_equivalence import _no_mined_constants

from aprilsim.metrics.warmup import clamp_warmup

ROOT = Path(__file__).resolve().parents[1]
REACHED: Counter[str] = Counter()


@settings(max_examples=200, derandomize=True, database=None)
@given(warmup=st.integers(0, 50), steps=st.integers(1, 50))
def _clamp_leaves_at_least_one_step_and_keeps_what_fits(warmup, steps):
    w = clamp_warmup(warmup, steps)
    label = "kept" if w == warmup else "clamped to the last step" if w == steps - 1 else "other"
    event(label)
    REACHED[label] += 1
    REACHED["one-step run"] += steps == 1
    assert 0 <= w <= warmup and w < steps
    assert (w == warmup) == (warmup < steps)


def test_clamp_leaves_at_least_one_step_and_reaches_both_sides():
    REACHED.clear()
    with _no_mined_constants():
        _clamp_leaves_at_least_one_step_and_keeps_what_fits()
    assert REACHED["kept"] >= 20 and REACHED["clamped to the last step"] >= 20, REACHED
    assert REACHED["one-step run"] >= 1 and REACHED["other"] == 0, REACHED


def test_clamp_examples():
    assert [clamp_warmup(1, n) for n in (0, 1, 2, 5)] == [0, 0, 1, 1]
    assert clamp_warmup(3, 2) == 1


def test_no_command_keeps_its_own_copy_of_the_clamp():
    """`min(warmup, max(0, n - 1))` and `max(0, steps - 1)` written out again next to a warm-up
    (the seven copies this function replaced): every command must call `clamp_warmup`."""
    copy = re.compile(r"warmup.*max\(0, *[\w.()]+ *- *1\)|max\(0, *[\w.()]+ *- *1\).*warmup")
    found = [f"{p.relative_to(ROOT)}:{i}" for pkg in ("aprilsim", "real")
             for p in sorted((ROOT / pkg).rglob("*.py")) if p.name != "warmup.py"
             for i, line in enumerate(p.read_text().splitlines(), 1) if copy.search(line)]
    assert not found, found


@pytest.mark.parametrize(("warmup", "steps"), [(3, 1), (3, 2), (3, 4), (0, 1), (8, 10), (8, 60)])
def test_steps_overrides_and_imports_scale_the_warmup_as_the_runs_do(warmup, steps):
    """`--steps` alone (config.with_overrides), an importer (interop.common.fit_warmup) and a
    run given `steps` (sim.run.simulate) leave out what `scaled_warmup` says: the scenario's
    share of a shorter run (the default's 8 of 40 become 2 of 10), at least one step kept, and
    an importer notes a change only when there was one."""
    from aprilsim.config import default_scenario, with_overrides
    from aprilsim.interop.common import ImportResult, fit_warmup
    from aprilsim.metrics.warmup import scaled_warmup

    sc = default_scenario().model_copy(update={"warmup_steps": warmup, "steps": 40})
    want = scaled_warmup(warmup, 40, steps)
    assert want <= clamp_warmup(warmup, steps) and (want >= 1 or warmup == 0 or steps == 1)
    assert with_overrides(sc, steps=steps).warmup_steps == want
    res = ImportResult({"steps": steps, "warmup_steps": warmup})
    fit_warmup(res)
    assert res.data["warmup_steps"] == want
    assert bool(res.notes) == (want < warmup)
    assert scaled_warmup(8, 40, 10) == 2 and scaled_warmup(8, 40, 3) == 1
