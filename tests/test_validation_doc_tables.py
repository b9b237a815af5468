"""The validation scripts' doc sections carry the verdicts and the decision agreement (issue 35:
the figures docs/validation.md gives), computed from report.json as written."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _module():
    sys.path.insert(0, str(ROOT / "experiments"))
    try:
        import validate_vllm
    finally:
        sys.path.remove(str(ROOT / "experiments"))
    return validate_vllm


def _pooled(agree: int, compared: int, first=None, live=(0, 0)) -> dict:
    return {"share": agree / compared if compared else None, "agree_steps": agree,
            "compared": compared, "first_mismatch": first,
            "live_floor": {"agree_steps": live[0], "compared": live[1]}}


REP = {
    "verdict": "undecided",
    "targets": {
        "step_rollout_error": {"verdict": "met", "reason": "sync: 1.0% <= 10.0%"},
        "gain_vs_sync_pp": {"verdict": "undecided", "reason": "april: +2 +- 8 pp | straddles"},
    },
    "decisions": {
        "sync": {"pooled": _pooled(8, 8, live=(4, 4)), "pooled_all_rounds": _pooled(12, 12)},
        "april": {"pooled": _pooled(6, 8, {"round": 1, "step": 2, "what": "surplus dropped"},
                                    live=(3, 4)),
                  "pooled_all_rounds": _pooled(9, 12)},
    },
    "machine": {"runs": [
        {"label": "sync", "round": 0, "starved": True, "why": "event-loop lag p99 67 ms > 50"},
        {"label": "april", "round": 0, "starved": True, "why": ""},
        *({"label": lab, "round": r, "starved": False} for r in (1, 2)
          for lab in ("sync", "april")),
    ]},
}


def test_the_decision_table_pools_the_unflagged_steps_and_names_what_was_left_out():
    lines = _module().decisions_table(REP)
    assert "| sync | 100.0% (8/8) | 100.0% (12/12) | 100.0% (4/4) | none |" in lines
    assert ("| april | 75.0% (6/8) | 75.0% (9/12) | 75.0% (3/4) | round 2, step 2: surplus "
            "dropped |") in lines
    last = lines[-1]
    assert "**87.5% (14/16)** of the unflagged steps (the live rounds with one another: 87.5% " \
           "(7/8))" in last
    assert "4 of 6 runs unflagged" in last
    assert "sync round 1 (event-loop lag p99 67 ms > 50)" in last and "april round 1 (starved)" \
        in last


def test_the_verdicts_table_gives_every_target_with_its_reason():
    lines = _module().verdicts_table(REP)
    assert lines[0] == "Verdict: **undecided**."
    assert "| step_rollout_error | met | sync: 1.0% <= 10.0% |" in lines
    # a reason's own "|" cannot break the table
    assert "| gain_vs_sync_pp | undecided | april: +2 +- 8 pp / straddles |" in lines
