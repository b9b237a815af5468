r"""Where a bundled-server validation's engine-time error comes from, from saved live runs.

Reads the live runs that ``experiments/validate_bundled.py --serve N --save FILE`` pickled and
judges them again at this tree, then prints, per scheduler:

- the load drift: per round, the busiest engine's logged step intervals over the same steps
  priced by the fitted cost (1.0: the machine as fast as when the cost was fitted);
- the split of the work between the engines: each step's priced time of the busier and the
  other engine, live (mean over rounds) and simulated, and their ratio;
- the share of samples whose every send went to the engine the simulation sent it to;
- per round, the engine-time (priced) error and the live generated tokens per step.

``--dump-sim OUT`` (run with ``PYTHONPATH`` at another tree, e.g. ``git archive REV | tar -x -C
DIR``; the scenario, cost and limits come from ``--sim-input``, which a run at this tree writes
with ``--write-sim-input``) simulates every scheduler there; ``--old-sim OUT`` then prices the
same live runs against those simulated busy times, so two simulator versions are compared on
identical live data:

    python experiments/validate_causes.py --load RUN.pkl --write-sim-input in.json
    (cd DIR && PYTHONPATH=DIR python ROOT/experiments/validate_causes.py \
        --sim-input in.json --dump-sim old.json)
    python experiments/validate_causes.py --load RUN.pkl --old-sim old.json
"""

from __future__ import annotations

import argparse
import inspect
import json
from dataclasses import replace
from pathlib import Path
from statistics import mean, median

SPECS = ["sync", "april", "april@ratio=1.5", "async_one_step"]
SCENARIO = "experiments/scenarios/validate_live.toml"


def scenario(steps: int):
    from aprilsim.config import load_scenario, with_overrides

    return with_overrides(load_scenario(SCENARIO), steps=steps, warmup=None)


def dump_sim(inp: Path, out: Path) -> None:
    """Simulate every scheduler with the given cost and limits at whatever tree is imported."""
    from aprilsim.engine.cost import CostModel
    from aprilsim.validate.scaled import matched_engine, simulate_matched

    d = json.loads(inp.read_text())
    ok = inspect.signature(matched_engine).parameters
    eng = matched_engine(CostModel(**d["cost"]),
                         **{k: v for k, v in d["limits"].items() if k in ok})
    res = {}
    for spec in SPECS:
        r = simulate_matched(scenario(d["steps"]), spec, eng, n_engines=d["n_engines"],
                             scale=d["scale"], seed=d["seed"], steps=d["steps"])
        res[spec] = {"rollout": [s.rollout_time_s for s in r.steps],
                     "busy": [list(s.busy_by_engine_s) for s in r.steps]}
    out.write_text(json.dumps(res))


def engine_times(o, cost, i: int) -> list[float]:
    """Each engine's priced time inside step i's rollout window of live run o."""
    from aprilsim.validate.pricing import price

    s = o.result.steps[i]
    lo, hi = s.rollout_start_s, s.rollout_start_s + s.rollout_time_s
    out = []
    for rows in o.rows:
        prev, t = None, 0.0
        for r in rows:
            if r["phase"] in ("decode", "prefill") and lo < r["t_run"] <= hi:
                t += price(cost, prev, r)
            prev = r
        out.append(t)
    return out


def sends_by_sample(trace) -> dict[int, list[int]]:
    """Each sample's engines, one per send (submission order)."""
    out: dict[int, list[int]] = {}
    for r in sorted(trace.requests, key=lambda r: (r.submit_s, r.rid)):
        out.setdefault(r.sample_uid, []).append(r.engine)
    return out


def same_engines(sim_trace, live_trace) -> float:
    """Share of the samples both runs sent whose every send went to the same engine."""
    a, b = sends_by_sample(sim_trace), sends_by_sample(live_trace)
    keys = [k for k in a if k in b]
    return sum(a[k] == b[k] for k in keys) / len(keys) if keys else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--load", type=Path, help="live runs saved by validate_bundled.py --save")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--write-sim-input", type=Path)
    ap.add_argument("--sim-input", type=Path)
    ap.add_argument("--dump-sim", type=Path)
    ap.add_argument("--old-sim", type=Path)
    args = ap.parse_args()
    if args.dump_sim:
        dump_sim(args.sim_input, args.dump_sim)
        return
    from aprilsim.validate.compare import compare_runs
    from aprilsim.validate.pricing import per_step
    from aprilsim.validate.rounds import pooled
    from real.runner.options import EngineTarget, local_scale
    from real.validate import ValidateOptions, judge, load_live

    sc = scenario(args.steps)
    scale = local_scale(sc.max_response_len)
    live, limits, what, checks, t_live = load_live(args.load)
    opts = ValidateOptions(EngineTarget(engines=("saved",)), seed=args.seed, steps=args.steps,
                           repeats=args.repeats, scale=scale)
    v = judge(sc, SPECS, opts, live, limits, what, checks, t_live)
    cost = v.fit.effective
    if args.write_sim_input:
        args.write_sim_input.write_text(json.dumps(
            {"cost": {k: getattr(cost, k) for k in ("a", "b", "c", "p0", "p1", "p2", "pr")},
             "limits": v.limits, "n_engines": len(v.live[0].rows), "scale": scale,
             "seed": args.seed,
             "steps": len(v.live[0].result.steps)}))
    drift: dict[str, list[float]] = {}
    for o in v.calibration_runs + v.live:
        key = "calibration" if o in v.calibration_runs else f"round {o.round}"
        lg, pr = per_step(o.result, o.rows)[1:], per_step(o.result, o.rows, cost)[1:]
        drift.setdefault(key, []).append(sum(lg) / sum(pr))
    print("logged / priced step time:", {k: round(mean(x), 2) for k, x in drift.items()})
    for lab in SPECS:
        runs = [o for o in v.live if o.label == lab]
        sim = v.sim[lab]
        steps = range(sim.warmup_steps, len(sim.steps))
        s_hi = mean(max(sim.steps[i].busy_by_engine_s) for i in steps)
        s_lo = mean(min(sim.steps[i].busy_by_engine_s) for i in steps)
        per = [engine_times(o, cost, i) for i in steps for o in runs]
        l_hi, l_lo = mean(max(p) for p in per), mean(min(p) for p in per)
        print(f"{lab}: engine time per step (s), busier / other: simulated {s_hi:.3f} / {s_lo:.3f} "
              f"(x{s_hi / s_lo:.2f}), live {l_hi:.3f} / {l_lo:.3f} (x{l_hi / l_lo:.2f}); "
              "both engines "
              f"{l_hi + l_lo:.3f} live vs {s_hi + s_lo:.3f} simulated")
        same = [same_engines(v.sim_traces[lab], o.trace) for o in runs]
        print(f"  samples whose sends all went to the simulated engine: {100 * min(same):.0f}-"
              f"{100 * max(same):.0f}% over the rounds (router {sc.cluster.router})")
        for o in runs:
            c = compare_runs(o.label, sim, o.result, per_step(o.result, o.rows),
                             per_step(o.result, o.rows, cost))
            print(f"  round {o.round}: engine-time error "
                  f"{100 * median(abs(e) for e in c.priced_errors):.1f}% "
                  f"(per step {', '.join(f'{100 * e:+.1f}%' for e in c.priced_errors)}); "
                  "generated tokens "
                  f"{[s.generated_tokens for s in o.result.steps[sim.warmup_steps:]]} "
                  f"(simulated {[s.generated_tokens for s in sim.steps[sim.warmup_steps:]]})")
    if args.old_sim:
        old = json.loads(args.old_sim.read_text())
        for name, sims in (("this tree", None), (str(args.old_sim), old)):
            rounds = []
            for rnd in v.rounds:
                rows = []
                for o in rnd:
                    c = compare_runs(o.label, v.sim[o.label], o.result, per_step(o.result, o.rows),
                                     per_step(o.result, o.rows, cost))
                    if sims is not None:
                        n = len(c.pred_busy_s)
                        c = replace(c, pred_busy_s=[max(b) for b in sims[o.label]["busy"]][:n],
                                    pred_rollout_s=sims[o.label]["rollout"][:n])
                    rows.append(c)
                rounds.append(rows)
            p = pooled(rounds)
            print(f"simulator of {name}: engine-time error",
                  {lab: f"{100 * s['step_priced_median_abs']:.1f}%"
                   for lab, s in p["schedulers"].items()},
                  "engine-time gain error (pp)",
                  {lab: round(g["diff_priced_pp"]["mean"], 1) for lab, g in p["gains"].items()})


if __name__ == "__main__":
    main()
