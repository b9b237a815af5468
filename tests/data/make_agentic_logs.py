"""Make the multi-turn replay example under tests/data/replay_agentic: a small agentic run's
trained episodes written as slime's and verl's multi-turn code writes them, with known truth.

The "run" is aprilsim's own simulation of `run.toml` (sync, 3 steps of 4 groups x 4 episodes,
2-4 turns, 40-200 tool tokens per call, tool calls of 0.2-2 s). slime's dumps carry `loss_mask`
(0 for tool tokens) and `non_generation_time`; verl's carry decoded text, tool responses in
the Hermes/Qwen frame, counted back by a word-level tokenizer. Writers:
aprilsim/validate/synth_agentic.py. Re-run after changing them:

    PYTHONPATH=. python tests/data/make_agentic_logs.py
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from aprilsim.config import load_scenario
from aprilsim.validate.synth_agentic import agentic_batches, slime_episode_dumps, write_verl
from aprilsim.validate.synth_log import write_tokenizer

HERE = Path(__file__).resolve().parent / "replay_agentic"

RUN_TOML = """\
# The synthetic agentic run behind the multi-turn replay example (tests/data/make_agentic_logs.py).
name = "agentic-replay-run"
seed = 5
steps = 3
warmup_steps = 1
batch_size = 4
group_size = 4
max_response_len = 4096
compare = ["sync"]

[cluster]
engines = 2
router = "group_affinity"
prefix_cache = "lru"

[lengths]                    # per turn
family = "lognormal"
mu = 5.0                     # median ~150 tokens
sigma = 0.7

[prompts]
family = "lognormal"
mu = 4.5
sigma = 0.3
max_len = 512

[workload.episodes]
min_turns = 2
max_turns = 4
tool_s = {low = 0.2, high = 2.0}
tool_tokens = {low = 40, high = 200}
"""


def main() -> None:
    import torch

    if HERE.exists():
        shutil.rmtree(HERE)
    (HERE / "slime" / "rollout_data").mkdir(parents=True)
    (HERE / "run.toml").write_text(RUN_TOML)
    batches = agentic_batches(load_scenario(HERE / "run.toml"))
    for d in slime_episode_dumps(batches):
        torch.save(d, HERE / "slime" / "rollout_data" / f"{d['rollout_id']}.pt")
    write_verl(batches, HERE / "verl")
    write_tokenizer(HERE / "verl" / "tokenizer.json")
    truth = [{"step": k, "gid": g.gid, "uid": s.uid, "generated": s.generated,
              "tool_tokens": s.episode.appended, "turns": s.episode.turn + 1,
              "tool_s": s.episode.tool_time_s}
             for k, groups in enumerate(batches) for g in groups for s in g.samples]
    (HERE / "truth.jsonl").write_text("".join(json.dumps(t) + "\n" for t in truth))
    print(f"wrote {sorted(str(p.relative_to(HERE)) for p in HERE.rglob('*') if p.is_file())}")


if __name__ == "__main__":
    main()
