"""Replay golden engine traces through aprilsim's model of the engine and print the figures.

    python experiments/replay_engine_traces.py [DIR]   (default tests/data/engine_traces/vllm-0.32)

Prints, as Markdown: workloads, engine steps, workloads that preempt, agreement (steps whose
scheduled requests, tokens, preemptions, admissions with their prefix hits, finishes and free KV
equal the recording), the recording's wall time, the replay's CPU time and the data's size, and
what the set reaches. Exits 1 if any step differs. Needs no engine installed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from aprilsim.engine.families.traces import reach, read_traces, trace_files  # noqa: E402
from aprilsim.engine.families.vllm_replay import replay_trace  # noqa: E402

REPLAYERS = {"vllm": replay_trace}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    folder = Path(args[0]) if args else ROOT / "tests" / "data" / "engine_traces" / "vllm-0.32"
    files = trace_files(folder)
    if not files:
        print(f"replay_engine_traces: no *.jsonl.xz trace files in {folder}", file=sys.stderr)
        return 2
    n = pre = steps = matched = 0
    record_s = replay_s = 0.0
    sums: dict[str, int] = {}
    bad: list[str] = []
    for path in files:
        for trace in read_traces(path):
            t0 = time.process_time()
            got = REPLAYERS[trace.family](trace)
            replay_s += time.process_time() - t0
            r = reach(trace)
            n, pre = n + 1, pre + (r["preemptions"] > 0)
            steps, matched = steps + got.steps, matched + got.matched
            record_s += trace.summary.get("record_s", 0.0)
            for k, v in r.items():
                sums[k] = max(sums.get(k, 0), v) if k == "max_batch" else sums.get(k, 0) + v
            if not got.exact:
                bad.append(f"{trace.workload.name}: {got.divergence}")
    size = sum(p.stat().st_size for p in files)
    print(f"| workloads | steps | preempting | agreement | recorded (wall) | replayed (CPU) "
          f"| data |\n|---|---|---|---|---|---|---|\n| {n} | {steps:,} | {pre} "
          f"| {100 * matched / max(steps, 1):.3f} % ({matched:,} steps) | {record_s:,.0f} s "
          f"| {replay_s:.1f} s | {size / 1e6:.2f} MB |")
    print("\nreach: " + ", ".join(f"{k} {v:,}" for k, v in sums.items()))
    for line in bad[:10]:
        print(line, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
