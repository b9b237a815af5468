"""Readers of what RL frameworks write about their rollouts, into `LoggedRow`s.

- slime, ``--save-debug-rollout-data`` (or ``--dump-details DIR``, which sets it to
  ``DIR/rollout_data/{rollout_id}.pt``): one ``torch.save`` per rollout of
  ``{"rollout_id": id, "samples": [Sample.to_dict(), ...]}`` (``slime/observability/
  rollout_data_utils.py``). A sample dict has ``group_index``, ``index``, ``tokens`` (prompt and
  response), ``response_length``, ``reward`` (a number, or a dict read at ``reward_key``),
  ``status`` (``completed``, ``truncated``, ``aborted``, ...) and ``metadata``, where partial
  rollout marks a response resumed from an earlier rollout with ``start_rollout_id``.
  Evaluation dumps, the same template formatted with ``eval_{id}`` (``eval_3.pt``,
  ``rollout_eval_3.pt``: their ``rollout_id`` is the training step's), are skipped, as are the
  objects replay does not read (a vision-language run's PIL images, counted in a note).
- verl, ``trainer.rollout_data_dir``: one ``{global_step}.jsonl`` per step written by the
  trainer's ``_dump_generations``, a line per response with ``input`` and ``output`` (decoded
  text), ``gts``, ``score``, ``step`` and the reward function's extra fields. It holds text, not
  token counts: a ``response_length`` (and ``prompt_length``) field, if the reward function adds
  one, is used; otherwise the text is tokenised again with the run's tokenizer (``tokenizer =
  "path/to/tokenizer.json"``, read by the ``tokenizers`` package), which drops the special
  tokens the dump skipped (EOS). Responses of one prompt are those with the same ``uid`` if
  logged, else the same ``input`` text within the step.

slime's ``.pt`` files are read without torch (`torch_pickle`); tokenizers is imported only
when a verl dump must be tokenised.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from aprilsim.workload.replay.log import LoggedRow, ReplayLogError
from aprilsim.workload.replay.torch_pickle import load_torch_save
from aprilsim.workload.replay.turns import LoggedTurns, turns_from_mask, turns_from_text

REWARD_KEYS = ("score", "reward", "acc", "accuracy")
_EVAL = re.compile(r"(?<![A-Za-z0-9])eval_\d+(?!\d)")  # slime's template at rollout_id=eval_N
LENGTH_FIELDS = ("response_length", "response_len", "output_length", "num_output_tokens",
                 "completion_tokens", "response_tokens")
PROMPT_FIELDS = ("prompt_length", "prompt_len", "input_length", "num_prompt_tokens",
                 "prompt_tokens")


def _number(v: Any) -> float | None:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    item = getattr(v, "item", None)  # a 0-d tensor or numpy scalar
    if callable(item):
        try:
            x = item()
        except (TypeError, ValueError, RuntimeError):
            return None
        return float(x) if isinstance(x, (int, float, bool)) else None
    return None


def reward_of(v: Any, key: str | None = None) -> float | None:
    """A logged reward as a number: itself, or a dict's `key` (else its first known key)."""
    if isinstance(v, dict):
        keys = (key,) if key else REWARD_KEYS
        for k in keys:
            if k in v and _number(v[k]) is not None:
                return _number(v[k])
        return None
    return _number(v)


def _digits(stem: str) -> int:
    """The last number in a file name (0 when none): ``rollout_12`` -> 12."""
    found = re.findall(r"\d+", stem)
    return int(found[-1]) if found else 0


def _step_files(path: Path, suffix: str) -> list[tuple[int, Path]]:
    """(step, file) of a dump directory's per-step files ``{step}{suffix}``, ascending."""
    if path.is_file():
        m = re.fullmatch(r"(\d+)", path.stem)
        return [(int(m.group(1)) if m else 0, path)]
    if not path.is_dir():
        raise ReplayLogError(f"{path}: no such file or directory")
    out = [(int(p.stem), p) for p in path.iterdir() if p.suffix == suffix and p.stem.isdigit()]
    if not out:
        raise ReplayLogError(f"{path}: no per-step files named STEP{suffix} found")
    return sorted(out)


# ---------------------------------------------------------------------------------------- slime
def _length_of(v: Any) -> int:
    if v is None:
        return 0
    shape = getattr(v, "shape", None)
    if shape is not None:
        return int(v.numel()) if hasattr(v, "numel") else int(v.size)
    return len(v)


def slime_rows(path: str | Path,
               reward_key: str | None = None) -> tuple[list[LoggedRow], list[str]]:
    """Rows of slime debug rollout dumps: a ``rollout_data`` directory or one ``{id}.pt``."""
    p = Path(path)
    rows: list[LoggedRow] = []
    notes: list[str] = []
    if not p.is_dir() and _EVAL.search(p.name):
        raise ReplayLogError(f"{p}: an evaluation dump (the template formatted with eval_ID), "
                             "not a training rollout; give the training dumps")
    skipped = sorted(q.name for q in p.iterdir() if _EVAL.search(q.name)) if p.is_dir() else []
    if skipped:
        notes.append(f"{len(skipped)} evaluation dumps (*eval_N*.pt, e.g. {skipped[0]}) skipped")
    aborted = multi = 0
    objects: Counter[str] = Counter()
    if p.is_dir():  # any path template: every .pt but the evaluation dumps, step from the dict
        files = [(_digits(q.stem), q) for q in sorted(p.iterdir())
                 if q.suffix == ".pt" and not _EVAL.search(q.name)]
        if not files:
            raise ReplayLogError(f"{p}: no slime rollout dumps (*.pt) found")
    else:
        files = _step_files(p, ".pt")
    for file_step, f in files:
        data = load_torch_save(f, objects)
        if not isinstance(data, dict) or not isinstance(data.get("samples"), list):
            raise ReplayLogError(f"{f}: not a slime debug rollout dump (a dict with 'samples')")
        step = int(data.get("rollout_id", file_step))
        for j, s in enumerate(data["samples"]):
            if not isinstance(s, dict) or "response_length" not in s:
                raise ReplayLogError(f"{f}: sample {j} has no response_length")
            resp = int(s["response_length"])
            tokens = s.get("tokens")
            prompt = _length_of(tokens) - resp if tokens is not None else None
            gen, turns = slime_turns(s, resp)
            multi += turns is not None
            meta = s.get("metadata") or {}
            start = meta.get("start_rollout_id") if isinstance(meta, dict) else None
            status = s.get("status")
            status = getattr(status, "value", status)
            aborted += status == "aborted"
            gi = s.get("group_index")
            gi = int(_number(gi)) if _number(gi) is not None else gi  # numpy/0-d tensor ints too
            key = ("group", gi) if gi is not None else ("prompt", str(s.get("prompt", j)))
            rows.append(LoggedRow(step=step, key=key, length=gen,
                                  prompt_len=prompt if prompt is not None and prompt > 0 else None,
                                  reward=reward_of(s.get("reward"), reward_key),
                                  resumed=start is not None and int(start) != step,
                                  status=str(status) if status is not None else None, turns=turns))
    if aborted:
        notes.append(f"{aborted} responses logged as aborted are replayed with their logged length")
    if objects:
        notes.append("objects replay does not read, skipped: " + ", ".join(
            f"{n:,} {name}" for name, n in objects.most_common()))
    if multi:
        notes.append(f"{multi} multi-turn responses (loss_mask): replayed as episodes, their tool "
                     "tokens prefilled, not generated")
    return rows, notes


def slime_turns(sample: dict[str, Any], resp: int) -> tuple[int, LoggedTurns | None]:
    """(tokens the model generated, its turns where multi-turn) of a slime sample dict: with a
    ``loss_mask`` of one entry per response token, the ones (the zeros are tool outputs,
    `turns.turns_from_mask`; ``non_generation_time`` is their seconds); else the response."""
    mask = sample.get("loss_mask")
    if not isinstance(mask, (list, tuple)) and hasattr(mask, "tolist"):
        mask = mask.tolist()  # a tensor
    if not isinstance(mask, (list, tuple)) or len(mask) != resp or not resp:
        return resp, None
    tool_s = _number(sample.get("non_generation_time"))
    return sum(1 for x in mask if x), turns_from_mask(mask, tool_s)


# ---------------------------------------------------------------------------------------- verl
class _Tokenizer:
    """Token counts of decoded text with the run's tokenizer (``tokenizer.json``)."""

    def __init__(self, path: str | Path) -> None:
        p = Path(path)
        if p.is_dir():
            p = p / "tokenizer.json"
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise ReplayLogError("tokenising verl's text dumps needs the tokenizers package "
                                 "(pip install tokenizers)") from None
        try:
            self._tok = Tokenizer.from_file(str(p))
        except Exception as e:
            raise ReplayLogError(f"tokenizer {p}: cannot read ({e})") from None

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def template_specials(self, prompt: str) -> tuple[str, int] | None:
        """(template, special tokens) the chat template put around `prompt`, which the dump's
        decoding skipped: ChatML (Qwen: `<|im_start|>` and `<|im_end|>` around each turn, then
        `<|im_start|>` before the answer; 3 for one user turn, 5 with a system turn) or Llama 3
        (`<|begin_of_text|>`, a header pair per turn, `<|eot_id|>`: 6, or 9). None: unknown."""
        system = prompt.lstrip().startswith("system")  # the role name survives the decoding
        turns = 2 if system else 1
        if self._tok.token_to_id("<|im_start|>") is not None:
            return "ChatML", 2 * turns + 1
        if self._tok.token_to_id("<|start_header_id|>") is not None:
            return "Llama 3", 1 + 3 * turns + 2
        return None


def _field(rec: dict[str, Any], names: tuple[str, ...]) -> int | None:
    for n in names:
        x = _number(rec.get(n))
        if x is not None:
            return int(x)
    return None


def verl_rows(path: str | Path, tokenizer: str | Path | None = None,
              reward_key: str | None = None, eos_tokens: int = 0,
              prompt_special_tokens: int | None = None) -> tuple[list[LoggedRow], list[str]]:
    """Rows of verl rollout dumps: a ``rollout_data_dir`` or one ``{step}.jsonl``; `eos_tokens`
    is added to every re-tokenised response (the EOS the dump's decoding skipped; a truncated
    response, which has none, is capped back to max_response_len by the replay), and to every
    re-tokenised prompt the special tokens of its chat template (`prompt_special_tokens`, else
    those of a template the tokenizer names: ChatML, Llama 3; else none, and a note says so).
    Without a `uid`, the responses of identical prompts in one step are told apart by count."""
    tok = _Tokenizer(tokenizer) if tokenizer else None
    rows: list[LoggedRow] = []
    counted = templates = 0
    multi = 0
    for file_step, f in _step_files(Path(path), ".jsonl"):
        for n, rec in enumerate(_jsonl(f), 1):
            if "output" not in rec and _field(rec, LENGTH_FIELDS) is None:
                raise ReplayLogError(f"{f}:{n}: not a verl rollout dump line (no 'output')")
            length, prompt = _field(rec, LENGTH_FIELDS), _field(rec, PROMPT_FIELDS)
            if length is None:
                if tok is None:
                    raise ReplayLogError(
                        f"{f}: verl dumps hold decoded text, not token counts: give the run's "
                        "tokenizer (lengths.tokenizer = \"path/to/tokenizer.json\") or log a "
                        "response_length field from the reward function")
                length, counted = tok.count(str(rec.get("output", ""))) + eos_tokens, counted + 1
            if prompt is None and tok is not None and "input" in rec:
                prompt, t = _prompt_tokens(tok, str(rec["input"]), prompt_special_tokens)
                templates = templates or t
            key = ("uid", rec["uid"]) if rec.get("uid") is not None else ("input", rec.get("input"))
            turns = verl_turns(rec, tok, eos_tokens)
            if turns is not None:  # an agent loop's response: the model's tokens only
                length, multi = turns.generated, multi + 1
            rows.append(LoggedRow(step=int(rec.get("step", file_step)), key=key, length=length,
                                  prompt_len=prompt or None,
                                  reward=reward_of(rec.get("score") if reward_key is None
                                                   else rec.get(reward_key), None), turns=turns))
    notes = [f"response lengths re-tokenised from verl's decoded text (special tokens skipped; "
             f"{eos_tokens} added for the EOS)"] if counted else []
    if tok is not None:
        notes.append(_template_note(templates, prompt_special_tokens))
    if multi:
        notes.append(f"{multi} multi-turn responses (tool responses in the text): replayed as "
                     "episodes, their tool tokens prefilled, not generated")
    return _split_repeats(rows, notes), notes


def _prompt_tokens(tok: _Tokenizer, text: str, given: int | None) -> tuple[int, str]:
    """A decoded prompt's token count with its chat template's special tokens added back, and
    the template used ("" when none is known: nothing added)."""
    if given is not None:
        return tok.count(text) + given, "given"
    found = tok.template_specials(text)
    return (tok.count(text) + found[1], found[0]) if found else (tok.count(text), "")


def _template_note(template: str, given: int | None) -> str:
    if given is not None:
        return (f"prompt lengths re-tokenised from the decoded text, {given} special tokens of "
                "the chat template added (prompt_special_tokens)")
    if template:
        return (f"prompt lengths re-tokenised from the decoded text, the {template} chat "
                "template's special tokens added back (its decoding skipped them)")
    return ("prompt lengths re-tokenised from the decoded text: the tokenizer names no known "
            "chat template, so its special tokens (3 for a ChatML user turn) are not counted; "
            "set prompt_special_tokens")


def _split_repeats(rows: list[LoggedRow], notes: list[str]) -> list[LoggedRow]:
    """Without verl's `uid`, identical prompts in one step share a key: a key with k times the
    usual group size n of responses is split into k groups of n (in the dump's order), and a
    count that is no multiple of n is kept whole, with a note either way."""
    sizes = Counter((r.step, r.key) for r in rows)
    n = Counter(sizes.values()).most_common(1)[0][0] if sizes else 0
    big = {k: c for k, c in sizes.items() if k[1][0] == "input" and c > n}
    if not big:
        return rows
    split = {k: c for k, c in big.items() if c % n == 0}
    seen: Counter = Counter()
    out = []
    for r in rows:
        k = (r.step, r.key)
        if k in split:
            out.append(replace(r, key=("input", r.key[1], seen[k] // n)))
            seen[k] += 1
        else:
            out.append(r)
    if split:
        counts = ", ".join(str(c) for c in sorted(set(split.values())))
        notes.append(f"{len(split)} prompt(s) logged with {counts} responses in one step and no "
                     f"uid to tell their groups apart: split into groups of {n} "
                     f"({sum(c // n for c in split.values())} groups)")
    if len(split) < len(big):
        bad = [c for k, c in big.items() if k not in split]
        notes.append(f"{len(bad)} prompt(s) logged more often than {n} times in one step with no "
                     f"uid and not a multiple of {n} ({bad[:3]}): each kept as one group")
    return out


def verl_turns(rec: dict[str, Any], tok: Any, eos_tokens: int) -> LoggedTurns | None:
    """The turns of a verl agent-loop response: its decoded ``output`` split at the tool
    responses (`turns.turns_from_text`), counted with the run's tokenizer (None without one,
    or without a tool response)."""
    if tok is None or not isinstance(rec.get("output"), str):
        return None
    return turns_from_text(rec["output"], tok.count, eos_tokens=eos_tokens)


def _jsonl(f: Path) -> Iterator[dict[str, Any]]:
    """The records of a JSONL dump, line by line (binary data and endless lines refused)."""
    from aprilsim.workload.fitting.sources import bounded_lines, refuse_binary

    refuse_binary(f, "verl dump", ReplayLogError)
    with open(f, encoding="utf-8", errors="replace") as fh:
        for n, line in enumerate(bounded_lines(fh, str(f), ReplayLogError), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ReplayLogError(f"{f}:{n}: not valid JSON ({e.msg})") from None
            if not isinstance(rec, dict):
                raise ReplayLogError(f"{f}:{n}: expected a JSON object per line")
            yield rec


def looks_like_verl(path: Path) -> bool:
    """A JSONL file (or a directory of ``{step}.jsonl``) whose first record has input and output."""
    files = _step_files(path, ".jsonl") if path.is_dir() else [(0, path)]
    try:
        first = next(_jsonl(files[0][1]))
    except (StopIteration, ReplayLogError, UnicodeDecodeError, OSError):
        return False
    return "output" in first and "input" in first
