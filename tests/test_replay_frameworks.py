"""Real frameworks' logs, as their own code writes them (issue 36, items 11-17).

Fixtures are written here the way slime's `save_debug_rollout_data` (`torch.save` of
`{"rollout_id", "samples": [Sample.to_dict()]}` at `template.format(rollout_id=...)`, eval dumps
at `rollout_id="eval_N"`) and verl's trainer (`_dump_generations` JSONL, console lines through
Ray's `(TaskRunner pid=N)` prefix, `timing_s/...` metrics) write theirs; kept small.
"""

from __future__ import annotations

import json
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


def _verl_console(path: Path, steps: dict[int, dict[str, float]], prefix: str = "") -> Path:
    """Lines as verl's console logger prints them (`step:N - k:v - ...`, values through
    pprint.pformat), each behind Ray's actor prefix when `prefix` is given."""
    import pprint

    lines = ["(TaskRunner pid=2201) Training Progress:  10%|#  | 1/10", "INFO other output"]
    for step, data in steps.items():
        body = " - ".join([f"step:{step}", *(f"{k}:{pprint.pformat(v)}" for k, v in data.items())])
        lines.append(prefix + body)
    path.write_text("\n".join(lines) + "\n")
    return path


def test_verl_console_lines_behind_rays_prefix_are_read(tmp_path):
    """Item 13: verl's console log reaches the driver's output as `(TaskRunner pid=N) step:...`;
    the reader wanted `step:` at line start, and its error blamed `lengths.replay`."""
    import numpy as np

    from aprilsim.workload.replay.timing import read_step_times

    data = {1: {"actor/loss": 0.1, "timing_s/gen": np.float64(12.5), "timing_s/step": 20.0},
            2: {"timing_s/gen": 11.25, "timing_s/generate_sequences": 9.5}}
    log = _verl_console(tmp_path / "driver.log", data, prefix="(TaskRunner pid=2201) ")
    assert read_step_times(log) == {1: 12.5, 2: 11.25}
    bad = tmp_path / "none.log"
    bad.write_text("(TaskRunner pid=1) step:1 - actor/loss:0.1\n")
    table = DATA / "table.csv"
    r = CliRunner().invoke(main, ["replay-validate", str(table), "--scenario",
                                  str(DATA / "run.toml"), "-s", "sync", "--timing", str(bad),
                                  "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "lengths.timing:" in r.stderr and "lengths.replay" not in r.stderr
    assert "no perf/rollout_time or timing_s/gen in its verl console lines" in r.stderr


def _verl_dump(path: Path, step: int, prompts: list[str], n: int, lengths: list[int],
               with_uid: bool = False) -> None:
    """`_dump_generations`' JSONL: input, output (decoded text), gts, score, step per response
    (no uid unless the reward function adds one)."""
    rows = []
    k = 0
    for i, prompt in enumerate(prompts):
        for _ in range(n):
            row = {"input": prompt, "output": " ".join(["w1"] * lengths[k]), "gts": "1",
                   "score": float(k % 2), "step": step}
            if with_uid:
                row["uid"] = f"u{step}-{i}"
            rows.append(row)
            k += 1
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_identical_prompts_without_uid_are_split_into_groups(tmp_path):
    """Item 14: verl's dump has no uid; two identical prompts in one step merged into one group
    of 2n, and the batch size came out one short."""
    from aprilsim.validate.synth_log import write_tokenizer

    tok = write_tokenizer(tmp_path / "tokenizer.json")
    d = tmp_path / "rollout_data"
    d.mkdir()
    prompts = ["user w3 w4", "user w5", "user w3 w4", "user w6 w7 w8"]  # 0 and 2: the same text
    _verl_dump(d / "1.jsonl", 1, prompts, 4, list(range(1, 17)))
    run = read_run_log(d, _spec(d, tok))
    assert run.batch_size == 4 and run.group_size == 4
    assert sorted(g.size for g in run.groups) == [4, 4, 4, 4]
    assert any("split into groups of 4 (2 groups)" in n for n in run.notes), run.notes


def _spec(d: Path, tok: Path, **kw):
    from aprilsim.workload.replay import ReplaySpec

    return ReplaySpec(replay=str(d), tokenizer=str(tok), **kw)


def test_re_tokenised_prompts_get_their_chat_templates_tokens_back(tmp_path):
    """Item 17: the dump's text lost the chat template's special tokens (ChatML: 3 around one
    user turn); where the tokenizer names the template they are added back, else a note says
    so, and `prompt_special_tokens` sets them."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from aprilsim.workload.replay.frameworks import verl_rows

    vocab = {"<unk>": 0, "user": 1, "system": 2, "assistant": 3,
             **{f"w{i}": i + 4 for i in range(16)}}
    d = tmp_path / "rollout_data"
    d.mkdir()
    _verl_dump(d / "1.jsonl", 1, ["user w1 w2 assistant", "system w3 user w4 assistant"], 2,
               [3, 4, 5, 6], with_uid=True)
    for specials, want, note in (
            ({"<|im_start|>": 30, "<|im_end|>": 31}, [4 + 3, 5 + 5], "ChatML chat template"),
            ({}, [4, 5], "names no known chat template")):
        tok = Tokenizer(models.WordLevel({**vocab, **specials}, unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        tok.save(str(tmp_path / "t.json"))
        rows, notes = verl_rows(d, tmp_path / "t.json")
        assert sorted({r.prompt_len for r in rows}) == want
        assert any(note in n for n in notes), notes
    rows, notes = verl_rows(d, tmp_path / "t.json", prompt_special_tokens=5)
    assert sorted({r.prompt_len for r in rows}) == [4 + 5, 5 + 5]


def test_replay_validate_with_only_the_warmup_step_timed_is_one_line(tmp_path):
    """Item 15: only the warm-up step timed gave a TypeError traceback in compare.py."""
    t = tmp_path / "t.csv"
    t.write_text("step,rollout_s\n0,2.5\n")
    r = CliRunner().invoke(main, ["replay-validate", str(DATA / "table.csv"), "--scenario",
                                  str(DATA / "run.toml"), "-s", "sync", "--timing", str(t),
                                  "--out", str(tmp_path / "o"), "--no-figures"])
    assert r.exit_code == 2 and "only warm-up step(s) [0] are timed" in r.stderr


@pytest.mark.parametrize("bad", ["-1", "nan", "inf", "0", "x"])
def test_timing_rows_must_be_positive_finite_seconds(tmp_path, bad):
    """Item 24: rows of -1, nan or inf were taken and gave a nan % report."""
    t = tmp_path / "t.csv"
    t.write_text(f"step,rollout_s\n0,2.5\n1,{bad}\n2,2.0\n")
    r = CliRunner().invoke(main, ["replay-validate", str(DATA / "table.csv"), "--scenario",
                                  str(DATA / "run.toml"), "-s", "sync", "--timing", str(t),
                                  "--out", str(tmp_path / "o"), "--no-figures"])
    assert r.exit_code == 2 and "row 3 (rollout_s)" in r.stderr, r.stderr
    assert not (tmp_path / "o" / "report.md").exists()


def test_the_timing_key_is_chosen_and_what_it_spans_is_reported(tmp_path):
    """Item 16: logged step times span more than generation (slime's perf/rollout_time includes
    writing the dump, verl's timing_s/gen engine wake-up and weight sync): the user picks the
    key, wandb exports are read, report.md says what the chosen span includes and carries the
    replay notes, and the console says when the default cluster was simulated."""
    from aprilsim.workload.replay.timing import read_timing

    steps = {k: {"timing_s/gen": 3.0 + k, "timing_s/generate_sequences": 2.0 + k,
                 "timing_s/agent_loop/generate_sequences/max": 1.5 + k} for k in range(5)}
    log = _verl_console(tmp_path / "console.log", steps)
    got = read_timing(log, key="timing_s/agent_loop/generate_sequences/max")
    assert got.times == {k: 1.5 + k for k in range(5)} and "generation alone" in got.span
    assert "waking the engines" in read_timing(log).span
    panel = tmp_path / "wandb_panel.csv"  # a wandb panel's CSV export
    panel.write_text('"Step","run-7 - timing_s/gen","run-7 - timing_s/gen__MIN",'
                     '"run-7 - timing_s/gen__MAX"\n1,3.5,3.5,3.5\n2,4.0,4.0,4.0\n')
    assert read_timing(panel, key="timing_s/gen").times == {1: 3.5, 2: 4.0}
    history = tmp_path / "history.csv"  # the run history (wandb's API export)
    history.write_text("_step,rollout/step,perf/rollout_time\n10,0,2.5\n11,1,2.75\n")
    assert read_timing(history).times == {0: 2.5, 1: 2.75}
    out = tmp_path / "o"
    r = CliRunner().invoke(main, ["replay-validate", str(DATA / "table.csv"), "-s", "sync",
                                  "--timing", str(log), "--timing-key",
                                  "timing_s/generate_sequences", "--out", str(out),
                                  "--no-figures"])
    assert r.exit_code == 0, r.stderr
    assert "the default scenario's cluster is simulated" in r.stderr
    md = (out / "report.md").read_text()
    assert "## Replay" in md and "timing_s/generate_sequences" in md and "generation alone" in md
    assert "more groups than logged: wrap" in md and "fresh groups drawn of the log's" in md
