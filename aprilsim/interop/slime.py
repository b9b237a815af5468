"""slime launch flags <-> aprilsim scenarios.

Flag names and meanings follow slime's own argument definitions (`slime/utils/arguments.py`, and
`slime/backends/sglang_utils/arguments.py`, which exposes every SGLang server flag with a
`--sglang-` prefix). Which slime flag becomes which scenario key:

| slime flag | scenario key |
|---|---|
| `--rollout-batch-size` | `batch_size` (groups per step) |
| `--n-samples-per-prompt` | `group_size` |
| `--rollout-max-response-len` | `max_response_len` |
| `--rollout-max-prompt-len` | `prompts.max_len` |
| `--num-rollout` | `steps` |
| `--partial-rollout`, `--over-sampling-batch-size`, `--dynamic-sampling-filter-path`, the entry point (`train_async.py`) | the scheduler (`compare`, `[schedulers.*]`) |
| `--rollout-num-gpus`, `--rollout-num-gpus-per-engine`, `--colocate`, `--actor-num-nodes`, `--actor-num-gpus-per-node` | `cluster.engines` (+ `[launch]`) |
| `--sglang-max-running-requests` | `cluster.max_running` |
| `--sglang-max-total-tokens` | `cluster.kv_capacity` |
| `--sglang-max-prefill-tokens` | `cluster.max_prefill_tokens` |
| `--sglang-chunked-prefill-size` | `cluster.chunked_prefill_size` |
| `--rollout-temperature`, `--global-batch-size`, `--sglang-mem-fraction-static`, `--buffer-filter-path` | `[launch]`: kept for export, not simulated |

Everything else (model architecture, optimizer, data paths, logging...) is listed in one warning.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

from aprilsim.config import Scenario
from aprilsim.interop.common import ImportResult, base_scenario, fit_warmup
from aprilsim.interop.shell import flag_values as _flag_values
from aprilsim.interop.shell import parse_command

ENTRIES = ("train.py", "train_async.py")
NONZERO_STD = "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std"
SWITCHES = frozenset({"--colocate", "--partial-rollout"})

# flag -> (scenario path, type); the scheduler and cluster flags are handled on their own.
_DIRECT: dict[str, tuple[tuple[str, ...], type]] = {
    "--rollout-batch-size": (("batch_size",), int),
    "--n-samples-per-prompt": (("group_size",), int),
    "--rollout-max-response-len": (("max_response_len",), int),
    "--rollout-max-prompt-len": (("prompts", "max_len"), int),
    "--num-rollout": (("steps",), int),
    "--sglang-max-running-requests": (("cluster", "max_running"), int),
    "--sglang-max-total-tokens": (("cluster", "kv_capacity"), int),
    "--sglang-max-prefill-tokens": (("cluster", "max_prefill_tokens"), int),
    "--rollout-temperature": (("launch", "temperature"), float),
    "--global-batch-size": (("launch", "global_batch_size"), int),
    "--sglang-mem-fraction-static": (("launch", "mem_fraction_static"), float),
    "--sglang-chunked-prefill-size": (("cluster", "chunked_prefill_size"), int),
    "--buffer-filter-path": (("launch", "buffer_filter"), str),
    "--dynamic-sampling-filter-path": (("launch", "dynamic_sampling_filter"), str),
    "--actor-num-nodes": (("launch", "trainer_nodes"), int),
    "--actor-num-gpus-per-node": (("launch", "trainer_gpus_per_node"), int),
    "--rollout-num-gpus": (("launch", "rollout_gpus"), int),
    "--rollout-num-gpus-per-engine": (("launch", "gpus_per_engine"), int),
}
_SCHEDULER_FLAGS = ("--partial-rollout", "--over-sampling-batch-size", "--colocate")
MAPPED_FLAGS: tuple[str, ...] = (*_DIRECT, *_SCHEDULER_FLAGS)


def parse_flags(text: str) -> tuple[str | None, dict[str, list[str]], list[str]]:
    """(entry point, flag -> values, arrays used but not defined) of a script or argument string."""
    cmd = parse_command(text, ENTRIES)
    return cmd.entry, _flag_values(cmd.argv, SWITCHES), cmd.unresolved


def _put(data: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    d = data
    for k in path[:-1]:
        d = d.setdefault(k, {})
    d[path[-1]] = value


def _convert(flag: str, values: list[str], typ: type) -> Any:
    if len(values) != 1:
        raise ValueError(f"{flag}: expected one value, got {len(values)}")
    try:
        return typ(values[0])
    except ValueError:
        raise ValueError(f"{flag}: {values[0]!r} is not {typ.__name__}") from None


def from_slime(text: str) -> ImportResult:
    """Map a slime launch script or argument string to a scenario dict (see the module table)."""
    entry, flags, unresolved = parse_flags(text)
    if not flags:
        raise ValueError("no slime flags found (give a launch script or its --flags as one string)")
    data = base_scenario()
    data["name"] = "slime-import"
    res = ImportResult(data=data)
    for flag, values in flags.items():
        if flag in _DIRECT:
            path, typ = _DIRECT[flag]
            value = _convert(flag, values, typ)
            res.mapped[flag] = value
            _put(data, path, value)
        elif flag in _SCHEDULER_FLAGS:
            res.mapped[flag] = True if flag in SWITCHES else _convert(flag, values, int)
        else:
            res.unmapped.append(flag)
    res.unmapped += [f"${{{name}[@]}} (array not defined in the script)" for name in unresolved]
    _cluster(res, flags)
    _scheduler(res, entry)
    fit_warmup(res)
    if "--buffer-filter-path" in res.mapped:
        res.notes.append("--buffer-filter-path: a custom buffer filter is kept for export; the "
                         "simulator resumes partial groups in FIFO order (slime's default pop_first)")
    if "--sglang-mem-fraction-static" in res.mapped and "--sglang-max-total-tokens" not in res.mapped:
        res.notes.append("--sglang-mem-fraction-static: the KV pool it leaves depends on the GPU and "
                         "the model, so cluster.kv_capacity comes from the preset; pass "
                         "--sglang-max-total-tokens to set it exactly")
    return res


def _cluster(res: ImportResult, flags: dict[str, list[str]]) -> None:
    m, launch = res.mapped, res.data.setdefault("launch", {})
    colocate = "--colocate" in flags
    launch["colocate"] = colocate
    per_engine = m.get("--rollout-num-gpus-per-engine", 1)  # slime's default
    gpus = m.get("--rollout-num-gpus")
    if gpus is None and colocate:
        gpus = m.get("--actor-num-nodes", 1) * m.get("--actor-num-gpus-per-node", 8)
    if gpus is None:
        res.notes.append("cluster.engines: no --rollout-num-gpus; kept the default")
        return
    if gpus % per_engine:
        res.notes.append(f"cluster.engines: {gpus} rollout GPUs are not a multiple of "
                         f"{per_engine} GPUs per engine; rounded down")
    res.data["cluster"]["engines"] = max(1, gpus // per_engine)


def _scheduler(res: ImportResult, entry: str | None) -> None:
    m, data = res.mapped, res.data
    batch = int(data["batch_size"])
    osbs = m.get("--over-sampling-batch-size")
    ds = "--dynamic-sampling-filter-path" in m
    if ds and m["--dynamic-sampling-filter-path"].rsplit(".", 1)[-1] not in (
        "check_reward_nonzero_std", "check_reward_nonzero_std_with_fallback"
    ):
        res.notes.append("--dynamic-sampling-filter-path: a custom filter is simulated as DAPO's "
                         "zero-std filter")
    if entry is not None and entry.endswith("train_async.py"):
        name, knobs = "async_one_step", {}
    elif m.get("--partial-rollout") or (osbs is not None and not ds):
        name = "april_ds" if ds else "april"
        knobs = {"ratio": (osbs or batch) / batch, "recycle": bool(m.get("--partial-rollout"))}
    elif ds:
        name, knobs = "dynamic_sampling", ({"gen_batch_size": osbs} if osbs else {})
    else:
        name, knobs = "sync", {}
    data["compare"] = ["sync"] if name == "sync" else ["sync", name]
    data["schedulers"] = {name: knobs} if knobs else {}


# ---------------------------------------------------------------------------------- export
def _target(sc: Scenario, scheduler: str | None) -> str:
    if scheduler is not None:
        return scheduler
    others = [s for s in sc.compare if s != "sync"]
    return others[-1] if others else "sync"


def to_slime(sc: Scenario, scheduler: str | None = None) -> tuple[list[str], list[str]]:
    """(slime argv, notes) that launch `sc` with `scheduler` (default: the last non-sync one).

    Writes every flag `from_slime` maps, so slime -> scenario -> slime keeps them; `notes` name
    scenario settings slime has no flag for.
    """
    name = _target(sc, scheduler)
    notes: list[str] = []
    argv: list[str] = []

    def add(flag: str, value: Any = None) -> None:
        argv.append(flag)
        if value is not None:
            argv.append(str(value))

    add("--rollout-batch-size", sc.batch_size)
    add("--n-samples-per-prompt", sc.group_size)
    add("--rollout-max-response-len", sc.max_response_len)
    add("--rollout-max-prompt-len", int(sc.prompts.get("max_len", 2048)))
    add("--num-rollout", sc.steps)
    notes.append("--num-rollout is the scenario's simulated horizon (steps): set your training "
                 "length before launching")
    la = sc.launch
    if la.temperature is not None:
        add("--rollout-temperature", la.temperature)
    if la.global_batch_size is not None:
        add("--global-batch-size", la.global_batch_size)
    _export_cluster(sc, name, add)
    _export_scheduler(sc, name, add, notes)
    if la.buffer_filter is not None:
        add("--buffer-filter-path", la.buffer_filter)
    c = sc.cluster
    for flag, value in (("--sglang-mem-fraction-static", la.mem_fraction_static),
                        ("--sglang-chunked-prefill-size",
                         c.chunked_prefill_size if c.chunked_prefill_size is not None
                         else la.chunked_prefill_size),
                        ("--sglang-max-running-requests", c.max_running),
                        ("--sglang-max-total-tokens", c.kv_capacity),
                        ("--sglang-max-prefill-tokens", c.max_prefill_tokens)):
        if value is not None:
            add(flag, value)
    if c.new_token_ratio is not None:
        notes.append("cluster.new_token_ratio: SGLang sets it by environment, not by a slime flag")
    return argv, notes


def _export_cluster(sc: Scenario, name: str, add: Any) -> None:
    from aprilsim.policies.registry import make_scheduler

    la = sc.launch
    per_engine = la.gpus_per_engine if la.gpus_per_engine is not None else sc.engine_spec().tp
    gpus = sc.cluster.engines * per_engine
    colocate = la.colocate
    if colocate is None:
        colocate = make_scheduler(name, sc.settings_for(name)).mode == "colocated"
    if la.trainer_nodes is not None:
        add("--actor-num-nodes", la.trainer_nodes)
    if la.trainer_gpus_per_node is not None:
        add("--actor-num-gpus-per-node", la.trainer_gpus_per_node)
    if colocate:
        add("--colocate")
    implied = (la.trainer_nodes or 1) * (la.trainer_gpus_per_node or 8) if colocate else None
    if la.rollout_gpus is not None or implied != gpus:
        add("--rollout-num-gpus", gpus)
    add("--rollout-num-gpus-per-engine", per_engine)


def _export_scheduler(sc: Scenario, name: str, add: Any, notes: list[str]) -> None:
    knobs = sc.settings_for(name)
    ds_filter = sc.launch.dynamic_sampling_filter or NONZERO_STD
    if name in ("april", "april_ds"):
        if knobs.get("recycle", True):
            add("--partial-rollout")
        add("--over-sampling-batch-size", round(float(knobs.get("ratio", 2.0)) * sc.batch_size))
        if name == "april_ds":
            add("--dynamic-sampling-filter-path", ds_filter)
        for k in ("max_staleness", "token_budget"):
            if knobs.get(k) is not None:
                notes.append(f"schedulers.{name}.{k}: slime has no flag for it")
        if knobs.get("resume_order", "fifo") != "fifo":
            notes.append(f"schedulers.{name}.resume_order: slime resumes FIFO unless given a "
                         "--buffer-filter-path implementing this order")
    elif name == "dynamic_sampling":
        add("--dynamic-sampling-filter-path", ds_filter)
        if knobs.get("gen_batch_size") is not None:
            add("--over-sampling-batch-size", knobs["gen_batch_size"])
    elif name == "async_one_step":
        notes.append("async_one_step: launch with slime's train_async.py (not train.py)")
    elif name != "sync":
        notes.append(f"{name}: slime has no built-in counterpart; the flags launch a sync rollout")
    if sc.launch.dynamic_sampling_filter is not None and name not in ("april_ds", "dynamic_sampling"):
        add("--dynamic-sampling-filter-path", ds_filter)


def format_flags(argv: list[str], notes: Sequence[str] = ()) -> str:
    """One flag and its values per line (pastes into a bash array); notes as `#` comments."""
    lines = [f"# {n}" for n in notes]
    for tok in argv:
        if tok.startswith("--") or not lines or lines[-1].startswith("#"):
            lines.append(tok)
        else:
            lines[-1] += " " + shlex.quote(tok)
    return "\n".join(lines) + "\n"
