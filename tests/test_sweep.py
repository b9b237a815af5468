"""`aprilsim sweep` and `aprilsim.sweep()`: keys, rows, resumability, the aggregate, the figure."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

pd = pytest.importorskip("pandas", reason="sweeps need the `sweep` extra (pandas)")
pytest.importorskip("pyarrow", reason="sweeps need the `sweep` extra (pyarrow)")

from click.testing import CliRunner  # noqa: E402
from scipy import stats as sps  # noqa: E402
from sweep_helpers import TINY_TOML, tiny  # noqa: E402

import aprilsim  # noqa: E402
from aprilsim.cli import main  # noqa: E402
from aprilsim.config import ScenarioError  # noqa: E402
from aprilsim.sweep.api import run_sweep  # noqa: E402
from aprilsim.sweep.journal import journal_path  # noqa: E402
from aprilsim.sweep.keys import parse_grid, parse_range, split_values  # noqa: E402
from aprilsim.sweep.stats import aggregate  # noqa: E402

RATIO = "schedulers.april.ratio"


def cli(*args):
    return CliRunner().invoke(main, list(args))


def test_value_parsing_and_axes():
    assert split_values("1, 2,[3,4],x") == ["1", "2", "[3,4]", "x"]
    assert parse_grid("a.b=1,2.5,true,[1,2],fifo") == (("a.b",), [1, 2.5, True, [1, 2], "fifo"])
    assert parse_grid("a+b=1,2") == (("a", "b"), [1, 2])
    assert parse_range("cluster.engines=1:4:4", {"cluster": {"engines": 4}})[1] == [1, 2, 3, 4]
    # integer-looking bounds on a float knob still give floats
    assert parse_range(f"{RATIO}=1:2:3",
                       {"schedulers": {"april": {"ratio": 2.0}}})[1] == [1.0, 1.5, 2.0]


@pytest.mark.parametrize(
    "grid, named",
    [
        ("cluster.enginez=1,2", "cluster.enginez"),
        ("cluster.engines=0,2", "cluster.engines"),
        ("schedulers.april.ratioo=1,2", "ratioo"),
        ("lengths.sigma=oops", "lengths"),
    ],
)
def test_bad_key_or_value_exits_2_with_one_line(tmp_path, grid, named):
    r = CliRunner().invoke(main, ["sweep", "--grid", grid, "--out", str(tmp_path / "r.parquet")])
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("aprilsim: error:") and named in lines[0]
    assert not (tmp_path / "r.parquet").exists()


def test_rows_one_per_point_scheduler_seed_and_scalar_columns():
    df = aprilsim.sweep(tiny(), {RATIO: [1.0, 2.0]}, seeds=2, jobs=1)
    assert len(df) == 2 * 2 * 2
    assert set(df["scheduler"]) == {"sync", "april"} and set(df["seed"]) == {0, 1}
    assert {"rollout_throughput_tok_s", "offpolicy_token_fraction", "length_bias",
            "mean_staleness", "engine_busy_fraction_max", RATIO} <= set(df.columns)
    assert not any(isinstance(v, dict | list) for v in df.iloc[0].to_numpy())
    # sync does not read the APRIL ratio: one simulation per seed, the same numbers at each point
    sync = df[df["scheduler"] == "sync"].sort_values(["seed", RATIO])
    a, b = sync[sync[RATIO] == 1.0], sync[sync[RATIO] == 2.0]
    assert (a["rollout_throughput_tok_s"].to_numpy()
            == b["rollout_throughput_tok_s"].to_numpy()).all()
    # more over-provisioning, more off-policy tokens
    april = df[df["scheduler"] == "april"].groupby(RATIO)["offpolicy_token_fraction"].mean()
    assert april[2.0] > april[1.0]


def test_pool_gives_the_same_rows_as_one_process():
    one = aprilsim.sweep(tiny(), {RATIO: [1.5, 3.0]}, seeds=2, jobs=1)
    two = aprilsim.sweep(tiny(), {RATIO: [1.5, 3.0]}, seeds=2, jobs=2)
    cols = [c for c in one.columns if c != "sim_s"]
    pd.testing.assert_frame_equal(one[cols], two[cols])


def test_resume_after_interrupt_loses_nothing_and_repeats_nothing(tmp_path):
    out = tmp_path / "r.parquet"
    grid = {RATIO: [1.0, 1.5, 2.0, 3.0]}

    def stop_after_5(done, total):
        if done >= 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep(tiny(), grid, seeds=2, jobs=2, out=out, progress=stop_after_5)
    journal = journal_path(out).read_text().splitlines()
    kept = len(journal) - 1  # header line
    assert kept >= 5
    assert len(pd.read_parquet(out)) == kept  # the tables were written on the way out
    _, stats, _ = run_sweep(tiny(), grid, seeds=2, jobs=2, out=out)
    assert stats["skipped"] == kept and stats["runs"] == 16 - kept
    df = pd.read_parquet(out)
    assert len(df) == 16 and not df.duplicated(["point_id", "scheduler", "seed"]).any()
    assert len(pd.read_csv(out.with_suffix(".csv"))) == 16
    # a third run has nothing left to do
    _, stats, _ = run_sweep(tiny(), grid, seeds=2, jobs=1, out=out)
    assert stats["runs"] == 0 and stats["skipped"] == 16


def test_resume_extends_a_grid_and_tolerates_a_torn_line(tmp_path):
    out = tmp_path / "r.parquet"
    run_sweep(tiny(), {RATIO: [1.0]}, seeds=1, schedulers=["april"], jobs=1, out=out)
    with journal_path(out).open("a") as f:
        f.write('{"point_id": "[[')  # killed mid-write
    _, stats, _ = run_sweep(tiny(), {RATIO: [1.0, 2.0]}, seeds=1, schedulers=["april"], jobs=1,
                            out=out)
    assert stats["skipped"] == 1 and stats["runs"] == 1
    assert len(pd.read_parquet(out)) == 2


def test_resume_refuses_another_base_scenario(tmp_path):
    out = tmp_path / "r.parquet"
    run_sweep(tiny(), {RATIO: [1.0]}, seeds=1, jobs=1, out=out)
    with pytest.raises(ScenarioError, match="another base scenario"):
        run_sweep(tiny(), {RATIO: [1.0]}, seeds=1, steps=3, jobs=1, out=out)


def test_aggregate_on_a_hand_built_table():
    rows = []
    thr = {"sync": [100.0, 110.0, 90.0], "april": [150.0, 170.0, 130.0]}
    for sched, values in thr.items():
        for seed, v in enumerate(values):
            rows.append({"point_id": '[["k",1]]', "k": 1, "scheduler": sched, "seed": seed,
                         "rollout_throughput_tok_s": v})
    agg = aggregate(pd.DataFrame(rows), ["k"]).set_index("scheduler")
    a = agg.loc["april"]
    assert a["baseline"] == "sync" and a["n"] == 3 and a["mean"] == pytest.approx(150.0)
    half = sps.t.ppf(0.975, 2) * 20.0 / math.sqrt(3)  # sd of 150,170,130 is 20
    assert (a["ci_lo"], a["ci_hi"]) == pytest.approx((150 - half, 150 + half))
    # paired differences 50, 60, 40: mean 50, sd 10
    half_d = sps.t.ppf(0.975, 2) * 10.0 / math.sqrt(3)
    assert (a["diff_mean"], a["diff_lo"], a["diff_hi"]) == pytest.approx((50, 50 - half_d,
                                                                          50 + half_d))
    assert a["ratio_mean"] == pytest.approx((1.5 + 170 / 110 + 130 / 90) / 3)
    s = agg.loc["sync"]
    assert (s["diff_mean"], s["ratio_mean"]) == (0.0, 1.0)


def test_cli_sweep_then_plot(tmp_path):
    (tmp_path / "tiny.toml").write_text(TINY_TOML)
    out = tmp_path / "r.parquet"
    r = cli("sweep", str(tmp_path / "tiny.toml"), "--grid", f"{RATIO}=1,2", "--range",
            "cluster.engines=1:2:2", "--seeds", "2", "--jobs", "1", "--out", str(out))
    assert r.exit_code == 0, r.output
    assert "april" in r.stdout and "gain" in r.stdout
    for name in ("r.parquet", "r.csv", "r.agg.parquet", "r.agg.csv", "r.journal.jsonl"):
        assert (tmp_path / name).exists(), name
    assert len(pd.read_parquet(out)) == 2 * 2 * 2 * 2
    pytest.importorskip("matplotlib")
    png = tmp_path / "f.png"
    r = cli("plot", "sweep", str(out), "-o", str(png))
    assert r.exit_code == 0, r.output
    assert png.stat().st_size > 20_000
    r = cli("plot", "sweep", str(out), "--x", "nope", "-o", str(png))
    assert r.exit_code == 2 and "nope" in r.stderr


def test_core_import_does_not_need_pandas_and_sweep_is_callable():
    code = ("import sys, aprilsim, aprilsim.cli; assert 'pandas' not in sys.modules; "
            "import aprilsim.sweep; assert callable(aprilsim.sweep); "
            "assert 'pandas' not in sys.modules; print(json.dumps(1))")
    r = subprocess.run([sys.executable, "-c", "import json; " + code], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == 1
