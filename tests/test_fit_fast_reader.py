"""The readers' bulk path (`fast_rows`, issue 23 item 4) reads every file as the row-by-row path.

Clean blocks of a CSV/TSV/plain file are parsed in bulk; a block with anything unusual (quotes,
blank or short rows, junk cells, CR line ends, NULs) goes row by row. Hypothesis writes files
mixing clean rows with such rows at drawn places, and each is read twice, with the bulk path on
and forced off: the histogram, the rows read and every skip count and example must be equal.
The reach (bulk blocks taken, fallbacks, kinds of junk) is counted and asserted.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from aprilsim.workload.fitting import fast_rows, read_lengths
from aprilsim.workload.fitting import readers as readers_module

JUNK = {
    "blank": "",
    "spaces": "   ",
    "word": "abc",
    "nan": "nan",
    "inf": "inf",
    "huge": "1e999",
    "negative": "-5",
    "zero": "0",
    "fraction": "12.5",
    "thousands": '"1,234"',
    "quoted": '"77"',
    "padded": " 42 ",
    "exponent": "3e2",
    "underscore": "1_000",
    "nul": "4\x00",
}
SEEN: Counter[str] = Counter()


def read_both(tmp_path, name: str, text: str, monkeypatch):
    path = tmp_path / name
    path.write_bytes(text.encode())
    calls = {"bulk": 0, "fallback": 0}
    real = fast_rows.delimited_lengths
    real_plain = fast_rows.plain_lengths

    def counted(fn):
        def inner(*a):
            x = fn(*a)
            calls["bulk" if x is not None else "fallback"] += 1
            return x

        return inner

    monkeypatch.setattr(readers_module, "delimited_lengths", counted(real))
    monkeypatch.setattr(readers_module, "plain_lengths", counted(real_plain))
    fast = read_lengths(path)
    monkeypatch.setattr(readers_module, "delimited_lengths", lambda *a: None)
    monkeypatch.setattr(readers_module, "plain_lengths", lambda *a: None)
    slow = read_lengths(path)
    monkeypatch.undo()
    return fast, slow, calls


def same(fast, slow) -> None:
    np.testing.assert_array_equal(fast.histogram.values, slow.histogram.values)
    np.testing.assert_array_equal(fast.histogram.counts, slow.histogram.counts)
    assert fast.rows_read == slow.rows_read
    assert fast.skipped == slow.skipped
    assert fast.skip_examples == slow.skip_examples
    assert fast.column == slow.column


@st.composite
def files(draw):
    n = draw(st.integers(1, 3000))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    lengths = np.ceil(rng.lognormal(5, 1, n)).astype(int).astype(str).tolist()
    junk = draw(st.lists(st.tuples(st.integers(0, n - 1), st.sampled_from(sorted(JUNK))),
                         max_size=4))
    fmt = draw(st.sampled_from(["csv1", "csv3", "tsv", "plain"]))
    crlf = draw(st.booleans())
    return fmt, lengths, junk, crlf


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(files())
def test_bulk_and_row_by_row_reads_agree(tmp_path_factory, monkeypatch, spec):
    fmt, lengths, junk, crlf = spec
    cells = list(lengths)
    for pos, kind in junk:
        cells[pos] = JUNK[kind]
        event(f"junk: {kind}")
        SEEN[f"junk:{kind}"] += 1
    if fmt == "csv1":
        name, rows = "x.csv", ["response_length", *cells]
    elif fmt == "csv3":
        name, rows = "x.csv", ["id,response_length,prompt_len"]
        rows += [f"{i},{c},{i % 7}" for i, c in enumerate(cells)]
    elif fmt == "tsv":
        name, rows = "x.tsv", ["id\tresponse_length"] + [f"{i}\t{c}" for i, c in enumerate(cells)]
    else:
        name, rows = "x.txt", cells
    nl = "\r\n" if crlf else "\n"
    tmp = tmp_path_factory.mktemp("f")
    fast, slow, calls = read_both(tmp, name, nl.join(rows) + nl, monkeypatch)
    same(fast, slow)
    kind = ("bulk" if calls["bulk"] and not calls["fallback"]
            else "fallback" if calls["fallback"] else "none")
    event(f"path: {kind}")
    SEEN[f"path:{kind}"] += 1
    SEEN[f"format:{fmt}"] += 1


def test_the_property_reached_both_paths_and_every_junk_kind(tmp_path_factory, monkeypatch):
    if not SEEN:  # run on its own (-k, another order): run the property first
        test_bulk_and_row_by_row_reads_agree(tmp_path_factory=tmp_path_factory,
                                             monkeypatch=monkeypatch)
    assert SEEN["path:bulk"] >= 5 and SEEN["path:fallback"] >= 5, SEEN
    assert sum(v for k, v in SEEN.items() if k.startswith("junk:")) >= 30, SEEN
    assert sum(1 for k in SEEN if k.startswith("junk:")) >= 10, SEEN
    assert all(SEEN[f"format:{f}"] for f in ("csv1", "csv3", "tsv", "plain")), SEEN


def test_a_large_clean_file_takes_the_bulk_path(tmp_path, monkeypatch):
    x = np.random.default_rng(0).integers(1, 5000, 100_000)
    text = "response_length\n" + "\n".join(map(str, x.tolist())) + "\n"
    fast, slow, calls = read_both(tmp_path, "big.csv", text, monkeypatch)
    same(fast, slow)
    assert calls == {"bulk": calls["bulk"], "fallback": 0} and calls["bulk"] >= 1
    assert fast.n == 100_000


BIG = st.one_of(
    st.integers(1, 10**6),
    st.integers(10**17, 10**25),
    st.integers(-(10**25), 0),
    st.sampled_from([10**400, -(10**400), 2**53 + 1, 2**63, 2**64 + 7]),
    st.just("5" * 5000),  # beyond Python's int-conversion limit: the hook's digit string
    st.floats(allow_nan=False, allow_infinity=False, width=32),
)


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(st.lists(BIG, min_size=2, max_size=40), st.booleans())
def test_jsonl_plain_parser_first_reads_as_the_long_integer_hook(
    tmp_path_factory, monkeypatch, values, nested
):
    """JSONL lines go to the plain json parser first; only a line it refuses goes through the
    long-integer hook (`numbers.json_int`). Reading with the hook alone must give the same."""
    import json
    import types

    from aprilsim.workload.fitting import json_records
    from aprilsim.workload.fitting.numbers import json_int

    def cell(v):
        return v if isinstance(v, str) else json.dumps(v)

    lines = [
        f'{{"id": {i}, "usage": {{"completion_tokens": {cell(v)}}}}}'
        if nested
        else f'{{"response_length": {cell(v)}, "ids": [{i}, {10**20}]}}'
        for i, v in enumerate([7, 9, *values])  # two good rows: the file always has lengths
    ]
    path = tmp_path_factory.mktemp("j") / "x.jsonl"
    path.write_text("\n".join(lines) + "\n")
    fast = read_lengths(path)
    hook_only = types.SimpleNamespace(
        loads=lambda text, **kw: json.loads(text, parse_int=json_int),
        JSONDecodeError=json.JSONDecodeError,
    )
    monkeypatch.setattr(json_records, "json", hook_only)
    slow = read_lengths(path)
    monkeypatch.undo()
    same(fast, slow)
    event(f"skipped: {sorted(fast.skipped)}")
