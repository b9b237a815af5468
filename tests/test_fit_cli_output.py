"""What `aprilsim fit` prints and writes (issue #13, items 10-14): one-line usage errors for every
command, outputs checked before the fit, observed values beside the model's, true binning limit,
a warning for tiny samples and an explained cap."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from aprilsim.cli import main
from aprilsim.workload.fitting import LengthFitter
from aprilsim.workload.fitting.report import FitReport
from aprilsim.workload.lengths import LognormalMixture, cap_lengths


def cli(*args: str):
    res = CliRunner().invoke(main, list(args), prog_name="aprilsim")
    return res.exit_code, res.stdout, res.stderr


def lengths_file(tmp_path, x, name="l.csv"):
    p = tmp_path / name
    p.write_text("response_length\n" + "\n".join(map(str, np.asarray(x).tolist())) + "\n")
    return p


# ---------------------------------------------------------------- item 10
@pytest.mark.parametrize("command", main.list_commands(None))  # the lazy ones too
def test_usage_errors_are_one_line_for_every_command(command):
    code, out, err = cli(command, "--no-such-option")
    assert code == 2
    assert err.strip().splitlines() == [
        f"aprilsim {command}: error: No such option '--no-such-option'."
    ]
    code, out, _ = cli(command, "--help")  # help stays whole
    assert code == 0 and out.startswith(f"Usage: aprilsim {command}") and len(out.splitlines()) > 3


def test_option_range_errors_are_one_line(tmp_path):
    code, _, err = cli("fit", "l.csv", "--max-len", "0")
    assert code == 2
    assert err.strip().splitlines() == [
        "aprilsim fit: error: Invalid value for '--max-len': 0 is not in the range x>=2."
    ]
    code, _, err = cli("no-such-command")
    assert code == 2 and len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------- item 11
@pytest.fixture
def small(tmp_path):
    return lengths_file(
        tmp_path, np.ceil(np.random.default_rng(0).lognormal(5, 0.6, 400)).astype(int)
    )


@pytest.fixture
def no_fit(monkeypatch):
    def boom(self, *a, **k):
        raise AssertionError("the fit ran before the output paths were checked")

    monkeypatch.setattr(LengthFitter, "fit", boom)


@pytest.mark.parametrize(
    "args,message",
    [
        (["--out", "missing/m.toml"], "does not exist"),
        (["--plot", "missing/f.png"], "does not exist"),
        (["--out", "same.png", "--plot", "same.png"], "the same file"),
        (["--out", "m", "--plot", "m"], None),  # `m` and `m.png`: distinct, fine
        (["--plot", "f.xyz"], "unknown figure format"),
        (["--out", "."], "is a directory"),
    ],
)
def test_output_paths_are_checked_before_the_fit(
    tmp_path, small, no_fit, monkeypatch, args, message
):
    monkeypatch.chdir(tmp_path)
    code, out, err = cli("fit", str(small), "--bootstrap", "0", *args)
    if message is None:  # valid paths: the fit is reached (and stopped by the fixture)
        assert "the fit ran before" in err
        return
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err


def test_output_paths_may_not_overwrite_the_input(small, no_fit):
    code, _, err = cli("fit", str(small), "--out", str(small))
    assert code == 2 and "is the input file" in err


def test_what_was_written_is_what_is_printed(tmp_path, small, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = cli(
        "fit",
        str(small),
        "--bootstrap",
        "0",
        "--families",
        "gamma",
        "--plot",
        "fitplot",
        "--out",
        "m.toml",
    )
    assert code == 0, err
    assert (tmp_path / "fitplot.png").is_file() and not (tmp_path / "fitplot").exists()
    assert "wrote fitplot.png" in out.splitlines() and "wrote m.toml" in out.splitlines()
    assert out.startswith(f"{small}: column")  # the table comes before the files


# ---------------------------------------------------------------- item 12
def test_observed_capped_share_and_p99_beside_the_model(tmp_path):
    truth = LognormalMixture((0.7, 0.3), (5.0, 7.5), (0.4, 0.5))
    x = cap_lengths(truth.rvs(30000, np.random.default_rng(2)), 8000)
    p = lengths_file(tmp_path, x)
    # a single lognormal misfits the two-bump tail: its p99 interval misses the data's p99
    code, out, err = cli(
        "fit", str(p), "--max-len", "8000", "--families", "lognormal", "--bootstrap", "30"
    )
    assert code == 0, err
    line = [ln for ln in out.splitlines() if ln.strip().startswith("p50")][0]
    share = np.mean(x >= 8000)
    assert f"(data {100 * share:.2f} %" in line or f"(data {100 * share:.2g} %" in line
    assert "p99" in line and "OUTSIDE the interval" in line.split("p99")[1].split(";")[0]
    code, out, _ = cli(
        "fit", str(p), "--max-len", "8000", "--families", "lognormal", "--bootstrap", "30", "--json"
    )
    d = json.loads(out)
    assert d["data_outside_interval"]["p99"] is True
    assert d["observed_capped_share"] == pytest.approx(share)


def test_small_shares_are_not_printed_as_zero(tmp_path):
    x = np.ceil(np.random.default_rng(3).lognormal(5, 0.6, 20000)).astype(int)
    x[:6] = 5000  # 0.03 % at the cap
    code, out, _ = cli(
        "fit",
        str(lengths_file(tmp_path, x)),
        "--max-len",
        "5000",
        "--families",
        "lognormal",
        "--bootstrap",
        "0",
    )
    assert code == 0
    assert "(0.03 %) at or above it" in out and "(data 0.03 %)" in out and "0.00 %" not in out


# ---------------------------------------------------------------- item 13
def test_binning_line_states_the_real_exact_limit(tmp_path):
    x = np.ceil(np.random.default_rng(4).lognormal(7, 1.0, 200_000)).astype(int)
    code, out, _ = cli(
        "fit", str(lengths_file(tmp_path, x)), "--families", "lognormal", "--bootstrap", "0"
    )
    assert code == 0
    line = [ln for ln in out.splitlines() if "bins" in ln][0]
    limit = int(line.split("lengths up to ")[1].split(" kept exact")[0].replace(",", ""))
    assert limit >= 256  # never the smallest length (the old "exact up to 9+")
    data = LengthFitter(families=["lognormal"], n_bootstrap=0).fit(x).data_
    width = data.values - data.lower
    assert np.all(width[data.values <= limit] == 1)  # each length its own bin up to the limit
    assert width[data.values > limit][0] > 1  # and merged right above it


# ---------------------------------------------------------------- item 14
def test_few_lengths_warn(tmp_path):
    code, out, err = cli(
        "fit", str(lengths_file(tmp_path, [5, 9, 12, 40, 33, 7, 18, 21])), "--bootstrap", "0"
    )
    assert code == 0
    assert "aprilsim fit: warning: only 8 lengths" in err
    code, out, err = cli(
        "fit",
        str(lengths_file(tmp_path, np.arange(1, 200))),
        "--bootstrap",
        "0",
        "--families",
        "gamma",
    )
    assert "warning" not in err


def test_a_detected_cap_is_explained(tmp_path):
    x = np.ceil(np.random.default_rng(5).gamma(2.0, 300, 20000)).astype(int)
    x = np.minimum(x, 1500)
    code, out, _ = cli(
        "fit", str(lengths_file(tmp_path, x)), "--families", "gamma", "--bootstrap", "0"
    )
    assert code == 0
    line = [ln for ln in out.splitlines() if ln.startswith("cap ")][0]
    n_cap = int((x == 1500).sum())
    assert line.startswith(f"cap 1500 detected: {n_cap:,} lengths")
    assert "sit exactly at the maximum" in line and "Poisson p =" in line and "predicts" in line


def test_report_warnings_are_in_json(tmp_path):
    f = LengthFitter(families=["gamma"], n_bootstrap=0).fit(np.array([5, 9, 12, 40, 33, 7]))
    from aprilsim.workload.fitting.data import LengthData

    rep = FitReport(data=LengthData(f.histogram_), fitter=f, model=f.model_)
    assert rep.to_dict()["warnings"] and "only 6 lengths" in rep.to_dict()["warnings"][0]
