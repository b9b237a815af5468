"""What each scheduler knob means and which values it takes, for `aprilsim schedulers NAME`.

A scheduler declares its own with dataclass field metadata, which wins over this table:
`ratio: float = field(default=2.0, metadata={"doc": "groups in flight / N", "allowed": ">= 1"})`.
The table covers the built-in schedulers (the same words as docs/schedulers.md; a subclass such as
`april_ds` or `slime_dapo` inherits its base's entries); the declared type
(`true or false`, `an integer (or unset)`) is always known from the annotation.
"""

from __future__ import annotations

import dataclasses
from typing import Any

# scheduler -> knob -> (meaning, allowed values)
KNOB_DOCS: dict[str, dict[str, tuple[str, str]]] = {
    "sync": {
        "dispatch": ("where requests go: the scenario's router, or each group whole on one engine "
                     "with groups balanced over the engines (veRL's dispatch, the baseline the "
                     "Seer paper measured against)", '"router", "group"'),
    },
    "april": {
        "ratio": ("groups in flight / N (slime --over-sampling-batch-size / --rollout-batch-size)",
                  ">= 1"),
        "recycle": ("keep partials for the next step (slime --partial-rollout); false: discard "
                    "them (waste)", "true, false"),
        "resume_order": ("which buffered groups resume first", '"fifo" (slime\'s default), '
                         '"most_progress", "oldest_version"'),
        "max_staleness": ("k: partials whose oldest tokens are k versions old are force-completed "
                          "(or discarded, see stale_action)",
                          "an integer >= 1, or unset (no bound)"),
        "stale_action": ("what happens to a partial past max_staleness", '"complete", "discard"'),
        "token_budget": ("at most B tokens per sample per step (Kimi k1.5); past that it is parked "
                         "and a fresh group replaces it", "an integer >= 1, or unset (no budget)"),
        "max_new_groups": ("cap on fresh replacement groups per step, x N", ">= 1"),
        "surplus": ("groups that complete in the same wake-up as the N-th: dropped as slime "
                    "does (waste), or kept in the buffer, complete", '"drop", "recycle"'),
        "mask_offpolicy": ("report the trained tokens slime's off-policy loss mask zeroes "
                           "(--mask-offpolicy-in-partial-rollout); the schedule is unchanged",
                           "true, false"),
    },
    "dynamic_sampling": {
        "gen_batch_size": ("groups per round (DAPO's gen_prompt_bsz, e.g. 3N)",
                           "an integer >= 1, or unset (N)"),
        "std_threshold": ("groups with reward std <= this are dropped", "a finite number >= 0"),
        "max_rounds": ("rounds per step at most (DAPO's max_num_gen_batches)", "an integer >= 1"),
        "on_cap": ("when max_rounds leave fewer than N valid groups: stop with an error, or train "
                   "on what there is", '"error", "train"'),
    },
    "tail_batching": {
        "prompt_ratio": ("prompts launched / N in short rounds", ">= 1"),
        "extra_responses": ("responses per prompt beyond group_size in short rounds",
                            "an integer >= 0"),
        "long_round_size": ("deferred prompts that trigger a long round",
                            "an integer >= 1, or unset (N)"),
    },
    "fully_async": {
        "eta": ("staleness bound: no trained token more than eta versions old", "an integer >= 0"),
        "inflight_ratio": ("groups kept generating / N (AReaL's max concurrent rollouts)", "> 0"),
        "interrupt": ("at a weight update, interrupt in-flight requests and re-prefill them under "
                      "the new weights; false: they continue", "true, false"),
    },
}
KNOB_DOCS["seer"] = {
    "chunk": ("tokens per piece: a response runs in pieces of at most this many tokens, each "
              "sent to the engine with room (Seer's divided rollout)",
              "an integer >= 0 (0: one piece)"),
    "probe": ("one response per group runs first at top priority; its length estimates the "
              "group's, and the rest go longest-first", "true, false"),
    "hold": ("the group's other responses wait until its probe has shown something",
             "true, false"),
    "route": ("where pieces go: the engine with the most room, or the runtime's router",
              '"most_room", "router"'),
    "history": ("estimate a group's length from the same prompt's earlier epochs "
                "(seer_history); a prompt not seen yet is probed", "true, false"),
    "migrate_kv": ("a piece's KV moves with it to the next engine through Seer's global KV pool "
                   "(no re-prefill; the transfer costs `[cluster] kv_transfer`; simulated only, "
                   "off under a prefix cache); false: each piece re-prefills what it carries",
                   "true, false"),
}
KNOB_DOCS["sync"] |= {
    "barrier": ("agentic episodes: \"episode\", each runs its turns and tool calls on its own "
                "(an agent loop); \"turn\", every turn waits for the whole batch's turn and "
                "tool calls (batch-synchronous multi-turn; `sync_turns`); the same on "
                "single-turn workloads", '"episode", "turn"'),
}
KNOB_DOCS["env_async"] = {
    "eta": ("ROLL's async_generation_ratio alpha: the rollout runs at most alpha steps ahead "
            "of training; no trained token is more than alpha versions old", "an integer >= 0"),
    "inflight_ratio": ("redundant environment rollout: episode groups running / N (ROLL's "
                       "num_env_groups over the groups a batch takes)", "> 0"),
    "interrupt": ("at a weight update, interrupt the turns in flight (re-prefilled under the "
                  "new weights); false: they finish, and each episode's next turn uses the new "
                  "weights", "true, false"),
}
KNOB_DOCS["april_ds"] = {
    "std_threshold": ("finished groups with reward std <= this are dropped (waste) and replaced",
                      "a finite number >= 0"),
    "refill": ("after dropped groups: a whole over-sampling batch once fewer than N remain "
               "(slime's loop), or one fresh group per dropped one", '"chunk", "one_for_one"'),
    "keep_when_insufficient": ("a group the filter rejects is trained anyway while no more than "
                               "N groups remain in flight or accepted, rather than start another "
                               "over-sampling batch (slime's "
                               "check_reward_nonzero_std_with_fallback)", "true, false"),
}
KNOB_DOCS["async_april"] = {
    "dynamic_filter": ("apply DAPO's filter and the chunked refill (april_ds) inside the async "
                       "pipeline; false: april's rollout", "true, false"),
}


def knob_doc(cls: type, scheduler: str, knob: str) -> tuple[str, str]:
    """(meaning, allowed values) of one knob: field metadata, else the table, else the type."""
    from aprilsim.knob_types import knob_types, type_words

    meta: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name == knob:
            meta = dict(f.metadata)
    doc, allowed = "", ""
    for base in (scheduler, *(getattr(c, "name", None) for c in cls.__mro__)):
        if knob in KNOB_DOCS.get(base, {}):  # a subclass inherits its base's words
            doc, allowed = KNOB_DOCS[base][knob]
            break
    doc = meta.get("doc", doc)
    allowed = meta.get("allowed", allowed) or type_words(knob_types(cls).get(knob, Any))
    return doc, allowed
