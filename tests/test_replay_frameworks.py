"""Real frameworks' logs, as their own code writes them (issue 36, items 11-17).

Fixtures are written here the way slime's `save_debug_rollout_data` (`torch.save` of
`{"rollout_id", "samples": [Sample.to_dict()]}` at `template.format(rollout_id=...)`, eval dumps
at `rollout_id="eval_N"`) and verl's trainer (`_dump_generations` JSONL, console lines through
Ray's `(TaskRunner pid=N)` prefix, `timing_s/...` metrics) write theirs; kept small.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from aprilsim.cli import main
from aprilsim.workload.replay import read_run_log

DATA = Path(__file__).resolve().parent / "data" / "replay"
SLIME = DATA / "slime" / "rollout_data"


def _slime_sample(group: int, index: int, prompt: int, response: int, reward: float,
                  multimodal: object = None, train_inputs: object = None) -> dict:
    """The fields of slime's `Sample.to_dict()` replay reads, and the multimodal ones a
    vision-language run fills (`multimodal_inputs`: the processor's PIL images)."""
    return {"group_index": group, "index": index, "tokens": list(range(prompt + response)),
            "response_length": response, "reward": reward, "status": "completed",
            "metadata": {}, "multimodal_inputs": multimodal,
            "multimodal_train_inputs": train_inputs, "prompt": f"p{group}", "response": ""}


def test_a_vision_language_dump_is_read_and_its_images_skipped(tmp_path):
    """Item 11: a VL run's samples hold PIL images (and pixel tensors); the reader refused the
    whole file (`the dump holds a PIL.Image.Image object`)."""
    torch = pytest.importorskip("torch")
    image = pytest.importorskip("PIL.Image")
    for step in range(2):
        samples = []
        for g in range(3):
            for i in range(2):
                img = image.new("RGB", (4, 4), color=(g * 40, i * 80, step * 100))
                samples.append(_slime_sample(
                    g + 3 * step, i, 20 + g, 100 + 10 * g + i, float(i),
                    multimodal={"images": [img]},
                    train_inputs={"pixel_values": torch.ones(4, 3), "image_grid_thw":
                                  torch.tensor([[1, 2, 2]])}))
        torch.save({"rollout_id": step, "samples": samples}, tmp_path / f"{step}.pt")
    run = read_run_log(tmp_path)
    assert run.n_samples == 12 and len(run.groups) == 6
    assert sorted(g.lengths for g in run.groups)[0] == (100, 101)
    assert any("objects replay does not read, skipped: 12 PIL.Image.Image" in n
               for n in run.notes), run.notes


def test_eval_dumps_of_a_path_template_are_skipped(tmp_path):
    """Item 12: with `--save-debug-rollout-data DIR/rollout_{rollout_id}.pt`, slime writes
    evaluation dumps as `rollout_eval_N.pt` (rollout_id N, a training step's): they were read
    as training steps, and the log switched from prompt order to step order."""
    for f in SLIME.glob("*.pt"):
        shutil.copy(f, tmp_path / f"rollout_{f.name}")
    shutil.copy(SLIME / "0.pt", tmp_path / "rollout_eval_0.pt")  # same rollout_id, as slime
    shutil.copy(SLIME / "3.pt", tmp_path / "rollout_eval_3.pt")
    run = read_run_log(tmp_path)
    ref = read_run_log(SLIME)
    assert run.groups == ref.groups
    assert any("2 evaluation dumps" in n and "rollout_eval_0.pt" in n for n in run.notes)
    r = CliRunner().invoke(main, ["replay-validate", str(tmp_path / "rollout_eval_0.pt"), "-s",
                                  "sync", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "an evaluation dump" in r.stderr
