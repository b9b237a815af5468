"""`aprilsim tune`: the returned setting satisfies its constraints on seeds it never saw."""

from __future__ import annotations

import pytest

pytest.importorskip("pandas", reason="tuning needs the `sweep` extra (pandas)")

import numpy as np  # noqa: E402
import tomllib  # noqa: E402
from click.testing import CliRunner  # noqa: E402
from sweep_helpers import TINY_TOML, tiny  # noqa: E402

from aprilsim.cli import main  # noqa: E402
from aprilsim.config import ScenarioError, load_scenario  # noqa: E402
from aprilsim.sim.run import simulate  # noqa: E402
from aprilsim.sweep.tune import Constraint, Knob, tune  # noqa: E402

RATIO = "schedulers.april.ratio"


def test_constraint_syntax():
    assert Constraint.parse("offpolicy_token_fraction<=0.5") == Constraint(
        "offpolicy_token_fraction", "<=", 0.5)
    assert Constraint.parse("|length_bias| <= 2%") == Constraint("length_bias", "<=", 0.02, True)
    assert Constraint.parse("abs(length_bias)<=0.02").absolute
    assert Constraint.parse("samples_per_s>=1.5").op == ">="
    with pytest.raises(ScenarioError):
        Constraint.parse("|x|>=1")
    margin, *_ = Constraint("m", "<=", 1.0).margin(np.array([0.5, 0.7, 0.6]), True)
    assert 0 < margin < 0.4  # the interval's upper end, not the mean, meets the bound


def test_tuned_setting_meets_constraints_on_fresh_seeds():
    sc = tiny()
    cap = 0.6
    res = tune(sc, [Knob((RATIO,), 1.0, 3.0)], "rollout_throughput_tok_s",
               [Constraint("offpolicy_token_fraction", "<=", cap)], seeds=4, rounds=2, jobs=1)
    ratio = res.setting[RATIO]
    assert 1.0 <= ratio <= 3.0 and res.scheduler == "april"
    # the cap binds: the unconstrained optimum (the largest ratio) is not chosen
    assert ratio < 3.0
    fresh = [simulate(sc, "april", seed=s, settings={"ratio": ratio}).summary()
             for s in range(500, 506)]
    assert np.mean([f["offpolicy_token_fraction"] for f in fresh]) <= cap
    # and it beats not over-provisioning at all
    sync = [simulate(sc, "sync", seed=s).summary()["rollout_throughput_tok_s"]
            for s in range(500, 506)]
    assert np.mean([f["rollout_throughput_tok_s"] for f in fresh]) > np.mean(sync)


def test_cli_writes_a_loadable_tuned_scenario_and_the_run_command(tmp_path):
    (tmp_path / "tiny.toml").write_text(TINY_TOML)
    out = tmp_path / "tuned.toml"
    r = CliRunner().invoke(main, [
        "tune", str(tmp_path / "tiny.toml"), "--knob", f"{RATIO}=1:3",
        "--maximize", "rollout_throughput_tok_s", "--subject-to", "offpolicy_token_fraction<=0.8",
        "--subject-to", "|length_bias_vs_sync|<=0.5", "--seeds", "3", "--rounds", "1",
        "--jobs", "1", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert f"aprilsim run {out} -s april --local 2" in r.stdout  # APRIL on: worth a live run
    assert "margin" in r.stdout and "95% CI" in r.stdout
    sc = load_scenario(out)
    chosen = tomllib.loads(out.read_text())["schedulers"]["april"]["ratio"]
    assert sc.settings_for("april")["ratio"] == chosen and sc.steps == 4
    r = CliRunner().invoke(main, ["tune", "--knob", "cluster.nope=1:2", "--maximize", "x"])
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1 and "nope" in r.stderr


def test_over_sampling_ratios_are_searched_at_whole_numbers_of_groups():
    import math

    from aprilsim.sweep.tune import grid_values

    knob = Knob(("schedulers.april.ratio",), 1.0, 2.0)
    values = grid_values(knob, 1.0, 2.0, 7, batch=32)
    assert values and all(abs(v * 32 - round(v * 32)) < 1e-9 for v in values)
    assert 1.0 <= min(values) and max(values) <= 2.0
    assert 4 / 3 not in values and math.ceil(4 / 3 * 32) / 32 in values  # 1.3333 -> 43/32
    other = grid_values(Knob(("trainer.base_s",), 1.0, 2.0), 1.0, 2.0, 7, batch=32)
    assert len(other) == 7 and any(abs(v * 32 - round(v * 32)) > 1e-6 for v in other)


BUDGET = "schedulers.april.token_budget"


def test_a_setting_that_trains_nothing_is_infeasible_and_the_search_goes_on():
    """token_budget = 1 trains no sample: tune marks that setting infeasible with the reason
    and picks among the others (it used to stop with the simulator's error)."""
    res = tune(tiny(), [Knob((BUDGET,), 1, 20_000, integer=True)], "rollout_throughput_tok_s",
               seeds=3, rounds=1, grid=3, jobs=1)
    bad = [i for i in res.infeasible if i["setting"][BUDGET] == 1]
    assert len(bad) == 1 and "trained no samples" in bad[0]["reason"], res.infeasible
    assert res.setting[BUDGET] > 1 and res.mean > 0
    with pytest.raises(ValueError, match="trains any sample.*trained no samples"):
        tune(tiny(), [Knob((BUDGET,), 1, 2, integer=True)], "rollout_throughput_tok_s",
             seeds=3, rounds=1, grid=2, jobs=1)


def test_cli_lists_the_infeasible_setting_and_still_writes_the_tuned_file(tmp_path):
    (tmp_path / "tiny.toml").write_text(TINY_TOML)
    out = tmp_path / "tuned.toml"
    r = CliRunner().invoke(main, [
        "tune", str(tmp_path / "tiny.toml"), "--knob", f"{BUDGET}=1:20000", "--maximize",
        "rollout_throughput_tok_s", "--seeds", "3", "--rounds", "1", "--jobs", "1",
        "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert f"{BUDGET}=1: infeasible, april: trained no samples" in r.stderr
    assert "1 setting(s) infeasible" in r.stdout and out.exists()


def test_tune_refuses_a_scheduler_that_reads_none_of_the_knobs(tmp_path):
    """Issue 36 item 3: `tune -s sync --knob schedulers.april.ratio=1:3` "tuned" sync silently
    (every setting the same run); so would a spec that sets the tuned knob itself."""
    for spec, said in (("sync", "sync does not read schedulers.april.ratio"),
                       ("april@ratio=2", "sets ratio itself")):
        r = CliRunner().invoke(main, ["tune", "-s", spec, "--knob", f"{RATIO}=1:3", "--maximize",
                                      "rollout_throughput_tok_s",
                                      "--out", str(tmp_path / "t.toml")])
        assert r.exit_code == 2 and said in r.stderr and r.stderr.count("\n") == 1
        assert not (tmp_path / "t.toml").exists()


def test_tune_names_the_binding_constraint_and_an_answer_at_the_range_edge(tmp_path):
    """An off-policy cap no over-provisioning meets: the answer is ratio 1 (APRIL off, the edge
    of the range); the output names the constraint that put it there and suggests no live run
    (it would check sync). A loose cap: an interior answer, the binding constraint named."""
    (tmp_path / "tiny.toml").write_text(TINY_TOML)
    args = ["tune", str(tmp_path / "tiny.toml"), "--knob", f"{RATIO}=1:3", "--maximize",
            "rollout_throughput_tok_s", "--seeds", "3", "--rounds", "1", "--jobs", "1"]
    r = CliRunner().invoke(main, [*args, "--subject-to", "offpolicy_token_fraction<=0.01",
                                  "--out", str(tmp_path / "off.toml")])
    assert r.exit_code == 0, r.output
    assert f"{RATIO} = 1\n" in r.stdout
    assert "note: offpolicy_token_fraction <= 0.01 binds: it rules out" in r.stdout
    assert "over-provisions nothing: april then runs as sync does" in r.stdout
    assert "aprilsim run" not in r.stdout and "no live run suggested" in r.stdout
    res = tune(tiny(), [Knob((RATIO,), 1.0, 3.0)], "rollout_throughput_tok_s",
               [Constraint("offpolicy_token_fraction", "<=", 0.6)], seeds=3, rounds=2, jobs=1)
    assert 1.0 < res.setting[RATIO] < 3.0 and RATIO not in res.edges
    (b,) = res.binding
    assert b["constraint"] == "offpolicy_token_fraction <= 0.6" and b["rules_out"] >= 1
    assert b["best_ruled_out_objective"] > res.mean * 0.9
    res = tune(tiny(), [Knob((RATIO,), 1.0, 1.5)], "rollout_throughput_tok_s", [], seeds=3,
               rounds=1, jobs=1)
    assert res.edges == {RATIO: "high"} and res.binding == []  # unconstrained: more is better
    from aprilsim.sweep.tune import tune_notes

    notes, live = tune_notes(res, [Knob((RATIO,), 1.0, 1.5)])
    assert live and any("the high end of the range searched (1:1.5)" in n for n in notes)
