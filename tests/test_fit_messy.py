"""Messy real-world logs (issue #13, items 1-9): no silent corruption, realistic files read,
one-line errors with exit 2 for what cannot be read, raw bytes never echoed to the terminal."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
from click.testing import CliRunner

from aprilsim.workload.fitting import read_lengths
from aprilsim.workload.fitting.cli import fit_command

LENGTHS = [12, 40, 40, 7, 300, 95, 18, 1000, 61, 5, 240, 33]


def run(*args: str, input: str | bytes | None = None):
    res = CliRunner().invoke(fit_command, list(args), input=input)
    return res.exit_code, res.stdout, res.stderr


def one_line_error(code: int, stderr: str) -> str:
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("aprilsim fit: error: "), stderr
    assert "Traceback" not in stderr
    return lines[0]


# ---------------------------------------------------------------- item 1
def test_values_beyond_int64_are_bad_rows_not_negative_lengths(tmp_path):
    p = tmp_path / "u64.csv"
    rows = [str(v) for v in range(100, 3000, 7)] + ["18446744073709551615", "1e300"]
    p.write_text("output_tokens\n" + "\n".join(rows) + "\n")
    code, out, err = run(str(p), "--bootstrap", "0", "--json", "--families", "lognormal,gamma")
    assert code == 0, err
    d = json.loads(out)
    assert d["rows_skipped"] == {"too large": 2}
    assert d["rows_skipped_examples"]["too large"] in ("1.84467e+19", "1e+300")
    assert d["n"] == len(rows) - 2
    assert all(r["converged"] for r in d["ranking"])
    assert "2 too large" in err


# ---------------------------------------------------------------- item 2
def test_quoted_thousands_separators_are_parsed(tmp_path):
    x = np.ceil(np.random.default_rng(0).lognormal(6.5, 0.8, 5000)).astype(int)
    p = tmp_path / "formatted.csv"
    p.write_text("output_tokens\n" + "\n".join(f'"{v:,}"' for v in x) + "\n")
    d = read_lengths(p)
    assert d.n_skipped == 0
    np.testing.assert_array_equal(d.histogram.expand(), np.sort(x))


def junk_file(tmp_path, share: float, n: int = 1000):
    rng = np.random.default_rng(1)
    rows = [str(v) for v in np.ceil(rng.lognormal(5, 0.7, n)).astype(int)]
    for i in range(int(share * n)):
        rows[i] = "n/a"
    p = tmp_path / "junk.csv"
    p.write_text("response_length\n" + "\n".join(rows) + "\n")
    return p


def test_a_small_share_of_dropped_rows_is_a_plain_line(tmp_path):
    code, _, err = run(str(junk_file(tmp_path, 0.005)), "--bootstrap", "0", "--families", "gamma")
    assert code == 0
    assert "skipped 5 of 1,000 rows: 5 not a number" in err and "warning" not in err


def test_more_dropped_rows_warn_with_share_and_main_reason(tmp_path):
    code, _, err = run(str(junk_file(tmp_path, 0.05)), "--bootstrap", "0", "--families", "gamma")
    assert code == 0
    line = [ln for ln in err.splitlines() if "skipped" in ln][0]
    assert (
        "warning" in line and "5.0 % of rows" in line and "mostly not a number, e.g. 'n/a'" in line
    )


def test_too_many_dropped_rows_refuse_the_file_unless_the_threshold_is_raised(tmp_path):
    p = junk_file(tmp_path, 0.3)
    line = one_line_error(*run(str(p), "--bootstrap", "0")[::2])
    assert "30.0 % of rows unusable" in line and "--max-skipped" in line and "'n/a'" in line
    code, _, err = run(str(p), "--bootstrap", "0", "--families", "gamma", "--max-skipped", "0.5")
    assert code == 0 and "warning" in err


# ---------------------------------------------------------------- item 3
def test_fields_longer_than_the_csv_module_default_are_read(tmp_path):
    rng = np.random.default_rng(0)
    n = rng.integers(100, 40000, 60)
    p = tmp_path / "r.csv"
    p.write_text("response_length,response\n" + "".join(f'{k},"{"tok " * k}"\n' for k in n))
    d = read_lengths(p)
    assert d.n == 60 and d.n_skipped == 0 and d.column == "response_length"


# ---------------------------------------------------------------- item 4
def test_standard_input_as_dash():
    code, out, err = run(
        "-", "--bootstrap", "0", "--families", "gamma", input="\n".join(map(str, LENGTHS))
    )
    assert code == 0, err
    assert out.startswith("<stdin>: column '(one length per line)', 12 lengths")


def test_pipes_are_read_not_reported_empty(tmp_path):
    text = "\n".join(str(v) for v in range(100, 601)) + "\n"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "aprilsim",
            "fit",
            "/dev/stdin",
            "--bootstrap",
            "0",
            "--json",
            "--families",
            "gamma",
        ],
        input=text,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["n"] == 501
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)

    def feed():
        with open(fifo, "w") as f:
            f.write(text)

    t = threading.Thread(target=feed)
    t.start()
    d = read_lengths(fifo)
    t.join()
    assert d.n == 501


# ---------------------------------------------------------------- item 5
def test_utf8_bom_keeps_the_first_record(tmp_path):
    bom = "\ufeff"
    jl = tmp_path / "a.weird"  # unknown suffix: sniffed as JSONL despite the mark
    jl.write_text(bom + "".join(json.dumps({"length": v}) + "\n" for v in LENGTHS), "utf-8")
    txt = tmp_path / "a.txt"
    txt.write_text(bom + "\n".join(map(str, LENGTHS)), "utf-8")
    csv = tmp_path / "b.csv"
    csv.write_text(bom + "response_length\n" + "\n".join(map(str, LENGTHS)), "utf-8")
    gz = tmp_path / "c.jsonl.gz"
    gz.write_bytes(gzip.compress(jl.read_bytes()))
    for p in (jl, txt, csv, gz):
        d = read_lengths(p)
        assert d.n_skipped == 0 and d.n == len(LENGTHS), p
        np.testing.assert_array_equal(d.histogram.expand(), np.sort(LENGTHS))


# ---------------------------------------------------------------- item 6
@pytest.mark.parametrize("sep", [";", "|", "\t"])
def test_delimiter_is_detected(tmp_path, sep):
    p = tmp_path / "a.csv"
    p.write_text(
        f"prompt_id{sep}response_length\n"
        + "".join(f"p{i}{sep}{v}\n" for i, v in enumerate(LENGTHS))
    )
    d = read_lengths(p)
    assert d.column == "response_length" and d.n_skipped == 0 and d.n == len(LENGTHS)


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be"])
def test_utf16_is_detected(tmp_path, encoding):
    p = tmp_path / "a.csv"
    p.write_bytes(("response_length,x\n" + "".join(f"{v},a\n" for v in LENGTHS)).encode(encoding))
    d = read_lengths(p)
    assert d.n_skipped == 0 and d.n == len(LENGTHS)


def test_what_was_seen_is_shown_when_nothing_parses(tmp_path):
    p = tmp_path / "a.csv"
    p.write_text("response_length\n" + "".join(f"{v} tokens\n" for v in LENGTHS))
    line = one_line_error(*run(str(p))[::2])
    assert "12 not a number" in line and "e.g. '12 tokens'" in line


# ---------------------------------------------------------------- item 7
def test_json_array_of_bare_numbers(tmp_path):
    p = tmp_path / "a.json"
    p.write_text(json.dumps(LENGTHS))
    d = read_lengths(p)
    np.testing.assert_array_equal(d.histogram.expand(), np.sort(LENGTHS))


def test_dotted_column_reaches_nested_fields(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_text(
        "".join(
            json.dumps({"meta": {"usage": {"completion_tokens": v}, "id": 1}}) + "\n"
            for v in LENGTHS
        )
    )
    d = read_lengths(p, column="meta.usage.completion_tokens")
    np.testing.assert_array_equal(d.histogram.expand(), np.sort(LENGTHS))
    assert read_lengths(p).column == "meta.usage.completion_tokens"  # detected by name, too


def test_parquet_decimal_and_dictionary_columns(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    import decimal

    p = tmp_path / "a.parquet"
    pq.write_table(
        pa.table(
            {
                "response_length": pa.array(
                    [decimal.Decimal(v) for v in LENGTHS], pa.decimal128(12, 2)
                ),
                "completion_tokens": pa.array(LENGTHS).dictionary_encode(),
            }
        ),
        p,
    )
    for col in ("response_length", "completion_tokens"):
        d = read_lengths(p, column=col)
        assert d.n_skipped == 0, d.skipped
        np.testing.assert_array_equal(d.histogram.expand(), np.sort(LENGTHS))


# ---------------------------------------------------------------- item 8
def test_huge_json_integers_and_deep_nesting_are_bad_rows(tmp_path):
    p = tmp_path / "a.jsonl"
    lines = [json.dumps({"response_length": v}) for v in LENGTHS]
    lines += ['{"response_length": 1' + "0" * 400 + "}", '{"response_length": 1' + "0" * 5000 + "}"]
    lines += ["[" * 100_000 + "]" * 100_000]
    p.write_text("\n".join(lines) + "\n")
    code, out, err = run(
        str(p), "--bootstrap", "0", "--json", "--families", "gamma", "--max-skipped", "1"
    )
    assert code == 0, err
    assert json.loads(out)["rows_skipped"] == {"too large": 2, "unparsable line": 1}


def test_deep_json_array_and_truncated_gzip_are_one_line_errors(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    assert "nested too deeply" in one_line_error(*run(str(deep))[::2])
    trunc = tmp_path / "trunc.bin"  # gzip magic, no .gz suffix, cut short
    trunc.write_bytes(gzip.compress("\n".join(str(v) for v in range(1, 5000)).encode())[:3000])
    assert "truncated" in one_line_error(*run(str(trunc))[::2])


# ---------------------------------------------------------------- item 9
def test_raw_bytes_from_the_file_are_escaped_in_messages(tmp_path):
    p = tmp_path / "g.bin"
    p.write_bytes(b"\x1b[41mRED\x07,\x1b[0m\x0bfoo\n1,2\n")
    line = one_line_error(*run(str(p))[::2])
    assert "\x1b" not in line and "\x07" not in line and "\x0b" not in line
    assert "\\x1b[41mRED\\x07" in line
    q = tmp_path / "h.csv"  # a usable file whose column name holds escapes: the table is safe too
    q.write_text("\x1b[31mresponse_length\x07\n" + "\n".join(map(str, LENGTHS)))
    code, out, err = run(
        str(q), "--bootstrap", "0", "--families", "gamma", "--column", "\x1b[31mresponse_length\x07"
    )
    assert code == 0, err
    assert "\x1b" not in out + err and "\\x1b[31mresponse_length\\x07" in out
