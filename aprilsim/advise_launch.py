"""Which rollout schedulers a user's RL framework can launch, and what the others would take.

`aprilsim advise` marks each option with this (issue 38): a ranking is only useful to a slime
user if it says that `fully_async` needs another framework. The table follows what
`aprilsim scenario --to-slime` exports (`interop.slime._export_scheduler`) and what verl ships
(`verl.trainer.main_ppo`, `recipe/dapo`, `recipe/one_step_off_policy`,
`recipe/fully_async_policy`). A scenario file names no framework: every option is "unknown".
"""

from __future__ import annotations

from dataclasses import dataclass

FRAMEWORKS = ("slime", "verl")

# what no open framework ships (the Seer and RollPacker papers' systems are not released)
_SEER = ("Seer's own system (not released): per-request priorities and routing (SGLang "
         "--enable-priority-scheduling and a router that routes per piece), a global KV pool "
         "(Mooncake) so that a response moves between engines without re-prefill, and a "
         "scheduler that sends responses in pieces")
_ROLL_FLASH = ("ROLL Flash's environment-level asynchronous rollout (ROLL, arXiv 2510.11345: "
               "redundant environment groups, async_generation_ratio)")
_TURN_BARRIER = ("a batch-synchronous multi-turn loop (Search-R1's LLMGenerationManager, RAGEN): "
                 "every episode's turn k, then all tool calls, then turn k + 1")
_ROLLPACKER = ("RollPacker's tail batching (arXiv 2509.21009, built on ROLL): short and long "
               "rounds, extra responses aborted; not in slime or verl")


@dataclass(frozen=True)
class Launch:
    """Whether `framework` launches `scheduler` as simulated, and how (or what it would take)."""

    ok: bool
    how: str


LAUNCH: dict[str, dict[str, Launch]] = {
    "slime": {
        "sync": Launch(True, "slime's train.py, as is"),
        "april": Launch(True, "--partial-rollout --over-sampling-batch-size (train.py)"),
        "april_ds": Launch(True, "--partial-rollout with --dynamic-sampling-filter-path"),
        "slime_dapo": Launch(True, "--dynamic-sampling-filter-path without --partial-rollout"),
        "async_one_step": Launch(True, "slime's train_async.py (the trainer on GPUs of its own)"),
        "async_april": Launch(True, "train_async.py with --partial-rollout"),
        "dynamic_sampling": Launch(False, "verl's synchronous rounds (recipe/dapo); slime runs "
                                          "the same filter as slime_dapo (over-sample, abort)"),
        "fully_async": Launch(False, "an AReaL-style fully asynchronous loop (AReaL, or verl's "
                                     "recipe/fully_async_policy); slime's train_async.py is "
                                     "one step off-policy only"),
        "tail_batching": Launch(False, _ROLLPACKER),
        "seer": Launch(False, _SEER),
        "seer_history": Launch(False, _SEER + ", plus the prompts' lengths from earlier epochs"),
        "sync_turns": Launch(False, _TURN_BARRIER + "; slime's multi-turn rollouts (a custom "
                                    "generate function) run each episode on its own: sync"),
        "env_async": Launch(False, _ROLL_FLASH + "; slime's train_async.py is one step "
                                   "off-policy only"),
    },
    "verl": {
        "sync": Launch(True, "verl.trainer.main_ppo, as is"),
        "dynamic_sampling": Launch(True, "recipe/dapo (algorithm.filter_groups)"),
        "async_one_step": Launch(True, "recipe/one_step_off_policy"),
        "fully_async": Launch(True, "recipe/fully_async_policy (async_training.partial_rollout)"),
        "april": Launch(False, "APRIL's partial rollout: slime's --partial-rollout; verl has no "
                               "abort-and-resume rollout"),
        "april_ds": Launch(False, "slime's --partial-rollout with its dynamic filter"),
        "slime_dapo": Launch(False, "slime's over-sample/abort loop (verl's DAPO recipe runs "
                                    "synchronous rounds: dynamic_sampling)"),
        "async_april": Launch(False, "slime's train_async.py with --partial-rollout"),
        "tail_batching": Launch(False, _ROLLPACKER),
        "seer": Launch(False, _SEER),
        "seer_history": Launch(False, _SEER + ", plus the prompts' lengths from earlier epochs"),
        "sync_turns": Launch(False, _TURN_BARRIER + "; verl's agent loop runs each episode on "
                                    "its own: sync"),
        "env_async": Launch(False, _ROLL_FLASH + "; verl's recipe/fully_async_policy is the "
                                   "nearest: fully_async"),
    },
}


def launch(framework: str | None, scheduler: str) -> Launch | None:
    """How `framework` launches `scheduler`; None when no framework is known (a scenario file)
    or the scheduler is not in the table (a user's own)."""
    if framework is None:
        return None
    return LAUNCH.get(framework, {}).get(scheduler)


def launch_cell(framework: str | None, scheduler: str) -> str:
    """The table's cell: "yes", "no", or "?" (no framework named, or a user's scheduler)."""
    got = launch(framework, scheduler)
    return "?" if got is None else "yes" if got.ok else "no"
