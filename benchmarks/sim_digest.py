"""A digest of simulated runs, to check that a speed change is byte-identical.

    python benchmarks/sim_digest.py          # prints one hash per run, then ALL <hash>

Hashes every run's summary, end state and step records: the cluster and tight-KV scenarios of
`sim_speed.py` and its reference check (4 steps each) under april, sync and fully_async, the
default scenario's compare list, and the default at 150,000 KV tokens per engine (SGLang's rules
where KV binds). Run it before and after a change, on the pure and the compiled build
(`APRILSIM_PURE=1` on a compiled install): the ALL line must not move. The speed sessions
recorded `ALL a9547757bd01a4e4` (docs/development.md); SGLang's rule fixes and per-pass chunked
prefill (issue 34) moved it on purpose to `ALL 97fb9d928eea8882`.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_speed import CLUSTER, REFERENCE, TIGHT_CLUSTER  # noqa: E402

from aprilsim.config import load_scenario, scenario_from_dict  # noqa: E402
from aprilsim.sim.run import simulate  # noqa: E402


def digest(run) -> str:
    """Twelve hex digits of sha256 over the run's summary, end state and step records."""
    h = hashlib.sha256()
    h.update(repr(run.summary()).encode())
    h.update(repr(run.end_state).encode())
    for s in run.steps:
        h.update(repr(dataclasses.asdict(s) if dataclasses.is_dataclass(s) else s).encode())
    return h.hexdigest()[:12]


def main() -> None:
    out = []
    for name, spec in (("cluster", CLUSTER), ("tight", TIGHT_CLUSTER), ("ref", REFERENCE)):
        sp = copy.deepcopy(spec)
        sp["steps"] = 4
        sc = scenario_from_dict(sp)
        for sched in ("april", "sync", "fully_async"):
            out.append((name, sched, digest(simulate(sc, sched))))
    # the default at 10 steps, 1 left out (what it was when the digests were taken): the digest
    # measures the simulator, not the default's run length
    sc = load_scenario(None).model_copy(update={"steps": 10, "warmup_steps": 1})
    for sched in sc.compare:
        out.append(("default", sched, digest(simulate(sc, sched))))
    kv = sc.model_copy(update={"cluster": sc.cluster.model_copy(update={"kv_capacity": 150_000})})
    for sched in ("april", "sync"):
        out.append(("default150k", sched, digest(simulate(kv, sched))))
    for row in out:
        print(*row)
    print("ALL", hashlib.sha256(repr(out).encode()).hexdigest()[:16])


if __name__ == "__main__":
    main()
