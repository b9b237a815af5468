"""`aprilsim calibrate` refuses what it cannot fit (issue 22, W5), says when its form fits badly,
shows one error definition in its table and plot, and writes what was measured and assumed."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import event, given, settings, target
from hypothesis import strategies as st

from aprilsim.cli import main
from aprilsim.engine.calibration import CostCalibrator, Record, preset_toml, write_csv
from aprilsim.engine.calibration.cli import form_advice
from aprilsim.engine.cost import CostModel

HEAD = "phase,batch_size,kv_tokens,prefill_tokens,duration_s,prefill_sizes,prefill_tokens_sq\n"


def _grid(fn, batches=(1, 2, 4, 8, 16, 32, 64), kvs=(100, 1000, 5000)) -> list[Record]:
    out = [Record("decode", b, float(b * k), 0, fn(b, b * k)) for b in batches for k in kvs]
    out += [Record("prefill", 1, 0.0, n, 1e-3 + 1e-6 * n, float(n * n))
            for n in (32, 128, 512, 2048)]
    return out


@pytest.mark.parametrize(("rows", "message"), [
    ("decode,4,100,0,0.01,,\n", "distinct decode shape(s)"),  # one row: no error estimate
    ("decode,1,10,0,0.01,,\ndecode,2,10,0,0.02,,\ndecode,4,10,0,inf,,\n",
     "duration_s must be finite"),
    ("decode,2.5,10,0,0.01,,\n", "batch_size must be a whole number"),
    ("prefill,,0,,0.01,-5;10,\n", "prefill_sizes must be >= 1"),
    ("prefill,2,0,10,0.01,,200\n", "prefill_tokens_sq 200 is impossible"),  # > (n-b+1)^2 + b-1 = 82
    ("prefill,2,0,10,0.01,,10\n", "prefill_tokens_sq 10 is impossible"),  # < n^2 / b = 50
    ("decode,1,nan,0,0.01,,\n", "kv_tokens must be finite"),
])
def test_csv_input_that_cannot_be_fitted_is_refused_in_one_line(tmp_path, rows, message):
    p = tmp_path / "r.csv"
    p.write_text(HEAD + rows)
    res = CliRunner().invoke(main, ["calibrate", "--csv", str(p)])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], res.stderr
    assert "nan%" not in res.output


def test_too_few_prefill_shapes_are_refused_not_fitted_exactly():
    recs = _grid(lambda b, k: 1e-3 + 1e-5 * b)[:-3]  # one prefill size left
    with pytest.raises(ValueError, match="distinct prefill shape"):
        CostCalibrator().fit(recs)


def test_the_table_and_the_plot_use_one_error_definition():
    rng = np.random.default_rng(0)
    recs = [Record(r.phase, r.batch_size, r.kv_tokens, r.prefill_tokens,
                   r.duration_s * (1 + 0.2 * rng.standard_normal() ** 2), r.prefill_tokens_sq)
            for r in _grid(lambda b, k: 2e-3 + 1e-5 * b + 1e-8 * k) for _ in range(3)]
    cal = CostCalibrator().fit(recs)
    every = next(e for e in cal.errors_ if e.regime == "all")
    # the table's median is the median of the residuals the plot draws, over every record
    assert every.n == len(recs)
    assert every.median_abs == pytest.approx(float(np.median(np.abs(cal.residuals_))), rel=0.05)


def test_advice_when_the_default_form_fits_badly():
    curve = _grid(lambda b, k: 1e-3 * np.sqrt(b) + 1e-8 * k)  # concave in B: linear cannot follow
    cal = CostCalibrator("linear").fit(curve)
    adv = form_advice(curve, cal, "linear", 12)
    assert adv is not None and adv["form"] == "tables"
    assert adv["median_abs"] < 0.7 * adv["this_median_abs"] and "--form tables" in adv["advice"]
    straight = _grid(lambda b, k: 1e-3 + 1e-5 * b + 1e-8 * k)
    assert form_advice(straight, CostCalibrator("linear").fit(straight), "linear", 12) is None


def test_cli_prints_the_advice_and_draws_predicted_vs_measured(tmp_path):
    pytest.importorskip("matplotlib")
    p = tmp_path / "r.csv"
    write_csv(_grid(lambda b, k: 1e-3 * np.sqrt(b) + 1e-8 * k), p)
    res = CliRunner().invoke(main, ["calibrate", "--csv", str(p),
                                    "--plot", str(tmp_path / "f.png")])
    assert res.exit_code == 0, res.output
    assert "note: the linear form fits decode with" in res.output and "--form tables" in res.output
    assert (tmp_path / "f.png").stat().st_size > 10_000
    js = CliRunner().invoke(main, ["calibrate", "--csv", str(p), "--json"])
    assert json.loads(js.stdout)["advice"]["form"] == "tables"


def test_the_preset_says_what_was_measured_and_what_was_assumed():
    text = preset_toml(CostModel(a=1e-3, b=1e-5, c=1e-8, p0=0.0, p1=0.0),
                       measured=["vocabulary 384 (probed)"],
                       assumed=["kv_capacity: not reported"])
    assert "# measured: vocabulary 384 (probed)" in text
    assert "# assumed: kv_capacity: not reported" in text


def test_fit_prefill_holds_a_given_p0_and_fits_pr_from_an_iteration_log():
    """validate's wall fit: the bundled engine's per-request-bound prefill read from its iteration
    log (records_from_iterations), p0 held at a given value, pr and p1 fitted around it; the form
    without pr fits the same steps far worse."""
    from aprilsim.engine.calibration import records_from_iterations
    from aprilsim.engine.calibration.fit import fit_prefill, relative_errors

    true = CostModel(a=3e-3, b=1e-4, c=0.0, p0=3e-3, p1=1e-6, pr=4e-3)
    rows, seq = [], 0
    for b in (1, 2, 5, 9, 16):
        for n in (10, 60, 250):  # tokens per request: fresh prompts to resumed inputs
            seq += 1
            rows.append(dict(seq=seq, phase="prefill", batch_size=b, prefill_tokens=b * n,
                             kv_tokens=b * n,
                             duration_s=true.prefill_time(b * n, b * n * n, requests=b)))
    recs = records_from_iterations(rows)
    p0, p1, p2, pr = fit_prefill(recs, p0=true.p0)
    assert (p0 == true.p0 and pr == pytest.approx(true.pr, rel=1e-3)
            and p1 == pytest.approx(true.p1, rel=1e-2))
    fitted = CostModel(a=true.a, b=true.b, c=0.0, p0=p0, p1=p1, p2=p2, pr=pr)
    assert np.max(np.abs(relative_errors(fitted, recs))) < 1e-3
    q0, q1, q2, none = fit_prefill(recs, per_request=False)
    assert none == 0.0
    coarse = CostModel(a=true.a, b=true.b, c=0.0, p0=q0, p1=q1, p2=q2)
    assert np.median(np.abs(relative_errors(coarse, recs))) > 0.2


def test_a_per_request_prefill_term_is_fitted_priced_and_kept_in_the_preset(tmp_path):
    """Prefill that costs per request (a CPU engine's Python loop per sequence): calibrate fits
    pr, the chunked walk charges it once per request, the preset and a scenario carry it."""
    from aprilsim.config import load_preset_file
    from aprilsim.engine.cost import chunked_prefill_time

    true = CostModel(a=1e-3, b=1e-5, c=1e-8, p0=2e-3, p1=1e-6, p2=0.0, pr=2e-3)
    recs = _grid(lambda b, k: true.decode_time(b, k))
    recs = [r for r in recs if r.phase == "decode"]
    for b in (1, 4, 16, 64):
        for n in (2, 16, 128):
            recs.append(Record("prefill", b, 0.0, b * n,
                               true.prefill_time(b * n, b * n * n, requests=b),
                               float(b * n * n)))
    cal = CostCalibrator().fit(recs)
    assert cal.cost_.pr == pytest.approx(2e-3, rel=0.05)
    assert cal.cost_.p1 == pytest.approx(1e-6, rel=0.2)
    # chunked walk: once per request, in the pass of its first piece; without pr, unchanged
    lens = [300, 5, 700]
    t1, passes, _ = chunked_prefill_time(true, lens, chunk=256)
    t0, _, _ = chunked_prefill_time(CostModel(a=1e-3, b=1e-5, c=1e-8, p0=2e-3, p1=1e-6), lens,
                                    chunk=256)
    assert t1 - t0 == pytest.approx(3 * 2e-3)
    assert chunked_prefill_time(true, lens, chunk=0)[0] == pytest.approx(
        true.prefill_time(1005, sum(n * n for n in lens), requests=3))
    p = tmp_path / "cal.toml"
    from aprilsim.engine.calibration import write_preset

    write_preset(p, cal.cost_)
    assert f"pr = {cal.cost_.pr!r}" in p.read_text()
    assert load_preset_file(p).cost.pr == cal.cost_.pr
    from aprilsim.config import default_scenario, scenario_from_dict

    d = default_scenario().model_dump(mode="json", exclude_none=True)
    d["cluster"]["cost"] = {"a": 1e-3, "b": 1e-5, "c": 1e-8, "p0": 0.0, "p1": 0.0, "pr": 1e-3}
    assert scenario_from_dict(d, tmp_path).engine_spec().cost.pr == 1e-3


def test_the_sweep_reaches_what_the_scenarios_rollouts_reach():
    """validate_live.toml (8 prompts x 4 samples, APRIL ratio 2) on one engine at scale 1/64:
    64 requests at once, KV per request up to the longest prompt + half the longest response."""
    from pathlib import Path

    from aprilsim.config import load_scenario
    from aprilsim.engine.calibration.reach import scenario_reach

    sc = load_scenario(Path(__file__).parents[1] / "experiments" / "scenarios"
                       / "validate_live.toml")
    assert scenario_reach(sc, 1, 1 / 64) == (64, (16, 51, 160))
    assert scenario_reach(sc, 2, 1 / 64)[0] == 32


def test_a_csv_whose_prefill_sizes_share_a_bin_is_fitted(tmp_path):
    """Issue 36 item 1: `prefill,1,0,100` and `prefill,1,0,104` fall in one fitting bin; the
    bin's mean sum of squares (10408) is not one 102-token step's (10404), and was refused as
    `prefill_tokens_sq 10408 is impossible`, naming a record not in the file."""
    rng = np.random.default_rng(0)
    rows = ["prefill,1,0,100,0.0100,,", "prefill,1,0,104,0.0102,,", "prefill,4,0,2000,0.05,,",
            "prefill,2,0,900,0.03,,"]
    for _ in range(40):
        b = int(rng.integers(1, 17))
        kv = int(rng.integers(100, 5000)) * b
        rows.append(f"decode,{b},{kv},0,{0.005 + 2e-4 * b + 1e-7 * kv:.6f},,")
    p = tmp_path / "r.csv"
    p.write_text(HEAD + "\n".join(rows) + "\n")
    res = CliRunner().invoke(main, ["calibrate", "--csv", str(p), "--json"])
    assert res.exit_code == 0, res.stderr
    assert "impossible" not in res.stderr


def test_binning_never_refuses_records_that_were_each_valid():
    """Any valid prefill steps (batches up to 256, up to 16k tokens a request, pairs of nearby
    sizes that share a bin) bin without error; the counts add up, and most examples do merge
    steps of different sizes (the case that was refused)."""
    from aprilsim.engine.calibration.fit import bin_records

    merged_runs = []

    @settings(max_examples=150, deadline=None)
    @given(st.lists(st.tuples(st.sampled_from([1, 2, 8, 64, 256]), st.integers(1, 16_384),
                              st.floats(0.0, 0.1), st.floats(1e-4, 10.0)),
                    min_size=1, max_size=30))
    def check(steps):
        recs = []
        for b, n, jitter, t in steps:  # two steps of nearby sizes: b requests of n and n'
            n2 = n + max(1, int(n * jitter))
            recs += [Record("prefill", b, 0.0, b * n, t, float(b * n * n)),
                     Record("prefill", b, 0.0, b * n2, t * 1.01, float(b * n2 * n2))]
        binned = bin_records(recs)
        assert sum(c for _, c in binned) == len(recs)
        sizes = {(r.batch_size, r.prefill_tokens) for r in recs}
        merged = sum(c > 1 and (rec.batch_size, rec.prefill_tokens) not in sizes
                     for rec, c in binned)
        event(f"bins merging different sizes: {min(merged, 3)}")
        target(float(merged), label="merged bins")
        merged_runs.append(merged)
        for rec, c in binned:  # a bin of several steps is a mean, marked as one
            assert rec.averaged == (c > 1) and rec.tokens_sq > 0

    check()
    assert sum(m > 0 for m in merged_runs) >= len(merged_runs) // 2
