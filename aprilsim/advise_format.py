"""`aprilsim advise`'s printed answer: the ranked table and how to try the winner."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

# `aprilsim.advise`'s Advice and Option (not imported: advise's CLI imports both modules)
Advice = Any
Option = Any

VERL_HINTS = {
    # sync is verl's own default (the PPO trainer generates the batch, then trains): no recipe
    "sync": "the default trainer (verl.trainer.main_ppo): a synchronous rollout, nothing to change",
    "fully_async": "the fully-async recipe (recipe/fully_async_policy), "
                   "async_training.partial_rollout=True; staleness bounded by eta policy versions",
    "async_one_step": "the one-step-off-policy recipe (recipe/one_step_off_policy)",
    "dynamic_sampling": "the DAPO recipe (recipe/dapo): algorithm.filter_groups.enable=True",
    "april": "verl has no APRIL-style partial rollout: use the slime flags",
    "april_ds": "verl has no APRIL-style partial rollout: use the slime flags",
    "async_april": "verl has no APRIL-style partial rollout: use the slime flags",
    "slime_dapo": "verl's DAPO recipe runs synchronous rounds (dynamic_sampling), not slime's loop",
    "tail_batching": "no verl counterpart (RollPacker's tail batching): use the slime flags",
    "seer": "no verl counterpart (Seer's system is not released)",
    "seer_history": "no verl counterpart (Seer's system is not released)",
    "sync_turns": "verl's agent loop runs each episode on its own (sync); a per-turn barrier is "
                  "Search-R1's older generation loop",
    "env_async": "no verl counterpart (ROLL Flash's environment-level asynchrony); the nearest "
                 "is the fully-async recipe (recipe/fully_async_policy)",
}


def _gain_cell(o: Option, baseline: str) -> str:
    if o.baseline:
        return "1.00x (the baseline)"
    if math.isnan(o.gain_lo):
        return f"{o.gain:.2f}x"
    return f"{o.gain:.2f}x [{o.gain_lo:.2f}, {o.gain_hi:.2f}]"


def format_options(advice: Advice) -> list[str]:
    """The ranked table: gain over the baseline [95 % CI] on fresh seeds, the costs, and whether
    the user's framework launches it; then each infeasible option with the limit it missed."""
    base = advice.baseline
    heads = ["rank", "option", f"samples/s vs {base} [95% CI]", f"tok/s vs {base}", "vs sync",
             "off-policy", "staleness", "len bias vs sync", "GPUs", "launch"]
    cells, out_lines = [], []
    rank = 0
    for o in advice.options:
        if o.infeasible:
            today = " (what you run today)" if o.baseline else ""
            out_lines.append(f"-  {o.scheduler}{today}: infeasible: {o.infeasible}")
            continue
        rank += 1
        cells.append([str(rank), o.label + (" (today)" if o.baseline else ""), _gain_cell(o, base),
                      f"{o.tok_gain:.2f}x",
                      f"{o.sync_gain:.2f}x", f"{o.offpolicy:.0%}", f"{o.staleness:.0f}",
                      f"{o.length_bias_vs_sync:+.1%}",
                      "+ trainer's" if o.mode == "disaggregated" else "the same", o.launch])
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h)
              for i, h in enumerate(heads)]

    def row(xs: list[str]) -> str:
        return "  ".join(x.ljust(w) if i < 2 or i == len(xs) - 1 else x.rjust(w)
                         for i, (x, w) in enumerate(zip(xs, widths)))

    out = [row(heads), "  ".join("-" * w for w in widths), *map(row, cells), *out_lines]
    out += _notes(advice)
    return out


def _notes(advice: Advice) -> list[str]:
    """What the columns need said: the trainer's GPUs, and what an unlaunchable option takes."""
    out = []
    if any(o.mode == "disaggregated" and not o.infeasible for o in advice.options):
        out.append("GPUs \"+ trainer's\": a disaggregated scheduler trains on GPUs of its own "
                   "besides the rollout GPUs sync shares with training: its samples/s gain buys "
                   "hardware too")
    fw = advice.framework
    if fw is None:
        out.append("launch \"?\": a scenario file names no framework (--slime or --verl say which "
                   "options yours can launch)")
        return out
    for o in advice.options:
        if o.launch == "no":
            out.append(f"launch \"no\": {fw} cannot launch {o.scheduler}: it needs {o.launch_how}")
    return out


def try_lines(advice: Advice, scenario_file: Path, out_dir: Path) -> list[str]:
    """How to try the winner: the `aprilsim validate` command, slime flags, verl keys."""
    win, best = advice.winner, advice.best
    lines: list[str] = []
    if best is not None and win is not best:
        lines.append(f"the best option, {best.label} ({best.gain:.2f}x), cannot be launched by "
                     f"{advice.framework}: the winner below is the best one it can launch")
    if win is None:
        return lines + ["no option meets the limits: loosen them (--max-offpolicy, "
                        "--max-staleness, --max-length-bias) or advise on more --candidates"]
    base = advice.baseline  # its knobs are the advised scenario's
    if win.baseline:
        lines.append(f"nothing beats {advice.baseline}, what you run today, under the limits "
                     "(loosen them to see what would):")
        pick = f"-s {base}"
    else:
        lines.append("try the winner:")
        pick = f"-s {base} -s {win.label}"
    lines += [f"  aprilsim validate {scenario_file} --local 2 {pick} --out {out_dir / 'validate'}",
              "    (bundled CPU engines, lengths scaled down; --engines URL,... for your own)"]
    lines += _launch_lines(win, scenario_file)
    return lines


def _launch_lines(win: Option, scenario_file: Path) -> list[str]:
    from aprilsim.config import load_scenario
    from aprilsim.interop import to_slime

    lines = []
    try:
        argv, notes = to_slime(load_scenario(scenario_file), win.scheduler)
        lines.append("  slime: " + " ".join(argv))
        lines += [f"    note: {n}" for n in notes]
    except ValueError as e:
        lines.append(f"  slime: {e}")
    lines.append("  verl: " + VERL_HINTS.get(win.scheduler, "no verl counterpart; use slime"))
    return lines
