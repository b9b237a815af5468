"""Synthetic run logs with known ground truth: simulate a run, record what it trained and how
long each rollout took, perturb the times, and write it all in slime's, verl's or a table's
format. The shipped example (`tests/data/make_replay_logs.py`) and the agreement measurement
(`experiments/replay_agreement.py`) are made with it.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aprilsim.config import Scenario
from aprilsim.validate.from_log import BatchRecorder
from aprilsim.validate.scaled import make_policy


@dataclass(frozen=True)
class SynthGroup:
    """One trained group of the synthetic run."""

    key: int  # the prompt's index in the dataset (slime's group_index)
    prompt_len: int
    lengths: tuple[int, ...]
    rewards: tuple[float, ...]
    start_steps: tuple[int, ...]  # the step each response began in (resumed: an earlier one)
    truncated: tuple[bool, ...]


@dataclass
class SynthRun:
    """What a run logged: per step its trained groups and rollout seconds (true and logged)."""

    scheduler: str
    max_len: int
    steps: list[list[SynthGroup]]
    true_rollout_s: list[float]
    rollout_s: list[float]  # the true times with multiplicative noise: what the run "logged"
    drawn_step: dict[int, int] = field(default_factory=dict)  # prompt key -> step it was drawn in


def synthesize(sc: Scenario, scheduler: str, *, noise: float = 0.03, noise_seed: int = 0,
               seed: int | None = None) -> SynthRun:
    """Simulate `scheduler` on `sc` and record its trained batches; logged time = true time x
    exp(N(0, noise)) per step (seeded), the run-to-run jitter of a real cluster."""
    from aprilsim.sim.build import build_simulation

    rec = BatchRecorder(make_policy(sc, scheduler))
    sim = build_simulation(sc, rec, seed=seed)
    run = sim.run()
    steps = []
    for step, groups in rec.batches:
        out = []
        for g in groups:
            out.append(SynthGroup(
                key=g.prompt_key, prompt_len=g.prompt_len,
                lengths=tuple(s.generated for s in g.samples),
                rewards=tuple(float(s._reward or 0.0) for s in g.samples),
                start_steps=tuple(min(step, s.segments[0].version) if s.segments else step
                                  for s in g.samples),
                truncated=tuple(s.generated >= s.max_len for s in g.samples)))
        steps.append(out)
    rng = random.Random(noise_seed)
    true = [s.rollout_time_s for s in run.steps]
    logged = [t * (2.718281828459045 ** rng.gauss(0.0, noise)) for t in true]
    drawn = {}
    for g in sim.groups.values():
        drawn.setdefault(g.prompt_key, g.created_step)
    return SynthRun(scheduler, sc.max_response_len, steps[: len(true)], true, logged, drawn)


# ---------------------------------------------------------------------------------------- slime
def _slime_sample(g: SynthGroup, i: int, index: int, step: int,
                  rng: random.Random) -> dict[str, Any]:
    """A dict with the fields of slime's ``Sample.to_dict()`` (slime/utils/types.py)."""
    n_prompt, n_resp = g.prompt_len, g.lengths[i]
    meta: dict[str, Any] = {}
    if g.start_steps[i] < step:
        meta["start_rollout_id"] = g.start_steps[i]
    return {
        "group_index": g.key, "index": index, "rollout_id": None,
        "prompt": f"prompt {g.key}",
        "tokens": [rng.randrange(2, 200) for _ in range(n_prompt + n_resp)],
        "multimodal_inputs": None, "multimodal_train_inputs": None,
        "multimodal_train_input_id": None,
        "apply_chat_template_kwargs": {}, "response": "", "response_length": n_resp,
        "label": "42", "reward": g.rewards[i], "loss_mask": None,
        "weight_versions": [str(v) for v in range(g.start_steps[i], step + 1)],
        "rollout_log_probs": None, "rollout_top_p_token_ids": None,
        "rollout_top_p_token_offsets": None, "rollout_routed_experts": None,
        "remove_sample": False, "teacher_log_probs": None,
        "status": "truncated" if g.truncated[i] else "completed", "metadata": meta,
        "generate_function_path": None, "custom_rm_path": None, "train_metadata": None,
        "session_id": None, "non_generation_time": 0.0,
        "spec_info": {"spec_accept_token_num": 0, "spec_draft_token_num": 0, "spec_verify_ct": 0,
                      "completion_token_num": 0},
        "prefix_cache_info": {"cached_tokens": 0, "total_prompt_tokens": 0},
    }


def slime_dumps(run: SynthRun, *, rollout_gpus: int = 8) -> tuple[list[dict[str, Any]], str]:
    """Per step the dict ``--save-debug-rollout-data`` saves (``{"rollout_id", "samples"}``;
    the caller ``torch.save``s each to ``rollout_data/{id}.pt``), and the text of slime's log
    with its ``perf {id}: {...}`` lines (``log_rollout_data``)."""
    rng = random.Random(1)
    dumps, lines = [], []
    for step, groups in enumerate(run.steps):
        samples = [_slime_sample(g, i, g.key * len(g.lengths) + i, step, rng)
                   for g in groups for i in range(len(g.lengths))]
        dumps.append({"rollout_id": step, "samples": samples})
        t = run.rollout_s[step]
        toks = sum(sum(g.lengths) for g in groups)
        perf = {"perf/rollout_time": t, "perf/tokens_per_gpu_per_sec": toks / t / rollout_gpus,
                "perf/longest_sample_tokens_per_sec": max(max(g.lengths) for g in groups) / t}
        lines.append(f"[2026-01-01 00:{step // 60:02d}:{step % 60:02d}] rollout_metrics.py:270 - "
                     f"perf {step}: {perf!r}")
    return dumps, "\n".join(["INFO starting slime (synthetic log)", *lines]) + "\n"


# ---------------------------------------------------------------------------------------- verl
VOCAB = 64  # words w0..w63 of the example tokenizer


def write_tokenizer(path: Path) -> Path:
    """A word-level ``tokenizer.json`` (one token per space-separated word): text whose token
    count is known exactly, standing in for the run's own tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, **{f"w{i}": i + 1 for i in range(VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(path))
    return path


def _text(n: int, rng: random.Random) -> str:
    return " ".join(f"w{rng.randrange(VOCAB)}" for _ in range(n))


def write_verl(run: SynthRun, out: Path, *, shuffle: bool = True) -> list[Path]:
    """``out/rollout_data/{step}.jsonl`` as ``_dump_generations`` writes them (steps from 1, as
    verl's ``global_steps``; rows reordered within a step, as ``balance_batch`` does), and
    ``out/metrics.jsonl`` as verl's ``file`` logger writes ``timing_s/gen``."""
    rng = random.Random(2)
    (out / "rollout_data").mkdir(parents=True, exist_ok=True)
    paths, metrics = [], []
    for k, groups in enumerate(run.steps):
        step = k + 1
        rows = []
        for g in groups:
            prompt = _text(g.prompt_len, rng)
            for i, n in enumerate(g.lengths):
                rows.append({"input": prompt, "output": _text(n, rng), "gts": "42",
                             "score": g.rewards[i], "step": step, "acc": g.rewards[i] > 0})
        if shuffle:
            rng.shuffle(rows)
        p = out / "rollout_data" / f"{step}.jsonl"
        p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
        paths.append(p)
        t = run.rollout_s[k]
        lens = [n for g in groups for n in g.lengths]
        metrics.append({"step": step, "data": {"timing_s/gen": t, "timing_s/step": t + 5.0,
                                               "response_length/mean": sum(lens) / len(lens)}})
    (out / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    paths.append(out / "metrics.jsonl")
    return paths


# ---------------------------------------------------------------------------------------- tables
def write_table(run: SynthRun, path: Path, times: Path | None = None) -> list[Path]:
    """A CSV of step, prompt_id, sample, response_length, prompt_length, reward (one row per
    response), and optionally a CSV of step, rollout_s."""
    lines = ["step,prompt_id,sample,response_length,prompt_length,reward"]
    for step, groups in enumerate(run.steps):
        for g in groups:
            lines += [f"{step},{g.key},{i},{n},{g.prompt_len},{g.rewards[i]:g}"
                      for i, n in enumerate(g.lengths)]
    path.write_text("\n".join(lines) + "\n")
    out = [path]
    if times is not None:
        times.write_text("step,rollout_s\n"
                         + "".join(f"{k},{t:.6f}\n" for k, t in enumerate(run.rollout_s)))
        out.append(times)
    return out
