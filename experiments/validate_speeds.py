r"""Do engines of unequal speed explain APRIL's engine-time error on several live engines?

    python experiments/validate_speeds.py RUN.pkl \
        [--scenario experiments/scenarios/validate_live.toml]

Reads live runs saved by ``experiments/validate_bundled.py --serve N --save RUN.pkl`` (or
``validate_vllm.py --save``). Fits one cost on all the runs' rows (a diagnosis, not a
prediction: every run is in the fit), measures each run's per-engine speed (its logged step
intervals over the same steps priced by that cost), and simulates every run twice: with equal
engines, as ``aprilsim validate`` does, and with each engine slowed by its measured factor
(``[cluster] engine_slowdown``). Prints, per scheduler, the median per-step engine-time error
(the busiest engine's simulated time against its logged iterations priced by the cost, both in
the cost's seconds) both ways, and how the work split between the engines follows their speeds.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def engine_speeds(o, cost, share) -> list[float]:
    """Per engine, logged step intervals / the cost's price of the same steps (1: as fitted)."""
    from aprilsim.validate.costfit import interval
    from aprilsim.validate.pricing import price
    from real.validate import steady_rows

    out = []
    for rows, sh in zip(steady_rows(o), share, strict=True):
        live = priced = 0.0
        prev = None
        for r in rows:
            if r["phase"] in ("decode", "prefill"):
                live += interval(prev, r)
                priced += price(cost, prev, r, sh)
            prev = r
        out.append(live / priced if priced > 0 else 1.0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=Path)
    ap.add_argument("--scenario", type=Path,
                    default=ROOT / "experiments" / "scenarios" / "validate_live.toml")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from aprilsim.config import load_scenario, with_overrides
    from aprilsim.validate.costfit import fit_iterations
    from aprilsim.validate.pricing import per_step
    from aprilsim.validate.scaled import matched_engine, simulate_matched
    from real.runner.options import local_scale
    from real.validate import computed_shares, fit_rows, load_live

    live, limits, what, _, _ = load_live(args.runs)
    sc = with_overrides(load_scenario(args.scenario), steps=args.steps, warmup=None)
    scale = local_scale(sc.max_response_len) if "scale" not in limits else limits["scale"]
    fit = fit_iterations([e for o in live for e in fit_rows(o)])
    cost = fit.effective
    engine = matched_engine(cost, **{k: v for k, v in limits.items() if k != "scale"})
    print(f"{len(live)} runs on {what}; one cost fitted on all of them (a diagnosis): {cost}")
    by: dict[str, dict[str, list[float]]] = {}
    for o in live:
        if len(o.rows) < 2:
            continue
        shares = computed_shares(o)
        f = engine_speeds(o, cost, shares)
        priced = per_step(o.result, o.rows, cost, shares)
        warm = o.result.warmup_steps
        res = {}
        for name, slow in (("equal", None), ("measured", f)):
            sim = simulate_matched(sc, o.label, engine, n_engines=len(o.rows), scale=scale,
                                   seed=args.seed, steps=len(o.result.steps), slowdown=slow)
            busiest = [max(b / (slow[i] if slow else 1.0) for i, b in enumerate(s.busy_by_engine_s))
                       for s in sim.steps]
            errs = [abs(b / p - 1) for b, p in list(zip(busiest, priced))[warm:] if p > 0]
            res[name] = median(errs) if errs else math.nan
        d = by.setdefault(o.label, {"equal": [], "measured": [], "ratio": []})
        d["equal"].append(res["equal"])
        d["measured"].append(res["measured"])
        d["ratio"].append(max(f) / min(f))
    print("| scheduler | runs | engine speed ratio (slow/fast, median) | "
          "engine-time error, equal engines | with the measured speeds |")
    print("|---|---|---|---|---|")
    for lab, d in by.items():
        print(f"| {lab} | {len(d['equal'])} | {median(d['ratio']):.2f}x | "
              f"{100 * median(d['equal']):.1f} % | "
              f"{100 * median(d['measured']):.1f} % |")


if __name__ == "__main__":
    main()
