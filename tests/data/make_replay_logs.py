"""Make the replay example under tests/data/replay: a small run's logs in slime's, verl's and a
table's format, with known ground truth.

The "run" is aprilsim's own simulation of `run.toml` (2 engines, 8 groups x 4 responses, 5
steps, a cluster 15 % slower than the qwen3-4b-h100-tp2 preset: `true_cost.toml`), its logged
rollout times the true ones with 3 % seeded noise. slime's run used APRIL (partial rollout, so
some responses are resumed), verl's and the table's used sync. Re-run after changing the format
writers (aprilsim/validate/synth_log.py):

    PYTHONPATH=. python tests/data/make_replay_logs.py
"""

from __future__ import annotations

import shutil
from pathlib import Path

from aprilsim.config import load_scenario
from aprilsim.validate.synth_log import (
    slime_dumps,
    synthesize,
    write_table,
    write_tokenizer,
    write_verl,
)

HERE = Path(__file__).resolve().parent / "replay"
PRESET_SCALE = 1.15  # the true engine is this much slower than the preset

RUN_TOML = """\
# The synthetic run behind the replay example (tests/data/make_replay_logs.py).
name = "replay-example-run"
seed = 3
steps = 5
warmup_steps = 1
batch_size = 8
group_size = 4
max_response_len = 1024
compare = ["sync", "april"]

[cluster]
engines = 2
preset = "true_cost.toml"   # the cluster as it really was (15 % slower than the preset)

[lengths]
family = "lognormal"
mu = 5.5                     # median ~245 tokens
sigma = 0.9

[prompts]
family = "lognormal"
mu = 4.1                     # median ~60 tokens
sigma = 0.4
max_len = 256

[schedulers.april]
ratio = 2.0
"""


REPLAY_TOML = """\
# Replay the slime example run's logged groups (docs/replay.md): `aprilsim simulate` this file
# for counterfactuals, `aprilsim replay-validate` to check predictions against the logged times.
name = "replay-example"
steps = 5
warmup_steps = 1
batch_size = 8
group_size = 4
max_response_len = 1024
compare = ["sync", "april"]

[cluster]
engines = 2
preset = "true_cost.toml"

[lengths]
replay = "slime/rollout_data"   # slime --save-debug-rollout-data dumps (or verl's, or a table)
timing = "slime/train.log"      # the run's per-step rollout times (for replay-validate)
exhausted = "wrap"              # more groups than logged: repeat the log (or "stop")
# unlogged = "cap"  prompts APRIL drew, never trained: replay-validate --unlogged cap (docs)

[prompts]                       # draws what the log lacks (it has prompt lengths here)
family = "lognormal"
mu = 4.1
sigma = 0.4
max_len = 256

[schedulers.april]
ratio = 2.0
"""


def true_cost_toml() -> str:
    """The preset's cost x PRESET_SCALE, as a preset file (`aprilsim calibrate --out` format)."""
    from aprilsim.engine.cost import PRESETS

    c = PRESETS["qwen3-4b-h100-tp2"].cost
    f = PRESET_SCALE
    return (f'label = "true-cost"\n'
            f'source = "qwen3-4b-h100-tp2 x {f} (the example run\'s cluster)"\n'
            f"[cost]\na = {c.a * f!r}\nb = {c.b * f!r}\nc = {c.c * f!r}\n"
            f"p0 = {c.p0 * f!r}\np1 = {c.p1 * f!r}\np2 = {c.p2 * f!r}\n")


def write_slime(run, out: Path) -> None:
    """``out/rollout_data/{id}.pt`` (torch.save, as slime does) and ``out/train.log``."""
    import torch

    dumps, log = slime_dumps(run)
    (out / "rollout_data").mkdir(parents=True)
    for d in dumps:
        torch.save(d, out / "rollout_data" / f"{d['rollout_id']}.pt")
    (out / "train.log").write_text(log)


def main() -> None:
    if HERE.exists():
        shutil.rmtree(HERE)
    HERE.mkdir(parents=True)
    (HERE / "true_cost.toml").write_text(true_cost_toml())
    (HERE / "run.toml").write_text(RUN_TOML)
    (HERE / "replay.toml").write_text(REPLAY_TOML)
    sc = load_scenario(HERE / "run.toml")
    april = synthesize(sc, "april", noise=0.03, noise_seed=1)
    write_slime(april, HERE / "slime")
    sync = synthesize(sc, "sync", noise=0.03, noise_seed=2)
    write_verl(sync, HERE / "verl")
    write_tokenizer(HERE / "verl" / "tokenizer.json")
    write_table(sync, HERE / "table.csv", HERE / "table_times.csv")
    for name, r in (("april", april), ("sync", sync)):
        print(f"{name}: true rollout s {[round(t, 3) for t in r.true_rollout_s]}, "
              f"logged {[round(t, 3) for t in r.rollout_s]}")
    print(f"wrote {sorted(str(p.relative_to(HERE)) for p in HERE.rglob('*') if p.is_file())}")


if __name__ == "__main__":
    main()
