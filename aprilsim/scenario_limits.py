"""What a scenario may ask for: strict knob types and the bounds of what can be simulated.

Every check here runs before any simulation, so an input that would hang (a billion engines, ten
million groups a round), overflow (`ratio = inf`) or give a silently wrong answer (the string
"false" as a boolean, a clock past float64's resolution) is refused with one line naming the key
and saying why. `Scenario.check` calls `check_limits`; `registry.make_scheduler` calls
`aprilsim.knob_types.check_knob_types`, so knobs set from the command line meet the same rules.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

MAX_ENGINES = 16_384  # engine replicas: each is simulated every step, busy or idle (10k: ~6 s)
MAX_REQUESTS_PER_STEP = 1_000_000  # samples a scheduler may submit in one step (estimate)
MAX_STEPS = 100_000  # training steps of one run: each costs >= ~2 ms of CPU and keeps its record
MAX_RUN_REQUESTS = 200_000_000  # samples of one run (steps x per step): ~1 h of CPU at ~50k/s
MAX_CLOCK_S = 1e9  # simulated seconds: past this, float64 seconds stop resolving a decode step
MAX_FILE_BYTES = 16 * 2**20  # a scenario, preset or length-model file
MAX_TOML_DEPTH = 64  # nested tables/arrays in one file (tomllib recurses per level)


class LimitError(ValueError):
    """A value outside what can be simulated; the message is one line naming the key."""


# ------------------------------------------------------------------------------ files
def read_text_bounded(path: Path, what: str) -> str:
    """A small regular text file's content; LimitError for a folder, a device or a huge file."""
    try:
        if path.is_dir():
            raise LimitError(f"{what}: {path} is a folder, not a file")
        if path.exists() and not path.is_file():
            raise LimitError(f"{what}: {path} is not a regular file")
        size = path.stat().st_size
    except OSError as e:
        raise LimitError(f"{what}: cannot read {path}: {e.strerror}") from None
    if size > MAX_FILE_BYTES:
        raise LimitError(f"{what}: {path} is {size:,} bytes; a scenario file is at most "
                         f"{MAX_FILE_BYTES:,}")
    try:
        return path.read_text()
    except UnicodeDecodeError:
        raise LimitError(f"{what}: {path} is not UTF-8 text") from None
    except OSError as e:
        raise LimitError(f"{what}: cannot read {path}: {e.strerror}") from None


def toml_depth(text: str) -> int:
    """An upper bound on the nesting depth of inline tables and arrays (brackets outside
    strings)."""
    depth = best = 0
    quote = ""
    i = 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\" and quote == '"':
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch == "#":
            j = text.find("\n", i)
            i = len(text) if j < 0 else j
        elif ch in "[{":
            depth += 1
            best = max(best, depth)
        elif ch in "]}":
            depth = max(0, depth - 1)
        elif ch == "\n":
            quote = ""
        i += 1
    return best


def parse_toml(text: str, origin: str) -> dict[str, Any]:
    """tomllib.loads, with nesting bounded first (tomllib recurses once per level)."""
    if toml_depth(text) > MAX_TOML_DEPTH:
        raise LimitError(f"{origin}: tables or arrays nested deeper than {MAX_TOML_DEPTH} levels")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise LimitError(f"{origin}: not valid TOML ({e})") from None
    except RecursionError:
        raise LimitError(f"{origin}: nested too deeply to parse") from None


# ------------------------------------------------------------------------------ sizes
def requests_per_step(name: str, settings: dict[str, Any], batch_size: int, group_size: int,
                      max_len: int = 0) -> float:
    """An upper estimate of the requests scheduler `name` submits in one step (known knobs only;
    Seer's pieces of `chunk` tokens count one request each, up to `max_len` tokens a response)."""
    n, g = batch_size, group_size
    s = settings
    if name in ("seer", "seer_history"):
        chunk = int(s.get("chunk", 2048))
        return float(n) * g * (math.ceil(max_len / chunk) if chunk > 0 and max_len else 1)
    if name in ("april", "april_ds"):  # in flight, plus fresh replacements (token budget, filter)
        replaced = name == "april_ds" or s.get("token_budget") is not None
        return (float(s.get("ratio", 2.0))
                + (float(s.get("max_new_groups", 8.0)) if replaced else 0.0)) * n * g
    if name == "dynamic_sampling":
        return float(s.get("gen_batch_size") or n) * g
    if name == "tail_batching":
        return float(s.get("prompt_ratio", 1.25)) * n * (g + float(s.get("extra_responses", 2)))
    if name in ("fully_async", "env_async"):
        return float(s.get("inflight_ratio", 2.0 if name == "fully_async" else 1.5)) * n * g
    return float(n) * g


DEFAULT_MAX_PROMPT_LEN = 2048  # `prompts.max_len` when a scenario does not set it


def whole_tokens(value: Any, key: str) -> int:
    """`value` as a whole number of tokens; LimitError naming `key` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value != int(value):
        raise LimitError(f"{key}: expected a whole number of tokens, got {value!r}")
    return int(value)


def check_limits(sc: Any) -> None:
    """LimitError (one line, naming the key and why) when `sc` asks for what cannot be simulated."""
    if not sc.compare:
        raise LimitError("compare: the list is empty; name at least one scheduler "
                         "(see `aprilsim schedulers`)")
    if sc.cluster.engines > MAX_ENGINES:
        raise LimitError(f"cluster.engines: {sc.cluster.engines:,} engines is more than the "
                         f"{MAX_ENGINES:,} the simulator holds in memory")
    if sc.batch_size * sc.group_size > MAX_REQUESTS_PER_STEP:
        raise LimitError(
            f"batch_size: {sc.batch_size:,} groups x {sc.group_size:,} samples per step is more "
            f"than the {MAX_REQUESTS_PER_STEP:,} requests one step may simulate")
    if sc.steps > MAX_STEPS:
        raise LimitError(
            f"steps: {sc.steps:,} training steps is more than the {MAX_STEPS:,} one run may "
            "simulate (each step costs at least ~2 ms of CPU and keeps its record)")
    check_run_size(sc.steps, float(sc.batch_size) * sc.group_size, "steps")
    max_prompt = sc.max_prompt_len
    if max_prompt < 1:
        raise LimitError(f"prompts.max_len: must be >= 1, got {max_prompt}")
    tr = sc.trainer
    per_step = tr.base_s + tr.sync_s + tr.per_token_s * sc.batch_size * sc.group_size * (
        sc.max_response_len + max_prompt)
    if per_step * sc.steps > MAX_CLOCK_S:
        raise LimitError(
            f"trainer: up to {per_step:.3g} s of training per step x {sc.steps} steps puts the "
            f"simulated clock past {MAX_CLOCK_S:.0e} s, where float64 seconds no longer resolve "
            "an engine's decode step (check base_s, sync_s, per_token_s)")
    k = sc.cluster.abort_steps
    if k is not None and k > sc.max_response_len:
        raise LimitError(
            f"cluster.abort_steps: {k:,} decode steps is longer than the longest response "
            f"(max_response_len {sc.max_response_len:,}): every request would end before its "
            "abort landed; use at most max_response_len (or -1: aborts land at once)")
    for name in dict.fromkeys([*sc.compare, *sc.schedulers]):
        check_scheduler_limits(sc, name, sc.settings_for(name))


OVER_PROVISIONING = "the scheduler's over-provisioning knobs"
_MULTIPLIERS = {"seer": "raise its chunk (tokens per piece; 0: one piece)"}
_MULTIPLIERS["seer_history"] = _MULTIPLIERS["seer"]


def check_scheduler_limits(sc: Any, name: str, settings: dict[str, Any]) -> None:
    """LimitError when scheduler `name` at knob `settings` asks `sc` for more than can be
    simulated: declared types first, then its requests per step and per run. The one check of a
    knob, however it was set (a file, `--set`, `-s NAME@knob=v`, Python)."""
    from aprilsim.knob_types import check_knob_types
    from aprilsim.policies.registry import REGISTRY

    cls = REGISTRY.get(name)
    if cls is None:
        return  # a user's class: its own checks
    check_knob_types(cls, settings, name)
    try:
        est = requests_per_step(name, settings, sc.batch_size, sc.group_size, sc.max_response_len)
    except (TypeError, ValueError):
        return  # a knob of the wrong type: the constructor's check names it
    episodes = getattr(getattr(sc, "workload", None), "episodes", None)
    if episodes is not None:  # an episode sends a request per turn
        est *= episodes.max_turns
    if est > MAX_REQUESTS_PER_STEP:
        raise LimitError(
            f"schedulers.{name}: about {est:,.0f} requests per step ({sc.batch_size:,} groups "
            f"x {sc.group_size:,} samples with its knobs) is more than the "
            f"{MAX_REQUESTS_PER_STEP:,} one step may simulate; lower batch_size, "
            f"group_size or {_MULTIPLIERS.get(name, OVER_PROVISIONING)}")
    check_run_size(sc.steps, est, f"schedulers.{name}")


def check_run_size(steps: int, per_step: float, key: str) -> None:
    """LimitError when `steps` x `per_step` requests is more than one run may simulate."""
    total = steps * per_step
    if total > MAX_RUN_REQUESTS:
        raise LimitError(
            f"{key}: about {total:,.0f} requests in the run ({steps:,} steps x {per_step:,.0f} "
            f"a step) is more than the {MAX_RUN_REQUESTS:,} one run may simulate (about an hour "
            "of CPU at ~50,000 samples per CPU second); lower steps or the work per step")
