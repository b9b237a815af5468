"""What a scenario's rollouts reach on each engine: the live calibration sweep's extent."""

from __future__ import annotations

import math


def scenario_reach(sc, n_engines: int, scale: float = 1.0) -> tuple[int, tuple[int, ...]]:
    """(most requests one engine holds at once, prompt lengths for the decode sweep) that the
    scenario's rollouts reach: its batch x group over the engines (APRIL's over-provisioning
    ratio on top where it runs) and KV per request from a short prompt to the longest prompt
    plus half the longest response, scaled like the run."""
    from aprilsim.scheduler_spec import SchedulerSpec

    ratio = 1.0
    for spec in sc.compare:
        if SchedulerSpec.parse(spec).name.startswith("april"):
            ratio = max(ratio, float(sc.knobs_of(spec)["ratio"]))
    peak = math.ceil(sc.batch_size * sc.group_size * ratio / max(1, n_engines))
    top = int(round((sc.max_prompt_len + sc.max_response_len / 2) * scale))
    loads = sorted({max(8, int(round(x)))
                    for x in (16, math.sqrt(16 * max(top, 16)), max(top, 16))})
    return max(1, peak), tuple(loads)
