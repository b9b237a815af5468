"""Readers and bad input: every format (and gzip), column detection, skipped-row counts, and
one-line errors with exit code 2 for unusable files (never a traceback)."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
from click.testing import CliRunner

from aprilsim.workload.fitting import LengthData, LengthDataError, LengthFitter, read_lengths
from aprilsim.workload.fitting.cli import fit_command

LENGTHS = [12, 40, 40, 7, 300, 95, 18, 1000, 61, 5, 240, 33]


def write(path, text: str, gz: bool = False):
    if gz:
        path = path.with_name(path.name + ".gz")
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return path


def csv_text(sep=",", col="response_length"):
    rows = [f"prompt_id{sep}{col}{sep}step"]
    rows += [f"p{i // 3}{sep}{x}{sep}{i // 4}" for i, x in enumerate(LENGTHS)]
    return "\n".join(rows) + "\n"


def jsonl_text(col="completion_tokens"):
    return "".join(json.dumps({"id": i, col: x}) + "\n" for i, x in enumerate(LENGTHS))


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize(
    "name,text",
    [
        ("a.csv", csv_text()),
        ("a.tsv", csv_text("\t")),
        ("a.jsonl", jsonl_text()),
        ("a.json", json.dumps([{"output_len": x} for x in LENGTHS])),
        ("a.txt", "\n".join(map(str, LENGTHS)) + "\n"),
        ("a.log", "\n".join(map(str, LENGTHS)) + "\n"),  # sniffed as plain
    ],
)
def test_every_text_format_reads_the_same_lengths(tmp_path, name, text, gz):
    d = read_lengths(write(tmp_path / name, text, gz))
    np.testing.assert_array_equal(d.histogram.expand(), np.sort(LENGTHS))
    assert d.n_skipped == 0


@pytest.mark.parametrize("gz", [False, True])
def test_parquet(tmp_path, gz):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"num_decode_tokens": LENGTHS + [None], "prompt_id": ["x"] * 13}), path)
    if gz:
        raw = path.read_bytes()
        path = tmp_path / "a.parquet.gz"
        path.write_bytes(gzip.compress(raw))
    d = read_lengths(path)
    assert d.column == "num_decode_tokens" and d.group_column == "prompt_id"
    np.testing.assert_array_equal(np.sort(d.lengths), np.sort(LENGTHS))
    assert d.skipped == {"missing": 1}


def test_detects_length_group_and_step_columns(tmp_path):
    d = read_lengths(write(tmp_path / "a.csv", csv_text(col="GeneratedTokens")))
    assert (d.column, d.group_column, d.step_column) == ("GeneratedTokens", "prompt_id", "step")
    assert d.groups is not None and len(np.unique(d.groups)) == 4
    off = read_lengths(tmp_path / "a.csv", group_column="none", step_column="none")
    assert off.lengths is None and off.groups is None  # histogram only: bounded memory


def test_nested_jsonl_key_and_explicit_column(tmp_path):
    text = "".join(json.dumps({"usage": {"completion_tokens": x}, "n": 1}) + "\n" for x in LENGTHS)
    d = read_lengths(write(tmp_path / "a.jsonl", text))
    assert d.column == "usage.completion_tokens" and d.n == len(LENGTHS)
    d = read_lengths(tmp_path / "a.jsonl", column="usage.completion_tokens")
    assert d.n == len(LENGTHS)


def test_junk_rows_are_skipped_and_counted(tmp_path):
    rows = ["response_length", "12", "", "abc", "-3", "0", "4.5", "nan", "17", "8.0", "30", "inf"]
    d = read_lengths(write(tmp_path / "a.csv", "\n".join(rows) + "\n"))
    assert sorted(d.histogram.expand().tolist()) == [8, 12, 17, 30]
    assert d.skipped == {
        "not a number": 1,
        "zero or negative": 2,
        "non-integer": 1,
        "NaN/inf": 2,
    }
    # blank lines are not rows; "missing" counts empty cells of a multi-column file
    d = read_lengths(write(tmp_path / "b.csv", "response_length,x\n,1\n5,2\n9,3\n"))
    assert d.skipped == {"missing": 1}


def invoke(*args):
    res = CliRunner().invoke(fit_command, [str(a) for a in args])
    return res.exit_code, res.stdout, res.stderr


@pytest.mark.parametrize(
    "name,text,message",
    [
        ("empty.csv", "", "file is empty"),
        ("blank.jsonl", "\n\n", "file is empty"),
        ("nonum.csv", "name,comment\na,b\nc,d\n", "no length column found"),
        ("words.csv", "response_length\nabc\ndef\n", "no usable lengths"),
        ("neg.txt", "-1\n-5\n", "no usable lengths"),
        ("nan.jsonl", '{"output_length": NaN}\n{"output_length": null}\n', "no usable lengths"),
        ("one.csv", "response_length\n7\n7\n7\n", "all 3 lengths equal 7"),
        ("junk.jsonl", "not json\n{broken\n", "no JSON records"),
        ("bad.parquet", "this is not parquet", "not a readable Parquet file"),
    ],
)
def test_unusable_input_is_one_line_and_exit_2(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    code, stdout, stderr = invoke(path)
    assert code == 2, (stdout, stderr)
    assert message in stderr
    assert len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr
    assert stderr.startswith("aprilsim fit: error: ")


def test_usage_errors_exit_2(tmp_path):
    path = write(tmp_path / "a.csv", csv_text())
    for args in (
        [tmp_path / "missing.csv"],
        [path, "--column", "nope"],
        [path, "--families", "lognormal,bogus"],
        [path, "--max-len", "1"],
        [path, "--max-len", "6"],  # only one distinct length below the cap
    ):
        code, _, stderr = invoke(*args)
        assert code == 2 and "Traceback" not in stderr, (args, stderr)


def test_skipped_rows_are_reported_on_stderr(tmp_path):
    rows = ["response_length"] + [str(x) for x in LENGTHS] + ["oops", "-1"]
    path = write(tmp_path / "a.csv", "\n".join(rows) + "\n")
    code, stdout, stderr = invoke(path, "--bootstrap", "0", "--families", "lognormal")
    assert code == 0
    assert "skipped 2 of 14 rows: 1 not a number, 1 zero or negative" in stderr
    assert "lognormal" in stdout


def test_python_api_rejects_bad_arrays():
    for bad, msg in (
        ([], "no lengths"),
        ([1, 2, np.nan], "NaN"),
        ([3, -1, 4], "negative"),
        ([1.5, 2, 3], "not integers"),
        ([5, 5, 5], "one repeated value"),
    ):
        with pytest.raises(LengthDataError, match=msg):
            LengthFitter(n_bootstrap=0).fit(bad)


def test_large_file_is_streamed_into_a_histogram(tmp_path):
    rng = np.random.default_rng(0)
    x = np.ceil(rng.lognormal(6, 1, 200_000)).astype(int)
    path = tmp_path / "big.txt.gz"
    with gzip.open(path, "wt") as f:
        f.write("\n".join(map(str, x)))
    d = read_lengths(path)
    assert isinstance(d, LengthData) and d.lengths is None  # no per-row copy kept
    assert d.n == x.size and len(d.histogram.values) == len(np.unique(x))
