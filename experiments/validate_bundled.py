"""Validate the simulator against the bundled engine on CPU and write docs/validation.md.

Runs `aprilsim validate`'s pipeline (real/validate.py) on in-process bundled engines (one by
default: two in-process engines share one interpreter lock, which makes APRIL's live figures vary
from run to run; docs/validation.md) with the
default scenario scaled to max_response_len 64: sync, APRIL at ratios 2 and 1.5, and
async_one_step, each live (replay) and simulated with the cost fitted on the live iteration logs.
Rewrites the results part of docs/validation.md (between the `<!-- results -->` markers; the
method above them is kept) and docs/img/validation_*.png.

    python experiments/validate_bundled.py [--steps 5] [--seed 0] [--local 1]
"""

from __future__ import annotations

import argparse
import platform
import shutil
import time
from pathlib import Path

from aprilsim.cli import with_overrides
from aprilsim.config import load_scenario
from real.runner.cli import local_scale
from real.validate import validate, write_all

ROOT = Path(__file__).resolve().parents[1]
SPECS = ["sync", "april", "april@ratio=1.5", "async_one_step"]
BEGIN, END = "<!-- results -->", "<!-- /results -->"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--local", type=int, default=1, help="in-process bundled engines (default 1)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs")
    args = ap.parse_args()
    sc = with_overrides(load_scenario(None), steps=args.steps, warmup=None)
    opts = dict(local=args.local, engines=None, router=None, vocab_size=None, seed=args.seed,
                steps=args.steps, calibration=None, scale=local_scale(sc.max_response_len))
    t0 = time.monotonic()
    v = validate(sc, SPECS, opts, lambda name, d, t: print(f"{name}: step {d}/{t}", flush=True))
    tmp = Path("/tmp/aprilsim_validation")
    rep = write_all(v, tmp)
    wall = time.monotonic() - t0
    img = args.out / "img"
    img.mkdir(parents=True, exist_ok=True)
    text = (tmp / "report.md").read_text()
    for f in sorted(tmp.glob("*.png")):
        dst = f"validation_{f.name}"
        shutil.copy(f, img / dst)
        text = text.replace(f"]({f.name})", f"](img/{dst})")
    body = text.split("\n", 1)[1]  # drop the report's own title
    machine = f"{platform.machine()}; {wall:.0f}s wall in all"
    results = (f"{BEGIN}\n## Results\n\nMeasured by `python experiments/validate_bundled.py` "
               f"({machine}).\n" + body.replace("\n## ", "\n### ") + f"\n{END}")
    doc = args.out / "validation.md"
    old = doc.read_text() if doc.exists() else f"# Validation\n\n{BEGIN}\n{END}\n"
    if BEGIN not in old or END not in old:
        old = old.rstrip() + f"\n\n{BEGIN}\n{END}\n"
    pre, rest = old.split(BEGIN, 1)
    doc.write_text(pre + results + rest.split(END, 1)[1])
    print(f"wrote {args.out / 'validation.md'}; targets: "
          + ", ".join(f"{k} {'met' if x['met'] else 'missed'}" for k, x in rep["targets"].items()))


if __name__ == "__main__":
    main()
