"""aprilsim.validate: the matched simulation, the cost fit, pricing, comparison and the report,
on synthetic iteration logs and simulated runs (no live engine, no torch)."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import event, given, target
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

from aprilsim.config import load_scenario, scenario_from_dict
from aprilsim.engine.cost import CostModel
from aprilsim.validate import (
    ScaledWorkload,
    compare_runs,
    fit_iterations,
    gains,
    parse_scheduler_spec,
    ranking_preserved,
    simulate_matched,
)
from aprilsim.validate.costfit import load_calibration
from aprilsim.validate.pricing import per_step
from aprilsim.validate.report import report_dict, targets, write_report
from aprilsim.validate.scaled import matched_engine

TRUE = CostModel(a=2e-3, b=1e-4, c=1e-6, p0=1e-3, p1=5e-4)


def synthetic_log(n: int = 400, noise: float = 0.0, gap: float = 0.0, seed: int = 0) -> list[dict]:
    """One engine's iteration log whose steps cost exactly TRUE (times a noise factor)."""
    rng = random.Random(seed)
    rows, t, kv, seq = [], 0.0, 0, 0
    for i in range(n):
        seq += 1
        if i % 10 == 0:
            batch = rng.randint(1, 32)
            tokens = batch * rng.randint(1, 4)
            dur = TRUE.prefill_time(tokens, 0) * (1 + noise * rng.random())
            kv = tokens
            rows.append(dict(seq=seq, t=0, phase="prefill", batch_size=batch, prefill_tokens=tokens,
                             kv_tokens=kv, running=batch, retracted=0, duration_s=dur,
                             padded_s=dur))
        else:
            dur = TRUE.decode_time(batch, kv) * (1 + noise * rng.random())
            kv += batch
            rows.append(dict(seq=seq, t=0, phase="decode", batch_size=batch, prefill_tokens=0,
                             kv_tokens=kv, running=batch, retracted=0, duration_s=dur,
                             padded_s=dur))
        t += dur + gap
        rows[-1]["t"] = t
    return rows


def test_fit_recovers_known_coefficients():
    """Exact steps: the compute fit is calibrate's (robust bins; the log's prefill sizes read as
    equal): close; the wall fit (absolute errors) recovers the decode terms, its p0 is a."""
    fit = fit_iterations([synthetic_log()])
    for k in ("a", "b", "c", "p0", "p1"):
        assert getattr(fit.cost, k) == pytest.approx(getattr(TRUE, k), rel=3e-2)
    for k in ("a", "b", "c"):
        assert getattr(fit.wall, k) == pytest.approx(getattr(TRUE, k), rel=1e-3)
    assert fit.wall.p0 == fit.wall.a and fit.cost.pr < 1e-3 * TRUE.p0
    assert fit.source == "aprilsim.engine.calibration.CostCalibrator"
    # bins: not exact
    assert fit.decode_median_err < 1e-3 and fit.n_decode == 360 and fit.n_prefill == 40


PER_REQ = CostModel(a=2e-3, b=1e-4, c=1e-6, p0=2e-3, p1=2e-6, pr=1.5e-3)


def per_request_log(n: int = 600, seed: int = 0) -> list[dict]:
    """An engine whose prefill costs per request (the bundled engine's loop over sequences):
    fresh batches of many short prompts and resumed ones of a few long inputs."""
    rng = random.Random(seed)
    rows, t, kv, batch = [], 0.0, 0, 1
    for i in range(n):
        if i % 6 == 0:
            batch = rng.randint(1, 16)
            per = rng.choice([rng.randint(8, 24), rng.randint(100, 300)])  # fresh or resumed
            tokens = batch * per
            dur = PER_REQ.prefill_time(tokens, tokens * tokens // batch, requests=batch)
            kv = tokens
            rows.append(dict(seq=i + 1, t=0, phase="prefill", batch_size=batch,
                             prefill_tokens=tokens, kv_tokens=kv, running=batch, retracted=0,
                             duration_s=dur, padded_s=dur))
        else:
            dur = PER_REQ.decode_time(batch, kv)
            kv += batch
            rows.append(dict(seq=i + 1, t=0, phase="decode", batch_size=batch, prefill_tokens=0,
                             kv_tokens=kv, running=batch, retracted=0, duration_s=dur,
                             padded_s=dur))
        t += dur
        rows[-1]["t"] = t
    return rows


def test_a_per_request_bound_prefill_is_priced_right():
    """Both fits carry calibrate's per-request term: a batch of 16 short prompts and one long
    resumed input are both priced within 1 %; without pr one of them is off by far more."""
    from aprilsim.validate.pricing import price

    rows = per_request_log()
    fit = fit_iterations([rows])
    for cost in (fit.cost, fit.wall):
        assert cost.pr == pytest.approx(PER_REQ.pr, rel=0.05)
        for batch, per in ((16, 12), (1, 280), (4, 150)):
            r = dict(phase="prefill", batch_size=batch, prefill_tokens=batch * per)
            assert price(cost, None, r) == pytest.approx(
                PER_REQ.prefill_time(batch * per, batch * per * per, requests=batch), rel=0.01)
    assert fit.prefill_median_err < 0.01 < 0.1 < fit.prefill_without_pr_err
    assert fit.to_dict()["wall"]["pr"] == fit.wall.pr and fit.to_dict()["pr"] == fit.cost.pr


def test_wall_fit_takes_in_the_gap_between_steps_and_matches_sums():
    """A fixed gap between busy steps is part of every live iteration: the wall cost adds it."""
    fit = fit_iterations([synthetic_log(gap=3e-3)])
    assert fit.overhead_s == pytest.approx(3e-3, abs=1e-9)
    assert fit.wall.a == pytest.approx(TRUE.a + 3e-3, rel=1e-3)
    assert fit.cost.a == pytest.approx(TRUE.a, rel=1e-3)
    # right-skewed noise: the absolute fit keeps the total, a relative one would fall short
    rows = synthetic_log(noise=2.0, seed=3)
    fit = fit_iterations([rows])
    dec = [r for r in rows if r["phase"] == "decode"]
    logged = sum(r["duration_s"] for r in dec)
    priced = per_total(fit.wall, rows)
    assert priced == pytest.approx(logged, rel=0.03)


def per_total(cost, rows):
    from aprilsim.validate.pricing import price

    prev, tot = None, 0.0
    for r in rows:
        if r["phase"] == "decode":
            tot += price(cost, prev, r)
        prev = r
    return tot


def test_load_calibration_reads_a_cost_table(tmp_path):
    p = tmp_path / "cal.toml"
    p.write_text("label = 'x'\n[cost]\na = 0.001\nb = 2e-5\nc = 0.0\np0 = 0.002\np1 = 1e-6\n")
    assert load_calibration(str(p)) == CostModel(a=1e-3, b=2e-5, c=0.0, p0=2e-3, p1=1e-6)
    p.write_text("[cost]\na = 0.001\n")
    with pytest.raises(ValueError, match="lacks b"):
        load_calibration(str(p))


def test_parse_scheduler_spec():
    assert parse_scheduler_spec("sync") == ("sync", {})
    assert parse_scheduler_spec("april@ratio=1.5") == ("april", {"ratio": 1.5})
    assert parse_scheduler_spec("april@ratio=3,x=true") == ("april", {"ratio": 3, "x": True})
    with pytest.raises(ValueError):
        parse_scheduler_spec("april@ratio")


def test_scaled_workload_scales_as_replay_does():
    """The simulated groups are the live replay's: ReplaySource's scaling gives the same lengths."""
    from real.runner.source import ReplaySource

    sc = load_scenario(None)
    ours = ScaledWorkload(sc.workload_for(7), 1 / 256).generate(6, 0)
    src = ReplaySource(sc.workload_for(7), vocab_size=512, scale=1 / 256)
    theirs = src.new_groups(6, 0)
    assert [g.prompt_len for g in ours] == [g.prompt_len for g in theirs]
    assert [[s._target_len for s in g.samples] for g in ours] == \
           [[s._target_len for s in g.samples] for g in theirs]
    assert max(s._target_len for g in ours for s in g.samples) <= 64


def small_scenario():
    sc = load_scenario(None)
    return scenario_from_dict({**sc.model_dump(exclude={"base_dir"}), "batch_size": 4,
                               "group_size": 2, "steps": 3, "warmup_steps": 1})


def test_simulations_pair_with_themselves_and_reports_are_written(tmp_path):
    """A run compared with itself has no error; the report keeps every key and target."""
    sc = small_scenario()
    eng = matched_engine(TRUE, max_running=64, kv_capacity=5120)
    rows = []
    for spec in ("sync", "april", "april@ratio=1.5"):
        a = simulate_matched(sc, spec, eng, n_engines=2, scale=1 / 256, seed=1, steps=3)
        b = simulate_matched(sc, spec, eng, n_engines=2, scale=1 / 256, seed=1, steps=3)
        busy = [max(s.busy_by_engine_s) for s in b.steps]
        rows.append(compare_runs(spec, a, b, busy, busy))
    for r in rows:
        e = r.errors()
        assert e["step_rollout_median_abs"] == 0 and e["step_priced_median_abs"] == 0
        assert e["mean_rollout_time_s"] == 0
    assert all(abs(g["diff_pp"]) < 1e-9 for g in gains(rows).values())
    assert ranking_preserved(rows)
    t = targets(rows)  # one run: exact errors are met, but a gain or a ranking has no interval
    assert (t["step_rollout_error"]["verdict"] == "met"
            and t["step_priced_error"]["verdict"] == "met")
    assert {t[k]["verdict"]
            for k in ("gain_vs_sync_pp", "gain_priced_pp", "ranking")} == {"undecided"}
    from aprilsim.validate.rounds import pooled

    t = targets(rows, pooled([rows, rows]))  # two identical rounds: every interval is 0 wide
    # (decisions come from live traces: none here, so that target is not measured)
    assert t["decision_agreement"]["verdict"] is None and t["decision_agreement"]["steps"] == 0
    assert all(t[k]["verdict"] == "met" and t[k]["met"] for k in t if k != "decision_agreement"), t
    rep = report_dict(rows, {"scenario": sc.name}, fit_iterations([synthetic_log()]).to_dict())
    write_report(rep, tmp_path)
    back = json.loads((tmp_path / "report.json").read_text())
    assert {s["label"] for s in back["schedulers"]} == {"sync", "april", "april@ratio=1.5"}
    md = (tmp_path / "report.md").read_text()
    assert "| sync |" in md and "Targets" in md


def test_a_slower_live_run_is_reported_with_its_cause():
    """Live 20 % slower than predicted in wall clock, its iterations priced exactly as simulated:
    the report blames the cost / unlogged time, not the engine rules."""
    sc = small_scenario()
    eng = matched_engine(TRUE, max_running=64, kv_capacity=5120)
    sim = simulate_matched(sc, "sync", eng, n_engines=2, scale=1 / 256, seed=1, steps=3)
    live = simulate_matched(sc, "sync", eng, n_engines=2, scale=1 / 256, seed=1, steps=3)
    for s in live.steps:
        s.rollout_time_s *= 1.25
    busy = [max(s.busy_by_engine_s) for s in sim.steps]
    row = compare_runs("sync", sim, live, [1.25 * b for b in busy], busy)
    e = row.errors()
    assert e["step_rollout_median_abs"] == pytest.approx(0.2)
    assert e["step_priced_median_abs"] == 0
    from aprilsim.validate.report import explain

    text = " ".join(explain([row], {"decode_median_err": 0.0}))
    assert "20.0%" in text and "Cause: cost per iteration" in text and "rules +0.0%" in text


def test_ranking_with_ties():
    sc = small_scenario()
    eng = matched_engine(TRUE, max_running=64, kv_capacity=5120)
    a = simulate_matched(sc, "sync", eng, n_engines=2, scale=1 / 256, seed=1, steps=3)
    rows = [compare_runs("x", a, a), compare_runs("y", a, a)]
    rows[0].measured = {**rows[0].measured,
                        "rollout_throughput_tok_s":
                            rows[0].predicted["rollout_throughput_tok_s"] * 0.99}
    rows[1].predicted = {**rows[1].predicted,
                         "rollout_throughput_tok_s":
                             rows[1].predicted["rollout_throughput_tok_s"] * 0.98}
    assert not ranking_preserved(rows) and ranking_preserved(rows, tie=0.02)


def test_per_step_sums_the_busiest_engine_inside_each_window():
    sc = small_scenario()
    run = simulate_matched(sc, "sync", matched_engine(TRUE, max_running=64, kv_capacity=5120),
                           n_engines=2, scale=1 / 256, seed=1, steps=3)
    s0 = run.steps[0]
    mid = s0.rollout_start_s + s0.rollout_time_s / 2
    rows_a = [dict(seq=1, t=0, t_run=mid, phase="decode", batch_size=2, prefill_tokens=0,
                   kv_tokens=10, running=2, duration_s=0.5, padded_s=0.5)]
    rows_b = [dict(seq=1, t=0, t_run=mid, phase="decode", batch_size=2, prefill_tokens=0,
                   kv_tokens=10, running=2, duration_s=0.2, padded_s=0.2)]
    assert per_step(run, [rows_a, rows_b])[:2] == [0.5, 0.0]
    assert per_step(run, [rows_a], TRUE)[0] == pytest.approx(TRUE.decode_time(2, 8))


def test_cli_refuses_bad_input_in_one_line(tmp_path):
    from click.testing import CliRunner

    from aprilsim.cli import main

    r = CliRunner().invoke(main, ["validate", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "exactly one of --local" in r.output
    r = CliRunner().invoke(main, ["validate", "--local", "1", "-s", "nosuch",
                                  "--out", str(tmp_path)])
    assert r.exit_code == 2 and "nosuch" in r.output
    r = CliRunner().invoke(main, ["validate", "--local", "1", "-s", "april@ratio",
                                  "--out", str(tmp_path)])
    assert r.exit_code == 2 and "knob=value" in r.output
    for extra in ([], ["--repeats", "3", "--calibration", str(tmp_path / "cal.toml")]):
        (tmp_path / "cal.toml").write_text("[cost]\na = 1e-3\nb = 1e-4\nc = 0\n")
        r = CliRunner().invoke(main, ["validate", "--local", "1", "--cross-fit", *extra,
                                      "--out", str(tmp_path)])
        assert (r.exit_code == 2
                and "--cross-fit needs --repeats >= 2 and no --calibration" in r.output)
        assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output


def test_a_figure_that_was_not_measured_reads_n_a_never_met():
    """No priced engine time and no second scheduler: those targets are None (n/a), not 0 met."""
    sc = small_scenario()
    eng = matched_engine(TRUE, max_running=64, kv_capacity=5120)
    run = simulate_matched(sc, "sync", eng, n_engines=2, scale=1 / 256, seed=1, steps=3)
    t = targets([compare_runs("sync", run, run)])
    assert t["step_priced_error"]["worst"] is None and t["step_priced_error"]["met"] is None
    assert t["gain_vs_sync_pp"]["met"] is None and t["gain_priced_pp"]["met"] is None
    assert t["ranking"]["met"] is None and t["ranking_priced"]["met"] is None
    assert t["step_rollout_error"]["met"] is True  # this one was measured (and is exact)
    from aprilsim.validate.report import report_markdown

    md = report_markdown(report_dict([compare_runs("sync", run, run)], {}, _fit_dict()))
    priced_line = next(x for x in md.splitlines() if x.startswith("| engine-time error"))
    assert priced_line.endswith("| n/a | not measured |")
    assert "| ranking, engine time (live priced) | preserved | n/a | n/a | not measured |" in md


def _fit_dict() -> dict:
    from aprilsim.validate.costfit import CostFit

    return CostFit(cost=TRUE, wall=TRUE, overhead_s=0.0, decode_median_err=0.0,
                   prefill_median_err=0.0, n_decode=0, n_prefill=0, decode_share=1.0).to_dict()


def test_rounds_give_the_noise_floor_and_paired_gain_intervals():
    """Three rounds of the same steps, measured times scaled by known factors: the noise floor is
    their spread, the gain's interval is the t-interval of the paired per-round gains."""
    from statistics import mean, stdev

    from aprilsim.validate.rounds import noise_floor, pooled, t95

    sc = small_scenario()
    eng = matched_engine(TRUE, max_running=64, kv_capacity=5120)
    sim_s = simulate_matched(sc, "sync", eng, n_engines=2, scale=1 / 256, seed=1, steps=4)
    sim_a = simulate_matched(sc, "april", eng, n_engines=2, scale=1 / 256, seed=1, steps=4)
    factors = [1.0, 1.1, 0.9]
    rounds = []
    for f in factors:
        live_s = simulate_matched(sc, "sync", eng, n_engines=2, scale=1 / 256, seed=1, steps=4)
        for s in live_s.steps:
            s.rollout_time_s *= f
        rounds.append([compare_runs("sync", sim_s, live_s), compare_runs("april", sim_a, sim_a)])
    nf = noise_floor([r[0] for r in rounds])
    assert nf == pytest.approx(stdev(factors) / mean(factors), rel=1e-6)
    p = pooled(rounds)
    assert p["schedulers"]["sync"]["noise_floor"] == pytest.approx(nf)
    assert p["schedulers"]["april"]["noise_floor"] == 0.0
    g = p["gains"]["april"]
    per_round = [gains(r)["april"]["diff_pp"] for r in rounds]
    assert g["diff_pp"]["mean"] == pytest.approx(mean(per_round))
    assert g["diff_pp"]["half_width"] == pytest.approx(t95(2) * stdev(per_round) / 3 ** 0.5)
    assert p["ranking"]["rounds"] == 3
    t = targets(rounds[0], p)
    assert t["step_rollout_error"]["single_run_noise_floor"]["sync"] == pytest.approx(nf)
    # of the mean
    assert t["step_rollout_error"]["noise_floor"]["sync"] == pytest.approx(nf / 3 ** 0.5)
    assert t["gain_vs_sync_pp"]["by_scheduler"]["april"]["rounds"] == 3


def test_one_scheduler_has_no_ranking_even_when_pooled():
    from aprilsim.validate.rounds import pooled

    sc = small_scenario()
    run = simulate_matched(sc, "sync", matched_engine(TRUE, max_running=64, kv_capacity=5120),
                           n_engines=2, scale=1 / 256, seed=1, steps=3)
    rows = [compare_runs("sync", run, run)]
    t = targets(rows, pooled([rows]))
    assert t["ranking"]["met"] is None and t["gain_vs_sync_pp"]["met"] is None


def test_the_matched_engine_keeps_the_live_prefix_cache_and_client_overhead():
    """validate simulates vLLM's and SGLang's prefix caches as kept across its weight relabels:
    APRIL's resumed partials then prefill less than with no cache; a client overhead delays every
    request, so each sync step takes longer."""
    sc = small_scenario()

    def run(spec: str, **kw):
        eng = matched_engine(TRUE, max_running=64, kv_capacity=5120, **kw)
        return simulate_matched(sc, spec, eng, n_engines=2, scale=1 / 256, seed=1, steps=4)

    none = run("april")
    kept = run("april", prefix_cache="lru", prefix_cache_flush=False)
    assert sum(s.prefill_tokens for s in kept.steps) < sum(s.prefill_tokens for s in none.steps)
    base, slow = run("sync"), run("sync", client_overhead_s=0.05)
    assert all(b.rollout_time_s + 0.05 <= s.rollout_time_s + 1e-9
               for b, s in zip(base.steps, slow.steps))


def test_client_overhead_comes_from_the_calibration_file(tmp_path):
    from aprilsim.validate.costfit import load_client_overhead

    good = tmp_path / "cal.toml"
    good.write_text("client_overhead_s = 0.0072\n[cost]\na = 1e-3\nb = 1e-4\nc = 0\n")
    assert load_client_overhead(str(good)) == pytest.approx(0.0072)
    bare = tmp_path / "bare.toml"
    bare.write_text("[cost]\na = 1e-3\nb = 1e-4\nc = 0\n")
    assert load_client_overhead(str(bare)) == 0.0
    bad = tmp_path / "bad.toml"
    bad.write_text('client_overhead_s = "fast"\n[cost]\na = 1\nb = 1\nc = 0\n')
    with pytest.raises(ValueError, match="client_overhead_s"):
        load_client_overhead(str(bad))


def test_error_against_the_mean_of_repeats_and_its_noise_floor():
    """R repeats of the same steps: the error is the prediction's against each step's mean
    measurement, the floor of that mean is one run's floor / sqrt(R), and the split-half
    estimate measures the same spread (Monte Carlo: iid noise of known spread, many steps)."""
    from aprilsim.validate.rounds import errors_vs_mean, noise_floor, pooled, split_half_floor

    pred = [1.0, 2.0, 4.0]
    meas = [[1.1, 2.0, 5.0], [0.9, 2.4, 3.0], [1.0, 1.6, 4.0]]  # means 1.0, 2.0, 4.0
    assert errors_vs_mean([pred] * 3, meas, range(3)) == pytest.approx([0.0, 0.0, 0.0])
    assert errors_vs_mean([pred] * 3, [[2 * x for x in m] for m in meas], range(1, 3)) == \
        pytest.approx([-0.5, -0.5])
    assert split_half_floor(meas[:1], range(3)) is None and split_half_floor(meas, range(0)) is None
    assert split_half_floor([pred, pred, pred], range(3)) == 0.0
    # halves [0, 2] and [1]: d = (mean_A - mean_B) / mean, scaled by 1 / sqrt(3 * (1/2 + 1))
    ds = [(1.05 - 0.9) / 1.0, (1.8 - 2.4) / 2.0, (4.5 - 3.0) / 4.0]
    rms = (sum(d * d for d in ds) / 3) ** 0.5
    assert split_half_floor(meas, range(3)) == pytest.approx(rms / (3 * 1.5) ** 0.5)

    rng = random.Random(5)
    sigma, r, n = 0.1, 5, 4000
    steps = [rng.uniform(0.5, 5.0) for _ in range(n)]
    noisy = [[t * (1 + rng.gauss(0, sigma)) for t in steps] for _ in range(r)]
    want = sigma / r ** 0.5
    assert split_half_floor(noisy, range(n)) == pytest.approx(want, rel=0.08)
    # the pooled figures on comparisons: per-step rows from the same noisy repeats
    from aprilsim.validate.compare import SchedulerComparison

    rate = {"rollout_throughput_tok_s": 1.0}
    runs = [SchedulerComparison("sync", rate, rate, steps[:400], m[:400], 0) for m in noisy]
    p = pooled([[run] for run in runs])["schedulers"]["sync"]
    assert p["noise_floor"] == pytest.approx(noise_floor(runs))
    assert p["noise_floor_of_mean"] == pytest.approx(noise_floor(runs) / r ** 0.5)
    assert p["noise_floor_of_mean"] == pytest.approx(want, rel=0.15)
    assert p["noise_floor_of_mean_split_half"] == pytest.approx(want, rel=0.2)
    # the mean of 5 repeats is closer than a single run: its error shrinks towards the floor
    assert p["step_rollout_vs_mean_median_abs"] < 0.6 * p["step_rollout_median_abs"]
    t = targets([runs[0]], pooled([[run] for run in runs]))["step_rollout_error"]
    assert t["against"] == "mean of the rounds"
    assert t["by_scheduler"]["sync"] == p["step_rollout_vs_mean_median_abs"]
    assert t["single_run"]["sync"] == p["step_rollout_median_abs"]
    assert t["noise_floor"]["sync"] == p["noise_floor_of_mean"]


REACHED_MEAN: dict[str, int] = {}


@hyp_settings(max_examples=150, derandomize=True, deadline=None)
@given(st.integers(2, 7), st.integers(1, 6), st.data())
def _vs_mean_properties(r, n, data):
    from aprilsim.validate.rounds import errors_vs_mean, split_half_floor

    pos = st.floats(0.01, 100.0, allow_nan=False)
    meas = [[data.draw(st.one_of(pos, st.just(0.0)) if s == 0 else pos) for s in range(n)]
            for _ in range(r)]
    pred = [data.draw(pos) for _ in range(n)]
    perm = data.draw(st.permutations(range(r)))
    k = data.draw(st.floats(0.1, 10.0))
    REACHED_MEAN["examples"] = REACHED_MEAN.get("examples", 0) + 1
    zero_step = any(m[0] == 0.0 for m in meas)
    for name, hit in (("even R", r % 2 == 0), ("odd R", r % 2 == 1),
                      ("a step measured 0", zero_step)):
        if hit:
            event(name)
            REACHED_MEAN[name] = REACHED_MEAN.get(name, 0) + 1
    e = errors_vs_mean([pred] * r, meas, range(n))
    # the repeats' order does not matter; scaling the measurements by k maps 1 + e to (1 + e) / k
    assert e == pytest.approx(errors_vs_mean([pred] * r, [meas[i] for i in perm], range(n)))
    assert errors_vs_mean([pred] * r, [[k * x for x in m] for m in meas], range(n)) == \
        pytest.approx([(1 + x) / k - 1 for x in e], rel=1e-9, abs=1e-12)
    # steps with a non-positive mean are left out, the rest kept
    assert len(e) == n - sum(1 for s in range(n) if sum(m[s] for m in meas) <= 0)
    f = split_half_floor(meas, range(n))
    if e:
        target(max(abs(x) for x in e), label="largest error against the mean")
        assert f is not None and f >= 0
        assert split_half_floor([[k * x for x in m] for m in meas], range(n)) == pytest.approx(
            f, rel=1e-9, abs=1e-12)


def test_error_against_the_mean_properties():
    """Properties of the error against the mean of repeats and of the split-half floor: order
    of repeats, scale, left-out steps, non-negative scale-free floor (reach asserted)."""
    from test_engine_equivalence import _no_mined_constants

    REACHED_MEAN.clear()
    with _no_mined_constants():
        _vs_mean_properties()
    n = REACHED_MEAN["examples"]
    assert n >= 100, REACHED_MEAN
    for name in ("even R", "odd R", "a step measured 0"):
        assert REACHED_MEAN.get(name, 0) >= 0.1 * n, (name, REACHED_MEAN)


QUAD = CostModel(a=2e-3, b=1e-4, c=1e-6, p0=2e-3, p1=2e-6, p2=4e-7, pr=1e-3)


def test_the_wall_fit_fits_p2_only_where_the_records_give_each_batch_s_squares():
    """Rows that give a batch's tokens only (iteration logs, rebuilt streams) leave p2 at 0: their
    equal-size estimate of sum(n^2) misses batches that mix a long resumed input with short new
    ones, so a p2 fitted on it would be charged wrongly on the simulation's exact sums. Records
    that carry the sums get p2 back."""
    from aprilsim.engine.calibration.records import Record
    from aprilsim.validate.costfit import fit_wall

    rng = random.Random(5)
    recs = []
    for _ in range(300):
        b = rng.randint(1, 16)
        recs.append(Record("decode", b, float(rng.randint(100, 4000)), 0,
                           QUAD.decode_time(b, 0.0)))
        recs[-1] = Record("decode", b, recs[-1].kv_tokens, 0,
                          QUAD.decode_time(b, recs[-1].kv_tokens))
        sizes = [rng.choice([rng.randint(4, 30), rng.randint(200, 900)])
                 for _ in range(rng.randint(1, 8))]
        n, sq = sum(sizes), sum(x * x for x in sizes)
        dur = QUAD.prefill_time(n, sq, requests=len(sizes))
        recs.append(Record("prefill", len(sizes), 0.0, n, dur, prefill_tokens_sq=sq))
    exact = fit_wall(recs)
    assert (exact.p2 == pytest.approx(QUAD.p2, rel=0.02)
            and exact.pr == pytest.approx(QUAD.pr, rel=0.05))
    estimated = fit_wall([Record(r.phase, r.batch_size, r.kv_tokens, r.prefill_tokens, r.duration_s)
                          for r in recs])
    assert estimated.p2 == 0.0 and estimated.p1 > 0
    assert (estimated.a, estimated.b, estimated.c) == pytest.approx((exact.a, exact.b, exact.c),
                                                                    rel=1e-6)


def test_rebuilt_prefills_are_fitted_on_the_tokens_the_engine_computed():
    """An engine whose prefix cache served half of every prompt: fitted on the rows as sent, the
    per-token prefill cost comes out half the true one; on `computed_rows` it is the true one."""
    from aprilsim.validate.pricing import computed_rows

    rows, t = [], 0.0
    for r in per_request_log(seed=2):
        if r["phase"] == "prefill":
            computed = r["prefill_tokens"] // 2
            r = {**r, "duration_s": PER_REQ.prefill_time(computed,
                                                         computed * computed // r["batch_size"],
                                                         requests=r["batch_size"])}
            r["padded_s"] = r["duration_s"]
        t += r["duration_s"]
        rows.append({**r, "t": t})
    as_sent = fit_iterations([rows]).wall
    as_computed = fit_iterations([computed_rows(rows, 0.5)]).wall
    assert as_computed.p1 == pytest.approx(PER_REQ.p1, rel=0.1)
    assert as_sent.p1 == pytest.approx(PER_REQ.p1 / 2, rel=0.1)
    assert computed_rows(rows, None) == rows
    assert all(c["prefill_tokens"] == max(1, round(r["prefill_tokens"] * 0.5))
               for r, c in zip(rows, computed_rows(rows, 0.5)) if r["phase"] == "prefill")


def _live_round(sc, eng, factor: float, round_: int):
    """A 'live' run of sync: the simulation's result, and one engine's iteration log whose steps
    take `factor` times TRUE's cost (the machine's speed in that round)."""
    from aprilsim.metrics.trace import Trace
    from real.validate import LiveOutcome

    res = simulate_matched(sc, "sync", eng, n_engines=1, scale=1 / 256, seed=1, steps=3)
    rows = synthetic_log(n=200, seed=7)
    t0 = res.steps[res.warmup_steps].rollout_start_s
    for i, r in enumerate(rows):
        r["duration_s"] *= factor
        r["padded_s"] = r["duration_s"]
        r["t_run"] = t0 + 1e-6 * (i + 1)
    return LiveOutcome(label="sync", result=res, rows=[rows],
                       trace=Trace(scheduler="sync", n_engines=1),
                       wall_s=1.0, overhead_per_request_s=0.0, round=round_)


def test_cross_fitting_judges_each_round_with_the_other_rounds_cost():
    """Leave one round out: a round's own rows never enter its fit (changing them leaves that fit
    as it was), and a round run on a slower machine is judged by the faster rounds' cost."""
    from real.runner.options import EngineTarget
    from real.validate import ValidateOptions, comparisons, judge

    sc = small_scenario()
    eng = matched_engine(TRUE, max_running=64, kv_capacity=5120)
    limits = {"max_running": 64, "kv_capacity": 5120}
    opts = ValidateOptions(EngineTarget(engines=("saved",)), seed=1, steps=3, repeats=3,
                           scale=1 / 256, cross_fit=True)
    assert opts.cross_fitted and not opts.holdout_round

    def run(factors):
        live = [_live_round(sc, eng, f, r) for r, f in enumerate(factors)]
        return judge(sc, ["sync"], opts, live, limits, "synthetic", [], 0.0)

    v = run([1.0, 1.0, 1.5])
    assert (sorted(v.round_fits) == [0, 1, 2]
            and sorted(v.round_sims) == [("sync", 0), ("sync", 1), ("sync", 2)])
    assert v.round_fits[2].wall.b == pytest.approx(TRUE.b, rel=1e-3)  # rounds 0 and 1 only
    assert TRUE.b * 1.01 < v.round_fits[0].wall.b < TRUE.b * 1.5  # round 2's slow rows in it
    w = run([1.0, 1.0, 3.0])
    assert w.round_fits[2].wall == v.round_fits[2].wall  # held out: its own rows do not move it
    assert w.round_fits[0].wall.b > v.round_fits[0].wall.b
    assert v.held_out and "cross-fitted" in v.calibration_from
    assert [c.label for c in comparisons(v, 2)] == ["sync"]
    assert v.sim_for("sync", 2) is v.round_sims[("sync", 2)] and v.fit_for(2) is v.round_fits[2]


def test_the_priced_work_has_its_own_noise_floor():
    """Rounds whose priced work differs (APRIL's stop follows the timing) get that spread as the
    priced noise floor; rounds doing the same work get 0; a run without priced steps gets None."""
    from statistics import mean, stdev

    from aprilsim.validate.rounds import noise_floor, pooled

    sc = small_scenario()
    eng = matched_engine(TRUE, max_running=64, kv_capacity=5120)
    sim = simulate_matched(sc, "april", eng, n_engines=2, scale=1 / 256, seed=1, steps=4)
    busy = [max(s.busy_by_engine_s) for s in sim.steps]
    factors = [1.0, 1.2, 0.85]
    rounds = [[compare_runs("april", sim, sim, busy, [f * b for b in busy]),
               compare_runs("sync", sim, sim, busy, busy)] for f in factors]
    p = pooled(rounds)["schedulers"]
    assert p["april"]["priced_noise_floor"] == pytest.approx(stdev(factors) / mean(factors),
                                                             rel=1e-6)
    assert p["sync"]["priced_noise_floor"] == 0.0
    assert p["april"]["noise_floor"] == 0.0  # the wall-clock times were the same
    assert noise_floor([compare_runs("april", sim, sim)] * 2, "meas_priced_s") is None
