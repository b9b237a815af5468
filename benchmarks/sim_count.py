"""Instructions of one simulated run, counted by valgrind: a figure the machine's load cannot move.

    valgrind --tool=callgrind --collect-atstart=no --toggle-collect=builtin_eval \
        --callgrind-out-file=run.cg python benchmarks/sim_count.py cluster 4 [april]
    callgrind_annotate --inclusive=yes run.cg | head -60     # where they go

A tiny warm-up run first (lazy imports, first-call caches), then the measured `simulate` call
inside `eval`, so that callgrind counts exactly it (`builtin_eval`): the "I refs" valgrind prints
are the run's instructions. Scenarios: `cluster` and `tight` (benchmarks/sim_speed.py's cluster
and tight-KV cluster) for N steps. Run it in two trees (or with `APRILSIM_PURE=1` on a compiled
install) and compare the counts; timings on these shared machines move by 30 % run to run.
"""

from __future__ import annotations

import copy
import sys
import time
from pathlib import Path

import scipy.special  # noqa: F401  (imported before the measured call, as in any later run)
import scipy.stats  # noqa: F401

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_speed import CLUSTER, TIGHT_CLUSTER  # noqa: E402

from aprilsim.config import scenario_from_dict  # noqa: E402
from aprilsim.sim.run import simulate  # noqa: E402


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[1] not in ("cluster", "tight"):
        sys.exit("usage: python benchmarks/sim_count.py cluster|tight STEPS [SCHEDULER]")
    which, steps = sys.argv[1], int(sys.argv[2])
    sched = sys.argv[3] if len(sys.argv) > 3 else "april"
    spec = copy.deepcopy(CLUSTER if which == "cluster" else TIGHT_CLUSTER)
    warm = copy.deepcopy(spec)
    warm.update(steps=2, batch_size=8)
    warm["cluster"]["engines"] = 2
    simulate(scenario_from_dict(warm), sched)
    spec["steps"] = steps
    scenario = scenario_from_dict(spec)
    t = time.process_time()
    # the call callgrind counts (--toggle-collect=builtin_eval)
    run = eval("simulate(sc, name)", {"simulate": simulate}, {"sc": scenario, "name": sched})
    cpu = time.process_time() - t
    trained = run.summary()["trained_samples"]
    print(f"{which} {sched} {steps} steps: {trained} trained samples, {cpu:.2f} s CPU")


if __name__ == "__main__":
    main()
