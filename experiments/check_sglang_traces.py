"""Replay the golden SGLang traces through aprilsim and report step-by-step agreement (issue 34).

    python experiments/check_sglang_traces.py [TRACE_FILE] [--write-expected] [--limit N]

Prints one line per workload that disagrees (its first differing step), then the figures:
workloads, recorded steps, retracting workloads, equal steps (%), and what the traces reach.
`--write-expected` stores each workload's agreement in `expected.json` beside the trace file,
which `tests/test_engine_traces_sglang.py` holds aprilsim to. Needs no SGLang install.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from aprilsim.engine.families.sglang_replay import compare, load  # noqa: E402

TRACE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "data",
                     "engine_traces", "sglang-0.5.23", "traces.jsonl.gz")


def main(argv: list[str] | None = None) -> int:
    """Replay every workload of the trace file and print the agreement figures."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace_file", nargs="?", default=TRACE)
    ap.add_argument("--write-expected", action="store_true")
    ap.add_argument("--limit", type=int, default=0)
    a = ap.parse_args(argv)
    if not os.path.exists(a.trace_file):
        print(f"error: no trace file {a.trace_file}", file=sys.stderr)
        return 2
    t0 = time.process_time()
    expected: dict[str, list[int]] = {}
    tot = eq = retracting = 0
    reach = {"retractions": 0, "chunked_steps": 0, "aborts": 0, "ratio_decays": 0,
             "extend_steps": 0, "decode_steps": 0}
    by_chunk: dict[bool, list[int]] = {False: [0, 0, 0], True: [0, 0, 0]}  # workloads, steps, eq
    kinds: dict[str, int] = {}
    for i, w in enumerate(load(a.trace_file)):
        if a.limit and i >= a.limit:
            break
        ag = compare(w)
        expected[ag.wid] = [ag.steps, ag.equal]
        tot += ag.steps
        eq += ag.equal
        retracting += w["counts"]["retractions"] > 0
        for k in reach:
            reach[k] += w["counts"][k]
        c = by_chunk[w["config"]["chunked_prefill_size"] > 0]
        c[0], c[1], c[2] = c[0] + 1, c[1] + ag.steps, c[2] + ag.equal
        if not ag.ok:
            kinds[ag.first_kind] = kinds.get(ag.first_kind, 0) + 1
            print(f"{ag.wid}: {ag.equal}/{ag.steps} equal; first: {ag.first_diff[:300]}")
    n = len(expected)
    agree = sum(s == e for s, e in expected.values())
    print(f"workloads {n} (retracting {retracting}), recorded steps {tot:,}, "
          f"equal {eq:,} ({100 * eq / max(tot, 1):.3f} %), workloads equal throughout {agree}")
    for chunked, (nw, st, e) in by_chunk.items():
        print(f"  chunked prefill {'on ' if chunked else 'off'}: {nw} workloads, {st:,} steps, "
              f"{100 * e / max(st, 1):.3f} % equal")
    print("first differences:", kinds)
    print("reach:", ", ".join(f"{k} {v:,}" for k, v in reach.items()))
    print(f"replay cpu {time.process_time() - t0:.1f} s")
    if a.write_expected:
        path = os.path.join(os.path.dirname(a.trace_file), "expected.json")
        with open(path, "w") as f:
            json.dump(expected, f, indent=0, sort_keys=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
