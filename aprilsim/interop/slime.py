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
| `--partial-rollout`, `--over-sampling-batch-size`, `--dynamic-sampling-filter-path`, `--mask-offpolicy-in-partial-rollout`, `--update-weights-interval`, the entry point (`train_async.py`) | the scheduler (`compare`, `[schedulers.*]`): partial + filter -> `april_ds` (baseline `slime_dapo`), partial -> `april`, filter -> `slime_dapo`, over-sampling alone -> `april` without recycling, none -> `sync`; `train_async.py` -> `async_one_step`, with APRIL's flags `async_april` (an interval > 1: refused, not modelled) |
| `--hf-checkpoint` (model), the script's ROCm variables (GPU), `--rollout-num-gpus-per-engine` | `cluster.preset` (MODEL-GPU-tpN), `trainer.per_token_s` |
| `--prompt-data` (dataset) | `lengths` (per model and dataset, `aprilsim.interop.setups`) |
| `--rollout-num-gpus`, `--rollout-num-gpus-per-engine`, `--colocate`, `--actor-num-nodes`, `--actor-num-gpus-per-node` | `cluster.engines` (+ `[launch]`) |
| `--sglang-max-running-requests` | `cluster.max_running` |
| `--sglang-max-total-tokens` | `cluster.kv_capacity` |
| `--sglang-max-prefill-tokens` | `cluster.max_prefill_tokens` |
| `--sglang-chunked-prefill-size` | `cluster.chunked_prefill_size` |
| `--rollout-temperature`, `--global-batch-size`, `--sglang-mem-fraction-static`, `--buffer-filter-path` | `[launch]`: kept for export, not simulated |

Everything else (model architecture, optimizer, data paths, logging...) is listed in one warning.
"""

from __future__ import annotations

import errno
import math
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aprilsim.interop.setups as setups
from aprilsim.config import Scenario
from aprilsim.interop.common import ImportResult, base_scenario, fit_warmup
from aprilsim.interop.shell import flag_values as _flag_values
from aprilsim.interop.shell import parse_command

ENTRIES = ("train.py", "train_async.py")
NONZERO_STD = "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std"
WITH_FALLBACK = NONZERO_STD + "_with_fallback"  # keeps a rejected group when too few remain
FILTERED = ("april_ds", "slime_dapo", "async_april")  # the schedulers with the dynamic filter
SWITCHES = frozenset({"--colocate", "--partial-rollout", "--mask-offpolicy-in-partial-rollout"})

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
    "--hf-checkpoint": (("launch", "checkpoint"), str),
    "--prompt-data": (("launch", "prompt_data"), str),
    "--actor-num-nodes": (("launch", "trainer_nodes"), int),
    "--actor-num-gpus-per-node": (("launch", "trainer_gpus_per_node"), int),
    "--rollout-num-gpus": (("launch", "rollout_gpus"), int),
    "--rollout-num-gpus-per-engine": (("launch", "gpus_per_engine"), int),
}
_SCHEDULER_FLAGS = ("--partial-rollout", "--over-sampling-batch-size", "--colocate",
                    "--update-weights-interval", "--mask-offpolicy-in-partial-rollout")
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


def read_source(arg: str) -> str:
    """The text of `arg`: a script's contents when `arg` names a file, else `arg` itself (an
    argument string, however long: a name past the OS's limit is not a file)."""
    try:
        p = Path(arg)
        return p.read_text() if p.is_file() else arg
    except OSError as e:
        if e.errno in (errno.ENAMETOOLONG, errno.EINVAL):
            return arg
        raise


def from_slime(text: str, lengths: str | None = None) -> ImportResult:
    """Map a slime launch script or argument string to a scenario dict (see the module table).

    `lengths` names a length model (`aprilsim fit` wrote it) to use instead of the per-dataset
    estimate. Every value the scenario takes from slime's defaults or an estimate is in `notes`.
    """
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
    _setup(res, text, lengths)
    _scheduler(res, entry)
    _horizon(res)
    fit_warmup(res)
    if "--buffer-filter-path" in res.mapped:
        res.notes.append("--buffer-filter-path: a custom buffer filter is kept for export; the "
                         "simulator resumes partial groups in FIFO order (slime's default "
                         "pop_first)")
    if ("--sglang-mem-fraction-static" in res.mapped
            and "--sglang-max-total-tokens" not in res.mapped):
        res.notes.append("--sglang-mem-fraction-static: cluster.kv_capacity comes from the preset "
                         "(MI300X presets assume 0.6, H100 presets 0.85 minus 6 GB); pass "
                         "--sglang-max-total-tokens to set it exactly")
    return res


def _cluster(res: ImportResult, flags: dict[str, list[str]]) -> None:
    m, launch = res.mapped, res.data.setdefault("launch", {})
    colocate = "--colocate" in flags
    launch["colocate"] = colocate
    per_engine = m.get("--rollout-num-gpus-per-engine")
    if per_engine is None:
        per_engine = 1
        res.notes.append("--rollout-num-gpus-per-engine not set: slime's default, 1 GPU per engine")
    gpus = m.get("--rollout-num-gpus")
    if gpus is None and colocate:
        nodes, per_node = m.get("--actor-num-nodes"), m.get("--actor-num-gpus-per-node")
        for flag, value, default in (("--actor-num-nodes", nodes, 1),
                                     ("--actor-num-gpus-per-node", per_node, 8)):
            if value is None:
                res.notes.append(f"{flag} not set: slime's default, {default}")
        gpus = (nodes or 1) * (per_node or 8)
        res.notes.append(f"--colocate without --rollout-num-gpus: rollout runs on the trainer's "
                         f"{gpus} GPUs")
    if gpus is None:
        res.notes.append(f"cluster.engines: no --rollout-num-gpus; kept the default "
                         f"({res.data['cluster'].get('engines')} engines)")
        return
    if gpus % per_engine:
        res.notes.append(f"cluster.engines: {gpus} rollout GPUs are not a multiple of "
                         f"{per_engine} GPUs per engine; rounded down")
    res.data["cluster"]["engines"] = max(1, gpus // per_engine)
    launch.setdefault("gpus_per_engine", per_engine)


def _setup(res: ImportResult, text: str, lengths: str | None) -> None:
    """Engine preset, trainer and lengths from the model, the GPU and the dataset."""
    from aprilsim.engine.cost import PRESETS

    m, data = res.mapped, res.data
    tp = int(data.get("launch", {}).get("gpus_per_engine") or 1)
    model = setups.model_key(m.get("--hf-checkpoint"))
    gpu = setups.gpu_vendor(text)
    dataset = setups.dataset_key(m.get("--prompt-data"))
    default = data["cluster"].get("preset", "qwen3-4b-h100-tp2")
    if gpu == "amd":
        res.notes.append("AMD GPUs: the script sets ROCm's device variables "
                         "(HIP_VISIBLE_DEVICES...); MI300X presets are used")
    else:
        res.notes.append("GPU: the script names none (no ROCm variables): NVIDIA H100 assumed")
    if model is None and m.get("--hf-checkpoint") is None:
        res.notes.append(f"model: no --hf-checkpoint; kept the default preset {default} "
                         f"(Qwen3-4B on H100, TP {PRESETS[default].tp})")
    elif model is None:
        res.warnings.append(f"model: --hf-checkpoint {m.get('--hf-checkpoint')!r} matches no "
                            f"preset model; kept {default}, another model's costs (calibrate, or "
                            "pick one with `aprilsim presets`)")
        data["name"] = "slime-import"
    else:
        name = setups.preset_name(model, gpu, tp)
        if name in PRESETS:
            data["cluster"]["preset"] = name
            res.notes.append(f"cluster.preset: {name}, picked by model ({model}), GPU and TP {tp} "
                             "(a roofline estimate; see `aprilsim presets`)")
        else:
            res.warnings.append(f"cluster.preset: no preset for {model} on "
                                f"{'MI300X' if gpu == 'amd' else 'H100'} at TP {tp}; kept "
                                f"{default} (TP {PRESETS[default].tp}), another setup's costs")
        if model in setups.TRAINER_PER_TOKEN_S:
            data.setdefault("trainer", {})["per_token_s"] = setups.TRAINER_PER_TOKEN_S[model]
            res.notes.append(f"trainer.per_token_s: {setups.TRAINER_PER_TOKEN_S[model]:.3g} s for "
                             f"{model} (the default's 4B estimate scaled by parameters)")
    if lengths is not None:
        data["lengths"] = {"from": str(Path(lengths).resolve())}
        res.notes.append(f"lengths: from {lengths} (given with --lengths)")
    elif dataset is None:
        res.notes.append(f"lengths: --prompt-data {m.get('--prompt-data')!r} is none of "
                         "DAPO-Math-17k, DeepScaleR, DeepMath-103K; kept the default's model "
                         "(Qwen3-4B on DAPO-Math-17k); pass --lengths MODEL.toml for your own")
        setups.fit_to_cap(data, res.notes, res.warnings, estimated=False)
    else:
        key = (model or "qwen3-4b", dataset)
        lm = setups.LENGTHS[key]
        data["lengths"] = lm.as_dict()
        res.notes.append(f"lengths: {key[0]} on {dataset}, median {lm.median:,.0f} tokens, sigma "
                         f"{lm.sigma} (an estimate: {lm.source}; docs/scenarios.md)"
                         + ("" if model else "; the model is unknown, Qwen3-4B's model used"))
        setups.fit_to_cap(data, res.notes, res.warnings, estimated=True)
    data["name"] = "-".join(x for x in ("slime", model, dataset) if x)


def _horizon(res: ImportResult) -> None:
    """Steps: slime's --num-rollout is a training length; the simulation needs a steady state."""
    if "--num-rollout" not in res.mapped:
        res.notes.append(f"steps: no --num-rollout; kept the default's {res.data.get('steps')} "
                         f"steps ({res.data.get('warmup_steps')} left out as warm-up), long enough "
                         "for APRIL's buffer to settle on the default (the summary's `settled` "
                         "says whether a run did)")


def _scheduler(res: ImportResult, entry: str | None) -> None:
    m, data = res.mapped, res.data
    batch = int(data["batch_size"])
    osbs = m.get("--over-sampling-batch-size")
    ds = "--dynamic-sampling-filter-path" in m
    partial = bool(m.get("--partial-rollout"))
    interval = m.get("--update-weights-interval", 1)
    if osbs is not None and osbs < batch:
        raise ValueError(f"--over-sampling-batch-size {osbs} < --rollout-batch-size {batch}: "
                         "slime asserts over_sampling_batch_size >= rollout_batch_size")
    fallback = ds and m["--dynamic-sampling-filter-path"].endswith("_with_fallback")
    if ds and m["--dynamic-sampling-filter-path"].rsplit(".", 1)[-1] not in (
        "check_reward_nonzero_std", "check_reward_nonzero_std_with_fallback"
    ):
        res.notes.append("--dynamic-sampling-filter-path: a custom filter is simulated as DAPO's "
                         "zero-std filter")
    if entry is not None and entry.endswith("train_async.py"):
        if interval != 1:
            raise ValueError(f"--update-weights-interval {interval}: slime's train_async.py then "
                             "syncs weights every {interval} steps (staleness up to {interval}); "
                             "aprilsim's runtime syncs after every training step, so it is not "
                             "modelled (use 1, or fully_async with eta = {interval} as an "
                             "approximation)".replace("{interval}", str(interval)))
        if partial or osbs is not None or ds:  # APRIL's rollout inside the async pipeline
            name = "async_april"
            knobs = {"ratio": (osbs or batch) / batch, "recycle": partial}
            if ds:
                knobs["dynamic_filter"] = True
            baseline = "async_one_step"
            res.notes.append("train_async.py with APRIL's flags: async_april (slime runs "
                             "generate_rollout_async, with its over-sampling and abort, inside the "
                             "one-step async pipeline); compared with async_one_step, the same "
                             "script without them")
        else:
            name, knobs, baseline = "async_one_step", {}, "sync"
    elif partial or (osbs is not None and osbs > batch and not ds):
        name = "april_ds" if ds else "april"
        knobs = {"ratio": (osbs or batch) / batch, "recycle": partial}
        baseline = "slime_dapo" if ds and partial else "sync"
    elif ds:
        name, baseline = "slime_dapo", "sync"
        knobs = {"ratio": osbs / batch} if osbs is not None and osbs != batch else {}
    else:
        name, knobs, baseline = "sync", {}, "sync"
    if interval != 1 and not (entry or "").endswith("train_async.py"):
        res.notes.append(f"--update-weights-interval {interval}: slime's train.py syncs weights "
                         "after every step and ignores it")
    if "--mask-offpolicy-in-partial-rollout" in m and name in ("april", "april_ds", "async_april"):
        knobs["mask_offpolicy"] = True
    data["compare"] = list(dict.fromkeys(["sync", baseline, name]))
    data["schedulers"] = {name: knobs} if knobs else {}
    if baseline == "slime_dapo":
        data["schedulers"]["slime_dapo"] = {"ratio": 1.0}
        res.notes.append("compare: slime_dapo is the script's baseline (the APRIL repo's DAPO "
                         "script without --partial-rollout and --over-sampling-batch-size: "
                         "over-sample, abort, discard)")
    if fallback:
        _fallback(res, [s for s in data["compare"] if s in FILTERED])


def _fallback(res: ImportResult, filtered: list[str]) -> None:
    """slime's check_reward_nonzero_std_with_fallback: every filtered scheduler keeps a rejected
    group while no more than N remain (`keep_when_insufficient`), and the note says what that
    does to a baseline at --over-sampling-batch-size N (it never drops a group: sync)."""
    from aprilsim.policies.registry import knobs, resolve

    schedulers = res.data["schedulers"]
    for s in filtered:
        schedulers.setdefault(s, {})["keep_when_insufficient"] = True
    ratio = {s: float(schedulers[s].get("ratio", next(k.default for k in knobs(resolve(s))
                                                     if k.name == "ratio"))) for s in filtered}
    at_n = [s for s in filtered if ratio[s] <= 1.0]
    res.notes.append(
        "--dynamic-sampling-filter-path ..._with_fallback: a zero-std group is trained anyway "
        "rather than start another over-sampling batch while no more than N groups remain "
        f"(slime's keep_when_insufficient): {', '.join(filtered)} keep_when_insufficient = true"
        + (f"; at an over-sampling batch of N, {', '.join(at_n)} then never drops a group and "
           "runs as sync does" if at_n else ""))


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
    add("--rollout-max-prompt-len", sc.max_prompt_len)
    add("--num-rollout", sc.steps)
    notes.append("--num-rollout is the scenario's simulated horizon (steps): set your training "
                 "length before launching")
    la = sc.launch
    if la.temperature is not None:
        add("--rollout-temperature", la.temperature)
    if la.global_batch_size is not None:
        add("--global-batch-size", la.global_batch_size)
    _export_cluster(sc, name, add, notes)
    _export_scheduler(sc, name, add, notes)
    if la.buffer_filter is not None:
        add("--buffer-filter-path", la.buffer_filter)
    if la.checkpoint is not None:
        add("--hf-checkpoint", la.checkpoint)
    if la.prompt_data is not None:
        add("--prompt-data", la.prompt_data)
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


def _export_cluster(sc: Scenario, name: str, add: Any, notes: list[str]) -> None:
    from aprilsim.scheduler_spec import build_scheduler

    la = sc.launch
    per_engine = la.gpus_per_engine if la.gpus_per_engine is not None else sc.engine_spec().tp
    gpus = sc.cluster.engines * per_engine
    colocate = la.colocate
    mode = build_scheduler(sc, name).mode
    if colocate is None:
        colocate = mode == "colocated"
    elif colocate and mode == "disaggregated":
        colocate = False
        notes.append(f"{name} runs the trainer on GPUs of its own (slime's train_async.py asserts "
                     f"no --colocate): exported without --colocate, so this launch uses "
                     f"{gpus} rollout GPUs plus the trainer's, not {gpus} in all")
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
    knobs = sc.knobs_of(name)
    ds_filter = sc.launch.dynamic_sampling_filter or (
        WITH_FALLBACK if knobs.get("keep_when_insufficient") else NONZERO_STD)
    if name in ("april", "april_ds", "slime_dapo", "async_april"):
        if name == "async_april":
            notes.append("async_april: launch with slime's train_async.py (not train.py)")
        recycle = knobs["recycle"]
        if recycle:
            add("--partial-rollout")
        ratio = float(knobs["ratio"])
        osbs = over_sampling_batch_size(ratio, sc.batch_size)
        if osbs != ratio * sc.batch_size:
            notes.append(f"schedulers.{name}.ratio {ratio:g} x {sc.batch_size} groups is not a "
                         f"whole number: --over-sampling-batch-size {osbs} (ratio "
                         f"{osbs / sc.batch_size:g}, the groups the simulator kept in flight)")
        if osbs != sc.batch_size or name != "slime_dapo":
            add("--over-sampling-batch-size", osbs)
        if name in ("april_ds", "slime_dapo") or (name == "async_april"
                                                  and knobs.get("dynamic_filter")):
            add("--dynamic-sampling-filter-path", ds_filter)
            if knobs.get("refill", "chunk") != "chunk":
                notes.append(f"schedulers.{name}.refill: slime refills in whole over-sampling "
                             "batches (chunk); one_for_one has no slime flag")
        if knobs.get("mask_offpolicy"):
            add("--mask-offpolicy-in-partial-rollout")
        if knobs.get("surplus", "drop") != "drop":
            notes.append(f"schedulers.{name}.surplus = recycle: slime drops the groups completing "
                         "with the N-th; no flag keeps them")
        for k in ("max_staleness", "token_budget"):
            if knobs.get(k) is not None:
                notes.append(f"schedulers.{name}.{k}: slime has no flag for it")
        if knobs.get("resume_order", "fifo") != "fifo":
            notes.append(f"schedulers.{name}.resume_order: slime resumes FIFO unless given a "
                         "--buffer-filter-path implementing this order")
    elif name == "dynamic_sampling":
        notes.append("dynamic_sampling: slime runs these flags as over-sample/abort/discard "
                     "(aprilsim's slime_dapo), not in verl's synchronous rounds")
        add("--dynamic-sampling-filter-path", ds_filter)
        if knobs.get("gen_batch_size") is not None:
            add("--over-sampling-batch-size", knobs["gen_batch_size"])
    elif name == "async_one_step":
        notes.append("async_one_step: launch with slime's train_async.py (not train.py)")
    elif name != "sync":
        notes.append(f"{name}: slime has no built-in counterpart; the flags launch a sync rollout")
    if sc.launch.dynamic_sampling_filter is not None and name not in (
            "april_ds", "dynamic_sampling", "slime_dapo", "async_april"):
        add("--dynamic-sampling-filter-path", ds_filter)


def over_sampling_batch_size(ratio: float, batch: int) -> int:
    """The groups `ratio` keeps in flight for N = `batch`: ceil(ratio x N), as the scheduler."""
    return math.ceil(ratio * batch - 1e-9)


def format_flags(argv: list[str], notes: Sequence[str] = ()) -> str:
    """One flag and its values per line (pastes into a bash array); notes as `#` comments."""
    lines = [f"# {n}" for n in notes]
    for tok in argv:
        if tok.startswith("--") or not lines or lines[-1].startswith("#"):
            lines.append(tok)
        else:
            lines[-1] += " " + shlex.quote(tok)
    return "\n".join(lines) + "\n"
