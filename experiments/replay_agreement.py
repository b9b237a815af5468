"""Engine-level vs scenario-level agreement with a fixed list (docs/replay.md).

A "logged run" is aprilsim's own simulation of a scenario (the default APRIL-paper setup, fewer
steps) with its cost taken as the truth; its per-step rollout times are what the run "logged".
We then predict those times two ways, with the same (true) cost:

- **replay** the exact list: `lengths = { replay = log.csv }`, the run's own groups in order;
- **sample** a length model fitted to the same log (`aprilsim fit`, best family by BIC, and the
  empirical resampler), over several seeds: the scenario-level prediction a user without replay
  makes.

Printed: per-step and mean rollout-time errors against the logged times, for each. Replay's
error is the engine-level agreement (the same requests, the same order: zero to float precision
when the log keeps the run's order, as a table does); sampling's spread is what a distribution
costs. Run: `PYTHONPATH=. python experiments/replay_agreement.py [--steps 8 --seeds 10]`.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from aprilsim.config import default_scenario, scenario_from_dict
from aprilsim.sim.run import simulate
from aprilsim.validate.synth_log import synthesize, write_table


def _errors(pred: list[float], meas: list[float], warm: int) -> list[float]:
    return [(p - m) / m for p, m in list(zip(pred, meas))[warm:]]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--scheduler", default="sync")
    args = ap.parse_args()
    base = default_scenario()
    data = base.model_dump(exclude={"base_dir"})
    data.update(steps=args.steps, warmup_steps=1)
    sc = scenario_from_dict(data)
    logged = synthesize(sc, args.scheduler, noise=0.0)
    meas = logged.rollout_s
    warm = sc.warmup_steps
    tmp = Path(tempfile.mkdtemp(prefix="replay-agreement-"))
    write_table(logged, tmp / "log.csv")

    def run_with(lengths: dict, seed: int | None = None) -> list[float]:
        d = dict(data, lengths=lengths)
        if seed is not None:
            d["seed"] = seed
        r = simulate(scenario_from_dict(d, tmp), args.scheduler)
        return [s.rollout_time_s for s in r.steps]

    print(f"logged run: {args.scheduler}, {sc.cluster.engines} engines, {sc.batch_size} x "
          f"{sc.group_size}, max {sc.max_response_len}, {args.steps} steps "
          f"(warm-up {warm} left out)")
    # the run's draw order (slime's group_index), with the never-trained prompts run to the cap
    # or left out; the trained order
    for order, unlogged in (("prompt", "cap"), ("prompt", "draw"), ("prompt", "skip"),
                            ("step", "skip")):
        rep = _errors(run_with({"replay": "log.csv", "order": order, "unlogged": unlogged}),
                      meas, warm)
        print(f"replay (exact list, {order} order, unlogged {unlogged}): per-step error "
              f"{min(rep):+.2%} .. "
              f"{max(rep):+.2%}, median |error| {statistics.median(abs(e) for e in rep):.2%}, "
              f"mean rollout {statistics.mean(rep):+.2%}")

    from aprilsim.workload.fitting.api import fit_log

    fit = fit_log(tmp / "log.csv", column="response_length", group_column="prompt_id",
                  step_column="none", max_len=sc.max_response_len, n_bootstrap=0)
    fit.write_model(tmp / "model.toml")
    values = [float(x) for g in logged.steps for grp in g for x in grp.lengths]
    for label, lengths in (("fitted (aprilsim fit)", {"from": "model.toml"}),
                           ("empirical resample", {"family": "empirical", "values": values})):
        mean_err, step_abs = [], []
        for seed in range(args.seeds):
            e = _errors(run_with(lengths, seed), meas, warm)
            mean_err.append(statistics.mean(e))
            step_abs.append(statistics.median(abs(x) for x in e))
        print(f"{label}: over {args.seeds} seeds, mean rollout-time error {min(mean_err):+.1%} .. "
              f"{max(mean_err):+.1%} (mean {statistics.mean(mean_err):+.1%}), "
              "median per-step |error| "
              f"{statistics.median(step_abs):.1%} ({min(step_abs):.1%} .. {max(step_abs):.1%})")


if __name__ == "__main__":
    main()
