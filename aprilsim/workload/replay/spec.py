"""`lengths = { replay = "LOG", ... }` in a scenario: read the log once, build the workload.

The scenario's `lengths` table takes `replay` (a path, relative to the scenario file) in place of
a length model; its other keys are those of `ReplaySpec`. The log's prompt lengths and rewards
replace the scenario's `[prompts]` and `[workload.rewards]` models where they are logged; those
models draw what is missing. `max_response_len` caps the logged lengths (say so in the notes).
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from aprilsim.workload.replay.frameworks import looks_like_verl, slime_rows, verl_rows
from aprilsim.workload.replay.log import ReplayLogError, RunLog
from aprilsim.workload.replay.source import CAVEAT, ReplayWorkload
from aprilsim.workload.replay.tables import table_rows
from aprilsim.workload.replay.timing import TimingError, read_timing

FORMATS = ("auto", "slime", "verl", "table")


class ReplaySpec(BaseModel):
    """The keys of `lengths = { replay = ... }`."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    # the log: slime's rollout_data dir or a .pt, verl's rollout_data_dir or a .jsonl, a table
    replay: str
    format: Literal["auto", "slime", "verl", "table"] = "auto"
    exhausted: Literal["wrap", "stop"] = "wrap"  # more groups asked than logged: repeat, or fail
    # group order: "step" (the log's steps in turn), "prompt" (by prompt index: the run's draw
    # order), "auto" (prompt for slime, whose group_index counts prompts as drawn; else step)
    order: Literal["auto", "step", "prompt"] = "auto"
    # prompt order only: prompts the run drew but never trained (gaps in the prompt indices)
    unlogged: Literal["skip", "cap", "draw"] = "skip"
    timing: str | None = None  # per-step rollout times (validate --from-log)
    # the metric the times are read under (default: slime's perf/rollout_time, verl's
    # timing_s/gen, a table's rollout-time column): e.g. timing_s/generate_sequences
    timing_key: str | None = None
    tokenizer: str | None = None  # verl: the run's tokenizer.json, to count tokens of the text
    eos_tokens: int = Field(default=0, ge=0)  # verl: added to each re-tokenised response (its EOS)
    # verl: the chat template's special tokens around each re-tokenised prompt (default: those of
    # a template the tokenizer names, ChatML 3 or Llama 3 6, else 0 with a note)
    prompt_special_tokens: int | None = Field(default=None, ge=0)
    reward_key: str | None = None  # slime: the key of a dict reward; verl: the field to read
    length_column: str | None = None  # tables: columns, when not detected by name
    group_column: str | None = None
    step_column: str | None = None
    prompt_column: str | None = None
    reward_column: str | None = None
    max_groups: int | None = Field(default=None, ge=1)  # replay only the log's first N groups
    # multi-turn logs: seconds per tool call where the log has none (an assumption; slime's
    # non_generation_time, where logged, is split over the sample's calls)
    tool_s: float = Field(default=0.5, ge=0)


def parse_spec(d: dict[str, Any]) -> ReplaySpec:
    """A validated spec; ValueError with one line naming the key."""
    try:
        return ReplaySpec.model_validate(d)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
        raise ValueError(f"{loc}: {msg}") from None


def detect_log_format(path: Path) -> str:
    """slime (``.pt`` files), verl (JSONL with input and output) or a table."""
    if path.is_dir():
        if any(p.suffix == ".pt" for p in path.iterdir()):
            return "slime"
        jsonl = sorted(p for p in path.iterdir() if p.suffix == ".jsonl")
        if jsonl:
            from aprilsim.workload.fitting.sources import refuse_binary

            refuse_binary(jsonl[0], "verl dump", ReplayLogError)  # before reading its first line
            return "verl" if looks_like_verl(path) else "table"
        raise ReplayLogError(f"{path}: a directory without slime (.pt) or verl (.jsonl) dumps")
    if path.suffix == ".pt":
        return "slime"
    if path.suffix in (".jsonl", ".ndjson") and looks_like_verl(path):
        return "verl"
    return "table"


def read_run_log(path: str | Path, spec: ReplaySpec | None = None) -> RunLog:
    """The run log at `path` (read once per file version and options)."""
    p = Path(path).resolve()
    if not p.exists():
        raise ReplayLogError(f"{path}: no such file or directory")
    spec = spec or ReplaySpec(replay=str(p))
    mtime = max([p.stat().st_mtime, *(q.stat().st_mtime for q in p.iterdir())] if p.is_dir()
                else [p.stat().st_mtime])
    timing = None
    if spec.timing:
        tp = Path(spec.timing).resolve()
        timing = (str(tp), tp.stat().st_mtime if tp.exists() else 0.0, spec.timing_key)
    return _read_cached(str(p), mtime, spec.model_copy(update={"replay": str(p), "timing": None,
                                                               "timing_key": None}), timing)


@lru_cache(maxsize=16)
def _read_cached(path: str, mtime: float, spec: ReplaySpec,
                 timing: tuple[str, float, str | None] | None) -> RunLog:
    p = Path(path)
    fmt = detect_log_format(p) if spec.format == "auto" else spec.format
    if fmt == "slime":
        rows, notes = slime_rows(p, spec.reward_key)
    elif fmt == "verl":
        rows, notes = verl_rows(p, spec.tokenizer, spec.reward_key, spec.eos_tokens,
                                spec.prompt_special_tokens)
    else:
        if p.is_dir():
            raise ReplayLogError(f"{p}: a table log must be one file")
        rows, notes = table_rows(p, length_column=spec.length_column,
                                 group_column=spec.group_column,
                                 step_column=spec.step_column, prompt_column=spec.prompt_column,
                                 reward_column=spec.reward_column)
    order = spec.order if spec.order != "auto" else ("prompt" if fmt == "slime" else "step")
    if order == "prompt" and fmt == "slime" and any(r.key[0] != "group" for r in rows):
        order = "step"  # a custom rollout without group_index: the log's order
    if fmt == "table" and order == "prompt":
        rows = [replace(r, key=("group", int(float(r.key[1])))) if _is_int(r.key[1]) else r
                for r in rows]
    run = RunLog.from_rows(rows, source=str(p), fmt=fmt, notes=notes, order=order)
    if spec.max_groups is not None and spec.max_groups < len(run.groups):
        run.groups = run.groups[: spec.max_groups]
        run.notes.append(f"only the log's first {spec.max_groups} groups replayed (max_groups)")
    if timing is not None:
        t = read_timing(timing[0], key=timing[2])
        run.rollout_s = t.times
        run.timing = f"{t.key} ({t.kind} {t.source}): {t.span}"
    return run


def _is_int(x: Any) -> bool:
    try:
        return float(x) == int(float(x))
    except (TypeError, ValueError):
        return False


def replay_workload(spec: ReplaySpec, base_dir: str | Path, *, max_len: int,
                    fallback: Any) -> ReplayWorkload:
    """The workload of a scenario's replay spec (paths relative to `base_dir`)."""
    def rel(x: str | None) -> str | None:
        if x is None:
            return None
        q = Path(x)
        return str(q if q.is_absolute() else Path(base_dir) / q)

    spec = spec.model_copy(update={"timing": rel(spec.timing), "tokenizer": rel(spec.tokenizer)})
    run = read_run_log(rel(spec.replay) or spec.replay, spec)
    wl = ReplayWorkload(run, max_len=max_len, exhausted=spec.exhausted, fallback=fallback,
                        unlogged=spec.unlogged)
    wl.tool_s = spec.tool_s  # seconds per tool call where a multi-turn log has none
    return wl


def notes_for(workload: Any) -> list[str]:
    """What a command prints before simulating a replay workload (nothing for other workloads)."""
    if not isinstance(workload, ReplayWorkload):
        return []
    run = workload.run
    out = [f"replay: {run.describe()}", *(f"replay: {n}" for n in run.notes)]
    if workload.n_capped:
        out.append(f"replay: {workload.n_capped} logged responses are longer than "
                   f"max_response_len {workload.max_len} and are capped there")
    if run.timing:
        out.append(f"replay: logged times: {run.timing}")
    out.append(f"replay: more groups than logged: {workload.exhausted} "
               f"({'repeat the log from its first group' if workload.exhausted == 'wrap' else 'stop with an error'})")
    turns = [t for g in workload.groups for t in (g.turns or ()) if t is not None]
    if turns:
        timed = sum(t.tool_s is not None for t in turns)
        out.append(f"replay: {len(turns)} multi-turn responses replayed as episodes; tool time "
                   f"logged for {timed}, {workload.tool_s:g} s per call assumed for the rest "
                   "(lengths.tool_s)")
    out.append(CAVEAT)
    return out


__all__ = ["FORMATS", "ReplaySpec", "detect_log_format", "notes_for", "parse_spec",
           "scenario_notes", "scenario_workload",
           "read_run_log", "replay_workload"]


# never read: lengths are logged
_FALLBACK_LENGTHS = {"family": "lognormal", "mu": 6.0, "sigma": 0.5}


def scenario_workload(scenario: Any, seed: int | None = None) -> ReplayWorkload:
    """The replay workload of a scenario whose `lengths` holds `replay` (ValueError, one line)."""
    try:
        spec = parse_spec(dict(scenario.lengths))
    except ValueError as e:
        raise ValueError(f"lengths.{e}") from None
    fallback = scenario.model_copy(update={"lengths": _FALLBACK_LENGTHS}).workload_for(seed)
    try:
        wl = replay_workload(spec, scenario.base_dir, max_len=scenario.max_response_len,
                             fallback=fallback)
    except TimingError as e:  # the timing file's fault, not the log's
        raise ValueError(f"lengths.timing: {e}") from None
    except (ValueError, OSError) as e:
        raise ValueError(f"lengths.replay: {e}") from None
    kv = scenario.engine_spec().kv_capacity
    longest = max(p for p, _, _ in wl._fill) + wl.max_len
    if longest > kv:
        raise ValueError(f"cluster.kv_capacity: {kv} tokens is smaller than the log's longest "
                         f"prompt plus max_response_len ({longest})")
    return wl


def scenario_notes(scenario: Any, seed: int | None = None) -> list[str]:
    """`notes_for` the scenario's workload when it replays a log; [] otherwise (nothing read)."""
    if "replay" not in getattr(scenario, "lengths", {}):
        return []
    wl = scenario.workload_for(seed)
    out = notes_for(wl)
    run = wl.run
    if (scenario.batch_size, scenario.group_size) != (run.batch_size, run.group_size):
        out.insert(1, f"replay: the log's steps hold {run.batch_size} groups x {run.group_size} "
                      f"responses; the scenario trains batch_size {scenario.batch_size} (its "
                      f"group_size {scenario.group_size} is not used: groups keep their logged n)")
    return out
