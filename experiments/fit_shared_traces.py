"""Fit the shared real length data and write the figures and tables of docs/fitting.md.

    python experiments/fit_shared_traces.py [--data DIR] [--out docs/img]

For each serving trace: `aprilsim fit` with cap detection (mooncake also with --max-len 2000, the
acceptance command), the ranked table, and docs/img/fit_<name>.png. For each RL mean-length
curve: the drift fit and its figure. Tables go to stdout (markdown-ready text blocks).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from aprilsim.workload.fitting.api import fit_log

ROOT = Path(__file__).resolve().parents[1]
TRACES = ["mooncake_conversation_trace.jsonl", "azure2023_conv.csv", "azure2023_code.csv"]
CURVES = ["dapo_mean_response_length_digitized.csv", "deepseek_r1_zero_avg_length_digitized.csv"]


def data_dir() -> Path:
    env = os.environ.get("APRILSIM_SHARED_DATA")
    return (Path(env) if env else ROOT.parent / "shared" / "data") / "lengths"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=data_dir())
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name in TRACES + CURVES:
        stem = name.split(".")[0]
        rep = fit_log(args.data / name, n_bootstrap=200, random_state=0)
        rep.data.source = name  # relative name in tables and figure titles
        png = args.out / f"fit_{stem}.png"
        rep.plot(png)
        print(f"### {name}\n\n```\n{rep.table()}\n```\n\n![{stem}](img/{png.name})\n")


if __name__ == "__main__":
    main()
