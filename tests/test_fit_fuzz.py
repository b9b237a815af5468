"""Fuzzing `aprilsim fit` (issue #13, item 16): hypothesis over file contents, formats, encodings,
compression and options.

Whatever the input, the command either exits 0 with a fit or exits 2 with exactly one line on
stderr: never a traceback, never exit 1 (an internal error), never a hang (an alarm stops an
example after 60 s), never a raw control character on the terminal. With exit 0, every row read is
either used or reported as skipped, and skipped rows are always reported on stderr. The examples
are derandomised (the same in CI every time) and the test asserts that they reach what they are
meant to reach: every format, gzip, truncated gzip, BOM and UTF-16, both exit codes, skipped rows,
the --max-skipped refusal, and values beyond 2^63.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import re
import signal
from collections import Counter

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from aprilsim.workload.fitting.cli import fit_command

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

BAD_CELLS = [
    "0",
    "-5",
    "nan",
    "inf",
    "-inf",
    "1e300",
    "18446744073709551615",
    "1" + "0" * 400,
    "12.5",
    "8.0",
    "1,234",
    "",
    "abc",
    "\x1b[31mred\x07",
    "\x00",
    " 7 ",
    "1_000",
    "٣",
    "+9",
]
FAST_FAMILIES = ["lognormal", "gamma", "weibull", "loglogistic", "empirical"]
FORMATS = [
    "csv",
    "semicolon",
    "tsv",
    "jsonl",
    "jsonl_nested",
    "json",
    "json_numbers",
    "plain",
    "parquet",
]
SUFFIX = {
    "csv": ".csv",
    "semicolon": ".csv",
    "tsv": ".tsv",
    "jsonl": ".jsonl",
    "jsonl_nested": ".jsonl",
    "json": ".json",
    "json_numbers": ".json",
    "plain": ".txt",
    "parquet": ".parquet",
}
EXAMPLES_PER_CASE = 5
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")

junk = st.one_of(st.sampled_from(BAD_CELLS), st.text(max_size=6))


@st.composite
def cell_lists(draw) -> list[str]:
    """Realistic lengths (a lognormal sample: hypothesis alone favours tiny, repeated values)
    with junk cells drawn by hypothesis at drawn positions."""
    n = draw(st.integers(0, 60))
    seed = draw(st.integers(0, 2**32 - 1))
    cells = [str(v) for v in np.ceil(np.random.default_rng(seed).lognormal(5, 1, n)).astype(int)]
    for i, bad in draw(
        st.lists(st.tuples(st.integers(0, max(n - 1, 0)), junk), max_size=n // 2 + 1)
    ):
        if i < len(cells):
            cells[i] = bad
    if draw(st.integers(0, 3)) == 0:  # a junk-heavy file: half the rows unusable
        pool = draw(st.lists(junk, min_size=1, max_size=3))
        for i in range(0, n, 2):
            cells[i] = pool[i % len(pool)]
    return cells


TRANSFORMS = ["none", "bom", "utf16", "gzip", "gzip_truncated", "cut"]


def as_json_value(c: str):
    """Numbers as JSON numbers where they are plain integers (big ones included), else strings."""
    return int(c) if re.fullmatch(r"-?\d{1,500}", c) else c


def build(fmt: str, cells: list[str]) -> bytes:
    if fmt in ("csv", "semicolon", "tsv"):
        buf = io.StringIO()
        w = csv.writer(buf, delimiter={"csv": ",", "semicolon": ";", "tsv": "\t"}[fmt])
        w.writerow(["prompt", "response_length"])
        for i, c in enumerate(cells):
            w.writerow([f"p{i}", c] if i % 17 else [f"p{i}"])  # some short rows
        return buf.getvalue().encode("utf-8", "surrogatepass")
    if fmt == "jsonl":
        lines = [json.dumps({"response_length": as_json_value(c)}) for c in cells]
        lines[len(lines) // 2 :: 13] = ["{not json"] * len(lines[len(lines) // 2 :: 13])
        return ("\n".join(lines) + "\n").encode("utf-8", "surrogatepass")
    if fmt == "jsonl_nested":
        lines = [json.dumps({"meta": {"usage": {"tokens": as_json_value(c)}}}) for c in cells]
        return ("\n".join(lines) + "\n").encode("utf-8", "surrogatepass")
    if fmt == "json":
        return json.dumps([{"output_len": as_json_value(c)} for c in cells]).encode(
            "utf-8", "surrogatepass"
        )
    if fmt == "json_numbers":
        return json.dumps([as_json_value(c) for c in cells]).encode("utf-8", "surrogatepass")
    if fmt == "plain":
        return ("\n".join(c.replace("\n", " ") for c in cells) + "\n").encode(
            "utf-8", "surrogatepass"
        )
    buf = io.BytesIO()  # parquet: a string column (parsed per cell) or an integer one
    if all(re.fullmatch(r"\d{1,15}", c) for c in cells):
        col = pa.array([int(c) for c in cells], pa.int64())
    else:
        col = pa.array(
            [c.encode("utf-8", "surrogatepass").decode("utf-8", "replace") for c in cells]
        )
    pq.write_table(pa.table({"num_output_tokens": col}), buf)
    return buf.getvalue()


@st.composite
def inputs(draw, fmt: str, transform: str):
    cells = draw(cell_lists())
    data = build(fmt, cells)
    if transform == "bom":
        data = b"\xef\xbb\xbf" + data
    elif transform == "utf16":
        data = data.decode("utf-8", "replace").encode("utf-16")
    elif transform == "gzip":
        data = gzip.compress(data)
    elif transform == "gzip_truncated":
        data = gzip.compress(data)[: max(len(data) // 3, 12)]
    elif transform == "cut":
        data = data[: draw(st.integers(0, len(data)))]
    suffix = draw(st.sampled_from([SUFFIX[fmt], SUFFIX[fmt], ".dat"]))
    if transform.startswith("gzip") and draw(st.booleans()):
        suffix += ".gz"
    args = ["--bootstrap", str(draw(st.sampled_from([0, 0, 2])))]
    args += [
        "--families",
        ",".join(
            draw(st.lists(st.sampled_from(FAST_FAMILIES), min_size=1, max_size=3, unique=True))
        ),
    ]
    if draw(st.booleans()):
        args += ["--max-len", str(draw(st.integers(2, 4000)))]
    if draw(st.booleans()):
        args.append("--no-detect-cap")
    if draw(st.booleans()):
        args += ["--max-skipped", "1"]
    if fmt == "jsonl_nested" and draw(st.booleans()):
        args += ["--column", "meta.usage.tokens"]
    elif draw(st.integers(0, 9)) == 0:
        args += ["--column", "nope"]
    as_json = draw(st.booleans())
    if as_json:
        args.append("--json")
    return fmt, transform, cells, data, suffix, args, as_json


def _alarm(signum, frame):
    raise TimeoutError("aprilsim fit hung on a fuzzed input")


def test_fit_never_crashes_hangs_or_hides_dropped_rows(tmp_path_factory):
    seen: Counter[str] = Counter()
    old = signal.signal(signal.SIGALRM, _alarm)

    def check(case):
        fmt, transform, cells, data, suffix, args, as_json = case
        path = tmp_path_factory.mktemp("fuzz") / f"input{suffix}"
        path.write_bytes(data)
        signal.alarm(60)
        try:
            res = CliRunner().invoke(fit_command, [str(path), *args])
        finally:
            signal.alarm(0)
        out, err, code = res.stdout, res.stderr, res.exit_code
        for key in (f"format {fmt}", f"transform {transform}", f"exit {code}"):
            event(key)
            seen[key] += 1
        if any(c in ("18446744073709551615", "1e300", "1" + "0" * 400) for c in cells):
            seen["beyond 2^63"] += 1
        assert code in (0, 2), (code, err, repr(res.exception))
        assert "Traceback" not in out + err
        assert not CONTROL.search(out + err), (out, err)
        if code == 2:
            lines = err.splitlines()
            assert len(lines) == 1 and lines[0].startswith("aprilsim fit: error: "), err
            assert out == ""
            kind = re.sub(r"[\d,.]+", "N", lines[0].replace(str(path), "<file>"))[21:60]
            seen[f"error {kind}"] += 1  # the kinds of refusal reached (printed with -s)
            if "--max-skipped" in lines[0]:
                seen["refused: too many skipped"] += 1
            return
        if as_json:
            d = json.loads(out)
            n_skipped = sum(d["rows_skipped"].values())
            if "ranking" in d:
                assert d["rows_read"] == d["n"] + n_skipped  # every row used or counted
        else:
            first = out.splitlines()[0]
            counts = first.split("; skipped ")[1] if "; skipped " in first else ""
            n_skipped = sum(
                int(v.replace(",", "")) for v in re.findall(r"([\d,]+) [a-zA-Z/]", counts)
            )
        if n_skipped:
            event("rows skipped, exit 0")
            seen["rows skipped, exit 0"] += 1
            assert re.search(
                rf"aprilsim fit: (warning: )?skipped {n_skipped:,} of [\d,]+ rows", err
            ), err

    try:
        for fmt in FORMATS:  # every format under every transform, by construction
            for transform in TRANSFORMS:
                if fmt == "parquet" and transform in ("bom", "utf16"):
                    continue  # binary: no text encoding
                settings(
                    max_examples=EXAMPLES_PER_CASE,
                    deadline=None,
                    derandomize=True,
                    database=None,
                    suppress_health_check=list(HealthCheck),
                )(given(inputs(fmt, transform))(check))()
    finally:
        signal.signal(signal.SIGALRM, old)
    print(dict(seen))  # shown with -s
    # the examples reach what they are meant to test
    assert seen["exit 0"] >= 60 and seen["exit 2"] >= 30, seen
    assert seen["rows skipped, exit 0"] >= 20, seen
    assert seen["refused: too many skipped"] >= 5, seen
    assert seen["beyond 2^63"] >= 10, seen
