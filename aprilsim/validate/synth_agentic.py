"""Synthetic multi-turn (agentic) run logs with known ground truth, in slime's and verl's formats.

Simulate an agentic scenario (`[workload.episodes]`) and write the episodes each step trained
the way the frameworks' own multi-turn code writes them:

* slime: `Sample.to_dict()` of a custom multi-turn generate function (its
  `examples/search-r1/generate_with_search.py`): ``tokens`` = prompt ids + response ids, the
  response being each turn's model ids followed by the tool output's ids; ``response_length`` =
  every response token; ``loss_mask`` = 1 per model token, 0 per tool token;
  ``non_generation_time`` = the seconds spent outside generation (the tool calls); the caller
  ``torch.save``s each step's ``{"rollout_id", "samples"}`` to ``rollout_data/{id}.pt``.
* verl: ``_dump_generations``'s lines (``input``, ``output``, ``score``, ``step``), the output
  being the decoded response of its tool agent loop: model text, then each tool response as the
  Hermes/Qwen chat template renders it with the special tokens skipped (``user`` /
  ``<tool_response>`` ... ``</tool_response>`` / ``assistant``), one word per token
  (`synth_log.write_tokenizer`'s word-level tokenizer counts them back).

`tests/data/make_replay_logs.py` writes the shipped multi-turn example with these.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from aprilsim.config import Scenario
from aprilsim.types import Group, Sample
from aprilsim.validate.synth_log import VOCAB

__all__ = ["agentic_batches", "slime_episode_dumps", "verl_episode_lines"]


def agentic_batches(sc: Scenario, scheduler: str = "sync",
                    seed: int | None = None) -> list[tuple[Group, ...]]:
    """Simulate `scheduler` on agentic scenario `sc`: the batch each step trained."""
    from aprilsim.sim.build import build_simulation
    from aprilsim.validate.from_log import BatchRecorder
    from aprilsim.validate.scaled import make_policy

    rec = BatchRecorder(make_policy(sc, scheduler))
    build_simulation(sc, rec, seed=seed).run()
    return [groups for _, groups in rec.batches]


def _turns(s: Sample) -> list[tuple[int, int]]:
    """(model tokens, tool tokens after them) per turn of a trained episode."""
    ep = s.episode
    assert ep is not None
    out, start = [], 0
    for k, end in enumerate(ep._ends):
        out.append((end - start, ep._tool_tokens[k] if k < len(ep._tool_tokens) else 0))
        start = end
    return out


def _slime_sample(g: Group, s: Sample, rng: random.Random) -> dict[str, Any]:
    """A dict with the fields of slime's `Sample.to_dict()` as a multi-turn generate fills it."""
    prompt = [rng.randrange(2, 200) for _ in range(g.prompt_len)]
    response: list[int] = []
    mask: list[int] = []
    for gen, tool in _turns(s):
        response += [rng.randrange(2, 200) for _ in range(gen)]
        mask += [1] * gen
        response += [rng.randrange(200, 400) for _ in range(tool)]
        mask += [0] * tool
    ep = s.episode
    assert ep is not None
    return {
        "group_index": g.prompt_key, "index": g.prompt_key * g.size + s.index, "rollout_id": None,
        "prompt": f"question {g.prompt_key}", "tokens": prompt + response,
        "response": "", "response_length": len(response), "label": "42",
        "reward": float(s._reward or 0.0), "loss_mask": mask,
        "weight_versions": [], "rollout_log_probs": None, "remove_sample": False,
        "status": "truncated" if s.truncated else "completed", "metadata": {},
        "generate_function_path": "generate_with_search.generate", "train_metadata": None,
        "non_generation_time": ep.tool_time_s,
    }


def slime_episode_dumps(batches: list[tuple[Group, ...]]) -> list[dict[str, Any]]:
    """Per step the dict slime's ``--save-debug-rollout-data`` saves for a multi-turn run."""
    rng = random.Random(3)
    return [{"rollout_id": step, "samples": [_slime_sample(g, s, rng) for g in groups
                                              for s in g.samples]}
            for step, groups in enumerate(batches)]


def _words(n: int, rng: random.Random) -> str:
    return " ".join(f"w{rng.randrange(VOCAB)}" for _ in range(n))


def _verl_output(s: Sample, rng: random.Random) -> str:
    """An episode's decoded response as verl's tool agent loop dumps it (one word per token;
    the tool response's frame words `user`, `<tool_response>`, `</tool_response>`,
    `assistant` are 4 of its tool tokens)."""
    parts = []
    for gen, tool in _turns(s):
        parts.append(_words(gen, rng))
        if tool:
            inner = _words(max(0, tool - 4), rng)
            parts.append(f"user <tool_response> {inner} </tool_response> assistant")
    return " ".join(p for p in parts if p)


def verl_episode_lines(batches: list[tuple[Group, ...]]) -> dict[int, str]:
    """Per verl step (from 1) the text of ``{step}.jsonl`` for a multi-turn run (each response
    line with the ``uid`` of its prompt)."""
    rng = random.Random(4)
    out = {}
    for k, groups in enumerate(batches):
        rows = []
        for g in groups:
            prompt = _words(g.prompt_len, rng)
            for s in g.samples:
                rows.append({"input": prompt, "output": _verl_output(s, rng), "gts": "42",
                             "score": float(s._reward or 0.0), "step": k + 1,
                             "uid": f"p{g.prompt_key}"})
        out[k + 1] = "\n".join(json.dumps(r) for r in rows) + "\n"
    return out


def write_verl(batches: list[tuple[Group, ...]], out: Path) -> list[Path]:
    """``out/{step}.jsonl`` for each step (verl's ``rollout_data_dir``)."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for step, text in verl_episode_lines(batches).items():
        p = out / f"{step}.jsonl"
        p.write_text(text)
        paths.append(p)
    return paths
