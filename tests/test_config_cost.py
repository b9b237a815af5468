"""Scenario cost sections: the three-coefficient form or tables over B, validated in one line."""

from __future__ import annotations

import pytest

from aprilsim.config import ScenarioError, default_scenario, scenario_from_dict
from aprilsim.engine.cost import CostModel, TabulatedCost
from aprilsim.sim.run import simulate


def _with_cost(cost: dict):
    d = default_scenario().model_dump(mode="json", exclude_none=True)
    d["cluster"]["cost"] = cost
    d["batch_size"], d["max_response_len"] = 8, 4096
    return scenario_from_dict(d)


def test_tables_build_a_tabulated_cost_that_matches_the_linear_form_on_a_line():
    lin = {"a": 0.006, "b": 2e-5, "c": 1.6e-7, "p0": 0.01, "p1": 1e-5}
    tab = {"table_b": [1, 256], "table_f": [0.006 + 2e-5, 0.006 + 2e-5 * 256],
           "table_g": [1.6e-7, 1.6e-7], "p0": 0.01, "p1": 1e-5}
    a, b = _with_cost(lin), _with_cost(tab)
    assert isinstance(a.engine_spec().cost, CostModel)
    assert isinstance(b.engine_spec().cost, TabulatedCost)
    ra, rb = simulate(a, "april", steps=3).summary(), simulate(b, "april", steps=3).summary()
    assert ra["generated_tokens"] == rb["generated_tokens"]
    assert ra["total_time_s"] == pytest.approx(rb["total_time_s"], rel=1e-9)


@pytest.mark.parametrize(("cost", "message"), [
    ({"a": 1.0, "p0": 0, "p1": 0}, "give all of a, b, c"),
    ({"a": 1, "b": 1, "c": 1, "table_b": [1], "p0": 0, "p1": 0}, "not both"),
    ({"table_b": [2, 1], "table_f": [1, 1], "table_g": [0, 0], "p0": 0, "p1": 0}, "increasing"),
    ({"table_b": [1, 2], "table_f": [1], "table_g": [0, 0], "p0": 0, "p1": 0}, "equal length"),
])
def test_bad_cost_sections_are_one_line_errors(cost, message):
    with pytest.raises(ScenarioError, match=message) as e:
        _with_cost(cost)
    assert str(e.value).startswith("cluster.cost") and "\n" not in str(e.value)


def test_abort_steps_reaches_the_engine_and_bad_values_are_one_line_errors():
    d = default_scenario().model_dump(mode="json", exclude_none=True)
    d["cluster"]["abort_steps"] = 1
    assert scenario_from_dict(d).engine_spec().abort_steps == 1
    assert default_scenario().engine_spec().abort_steps == 1  # the presets: SGLang's
    d["cluster"]["abort_steps"] = -1  # the abort lands at once
    assert scenario_from_dict(d).engine_spec().abort_steps == -1
    assert scenario_from_dict(d).engine_spec().aborts_at_once
    d["cluster"]["abort_steps"] = -2
    with pytest.raises(ScenarioError, match="abort_steps") as e:
        scenario_from_dict(d)
    assert "\n" not in str(e.value)


def test_abort_steps_means_the_same_on_both_layers():
    """-1 is "the abort lands at once" for the scenario key and for the engine family alike; an
    unset scenario key (None) means "the preset's", never "at once" (it used to mean both, one
    per layer)."""
    from dataclasses import replace

    from aprilsim.engine.cost import PRESETS, SGLANG_RULES, EngineSpec
    from aprilsim.engine.families import ABORT_AT_ONCE, SGLangFamily

    d = default_scenario().model_dump(mode="json", exclude_none=True)
    d["cluster"].pop("abort_steps", None)
    preset = PRESETS[d["cluster"]["preset"]]
    assert scenario_from_dict(d).engine_spec().abort_steps == preset.abort_steps == 1
    assert SGLANG_RULES["family"] == preset.family == SGLangFamily()  # SGLang 0.5.23's own
    for k in (-1, 0, 1, 3):
        d["cluster"]["abort_steps"] = k
        spec = scenario_from_dict(d).engine_spec()
        assert spec.abort_steps == k and spec.aborts_at_once == (k == -1)
        assert replace(preset, family=replace(preset.family, abort_steps=k)) == spec
    bare = EngineSpec(cost=preset.cost, kv_capacity=100, max_running=4)
    assert bare.abort_steps == ABORT_AT_ONCE == -1 and bare.aborts_at_once
    for bad in (None, -2, 1.5):
        with pytest.raises(ValueError, match="abort_steps"):
            replace(bare.family, abort_steps=bad)

