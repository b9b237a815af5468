"""verl PPO/GRPO configs -> aprilsim scenarios.

Key names and meanings follow verl's `verl/trainer/config/ppo_trainer.yaml` (and its generated full
form), the DAPO recipe (`algorithm.filter_groups`, `data.gen_batch_size`), the one-step-off policy
config (a top-level `rollout:` section giving the rollout GPUs) and the fully-async policy config
(`async_training:`). Input is a YAML file or hydra overrides (`data.train_batch_size=256 ...`, as
verl launch scripts pass them). Reading YAML needs PyYAML (`pip install 'aprilsim[interop]'`).

| verl key | scenario key |
|---|---|
| `data.train_batch_size` | `batch_size` |
| `actor_rollout_ref.rollout.n` (or the fully-async `rollout.n`) | `group_size` |
| `data.max_response_length` | `max_response_len` |
| `data.max_prompt_length` | `prompts.max_len` |
| `trainer.total_training_steps` | `steps` |
| `trainer.nnodes`, `trainer.n_gpus_per_node`, `rollout.nnodes`, `rollout.n_gpus_per_node`, `actor_rollout_ref.rollout.tensor_model_parallel_size` | `cluster.engines` |
| `actor_rollout_ref.rollout.max_num_seqs` | `cluster.max_running` |
| `actor_rollout_ref.rollout.name` (`vllm`, `sglang`) | `cluster.family` |
| `actor_rollout_ref.rollout.max_num_batched_tokens` | `cluster.max_num_batched_tokens` under vLLM (its step's token budget), else `cluster.max_prefill_tokens` |
| `actor_rollout_ref.rollout.enable_chunked_prefill` | `cluster.enable_chunked_prefill` (vLLM) |
| `algorithm.filter_groups.*`, `data.gen_batch_size` | `dynamic_sampling` knobs |
| `async_training.partial_rollout` | `fully_async.interrupt` |
| `actor_rollout_ref.rollout.temperature`, `.gpu_memory_utilization` | `[launch]` (not simulated) |
| `actor_rollout_ref.model.path`, `data.train_files` | `cluster.preset`, `trainer.per_token_s`, `lengths` (by model and dataset, as for slime) |
"""

from __future__ import annotations

import re
from typing import Any

from aprilsim.interop.common import ImportResult, base_scenario, fit_warmup
from aprilsim.interop.shell import parse_command

_R = "actor_rollout_ref.rollout."
_DIRECT: dict[str, tuple[tuple[str, ...], type]] = {
    "data.train_batch_size": (("batch_size",), int),
    _R + "n": (("group_size",), int),
    "rollout.n": (("group_size",), int),  # the fully-async config's own rollout section
    "data.max_response_length": (("max_response_len",), int),
    "data.max_prompt_length": (("prompts", "max_len"), int),
    "trainer.total_training_steps": (("steps",), int),
    _R + "max_num_seqs": (("cluster", "max_running"), int),
    _R + "max_num_batched_tokens": (("cluster", "max_prefill_tokens"), int),
    _R + "temperature": (("launch", "temperature"), float),
    _R + "gpu_memory_utilization": (("launch", "mem_fraction_static"), float),
    _R + "tensor_model_parallel_size": (("launch", "gpus_per_engine"), int),
}
_FAMILY = (_R + "name", _R + "enable_chunked_prefill")
_CLUSTER = ("trainer.nnodes", "trainer.n_gpus_per_node", "rollout.nnodes",
            "rollout.n_gpus_per_node")
_SETUP = ("actor_rollout_ref.model.path", "data.train_files")
_SCHEDULER = ("algorithm.filter_groups.enable", "algorithm.filter_groups.max_num_gen_batches",
              "algorithm.filter_groups.metric", "data.gen_batch_size",
              "async_training.partial_rollout")
MAPPED_KEYS: tuple[str, ...] = (*_DIRECT, *_FAMILY, *_CLUSTER, *_SCHEDULER, *_SETUP)
_OVERRIDE = re.compile(r"^[+~]{0,2}([A-Za-z_][\w.]*)=(.*)$", re.S)


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists and scalars are leaves."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _yaml() -> Any:
    try:
        import yaml
    except ImportError:  # pragma: no cover - exercised only without the extra
        raise ValueError("reading verl YAML needs PyYAML: "
                         "pip install 'aprilsim[interop]'") from None
    return yaml


def read_settings(text: str) -> dict[str, Any]:
    """Dotted key -> value from a verl YAML config or from hydra overrides in a command/script."""
    yaml = _yaml()
    try:
        tree = yaml.safe_load(text)
    except yaml.YAMLError:
        tree = None
    if isinstance(tree, dict):
        return flatten(tree)
    cmd = parse_command(text, ("main_ppo", "main_dapo", "fully_async_main", "main_ppo_sync"))
    out: dict[str, Any] = {}
    for tok in cmd.argv:
        m = _OVERRIDE.match(tok)
        if m:
            out[m.group(1)] = yaml.safe_load(m.group(2)) if m.group(2) else None
    return out


def _is_set(v: Any) -> bool:
    """False for verl's placeholders: null, "???" and `${...}` interpolations."""
    return v is not None and not (isinstance(v, str) and (v == "???" or v.startswith("${")))


def from_verl(text: str, lengths: str | None = None) -> ImportResult:
    """Map a verl config (YAML text or hydra overrides) to a scenario dict (see the module table).
    `lengths` names a length model (`aprilsim fit` wrote it) to use instead of the estimate."""
    settings = read_settings(text)
    if not settings:
        raise ValueError("no verl settings found (give a YAML config or key=value overrides)")
    data = base_scenario()
    data["name"] = "verl-import"
    res = ImportResult(data=data)
    for key, value in settings.items():
        if key not in MAPPED_KEYS:
            res.unmapped.append(key)
            continue
        if not _is_set(value) and not (key in _SETUP and isinstance(value, str) and value):
            # a path under an unset ${HOME} still names its model and dataset by its last parts
            if value is not None:  # "???" or an unresolved ${...}: say so, never drop it
                res.unmapped.append(f"{key} (value {value!r} not resolved)")
            continue
        if key in _DIRECT:
            path, typ = _DIRECT[key]
            try:
                v = typ(value)
            except (TypeError, ValueError):
                raise ValueError(f"{key}: {value!r} is not {typ.__name__}") from None
            res.mapped[key] = v
            d = data
            for p in path[:-1]:
                d = d.setdefault(p, {})
            d[path[-1]] = v
        else:
            res.mapped[key] = value
    _cluster(res)
    _family(res)
    _setup(res, lengths)
    _assumptions(res)
    _scheduler(res)
    fit_warmup(res)
    if _R + "gpu_memory_utilization" in res.mapped:
        res.notes.append("gpu_memory_utilization: the KV pool it leaves depends on the GPU and the "
                         "model, so cluster.kv_capacity comes from the preset")
    return res


def _family(res: ImportResult) -> None:
    """The engine family from `rollout.name`: vLLM's rules under vllm (its step's token budget,
    chunked prefill), SGLang's otherwise (the budget then bounds prefill batches only)."""
    m, cluster = res.mapped, res.data["cluster"]
    name = str(m.get(_R + "name", "")).lower()
    budget = cluster.pop("max_prefill_tokens", None)
    if name.startswith("vllm"):
        cluster["family"] = "vllm"
        if budget is not None:
            cluster["max_num_batched_tokens"] = budget
        if _R + "enable_chunked_prefill" in m:
            cluster["enable_chunked_prefill"] = bool(m[_R + "enable_chunked_prefill"])
        res.notes.append(f"{_R}name={m[_R + 'name']}: cluster.family = \"vllm\" (vLLM V1's "
                         "scheduling: one token budget per step shared by decodes and prefill "
                         "chunks, block KV, preemption to the queue's head)")
        return
    if name:
        cluster["family"] = "sglang"
    if budget is not None:
        cluster["max_prefill_tokens"] = budget
        res.notes.append("max_num_batched_tokens is the engine's token budget per iteration; "
                         "under SGLang's rules the simulator applies it to prefill batches only")
    if _R + "enable_chunked_prefill" in m:
        del m[_R + "enable_chunked_prefill"]
        res.unmapped.append(_R + "enable_chunked_prefill")  # vLLM's key: not SGLang's


def _cluster(res: ImportResult) -> None:
    m, launch = res.mapped, res.data.setdefault("launch", {})
    tp = int(m.get(_R + "tensor_model_parallel_size", 2))  # verl's default
    separate = "rollout.n_gpus_per_node" in m or "rollout.nnodes" in m
    if separate:
        gpus = int(m.get("rollout.nnodes", 1)) * int(m.get("rollout.n_gpus_per_node", 8))
    else:
        gpus = int(m.get("trainer.nnodes", 1)) * int(m.get("trainer.n_gpus_per_node", 8))
        launch["trainer_nodes"] = int(m.get("trainer.nnodes", 1))
        launch["trainer_gpus_per_node"] = int(m.get("trainer.n_gpus_per_node", 8))
    launch["colocate"] = not separate
    launch["rollout_gpus"] = gpus
    if gpus % tp:
        res.notes.append(f"cluster.engines: {gpus} rollout GPUs are not a multiple of TP {tp}")
    res.data["cluster"]["engines"] = max(1, gpus // tp)


def _setup(res: ImportResult, lengths: str | None) -> None:
    """Engine preset, trainer and lengths from the model and the dataset (as slime's import):
    a model with no preset keeps the default's costs, and says so; lengths with no evidence for
    this model and dataset keep the default's shape, scaled to the response cap."""
    from pathlib import Path

    import aprilsim.interop.setups as setups
    from aprilsim.engine.cost import PRESETS

    m, data = res.mapped, res.data
    path = m.get("actor_rollout_ref.model.path")
    model = setups.model_key(path)
    tp = int(m.get(_R + "tensor_model_parallel_size", 2))
    default = data["cluster"].get("preset", "qwen3-4b-h100-tp2")
    if path is not None and model is None:
        res.warnings.append(f"model: {path!r} matches no preset model; kept {default} (Qwen3-4B's "
                            "costs on H100), another model's: calibrate (`aprilsim calibrate`) "
                            "or pick one with `aprilsim presets`")
    elif model is not None and setups.preset_name(model, "nvidia", tp) in PRESETS:
        data["cluster"]["preset"] = setups.preset_name(model, "nvidia", tp)
        res.notes.append(f"cluster.preset: {data['cluster']['preset']}, picked by model ({model}) "
                         f"and TP {tp}, GPU: NVIDIA H100 assumed (verl's config names none)")
    elif model is not None:
        res.warnings.append(f"cluster.preset: no preset for {model} on H100 at TP {tp}; kept "
                            f"{default}, another setup's costs")
    if model in setups.TRAINER_PER_TOKEN_S:
        data.setdefault("trainer", {})["per_token_s"] = setups.TRAINER_PER_TOKEN_S[model]
    dataset = setups.dataset_key(str(m.get("data.train_files") or "")) or None
    if lengths is not None:
        data["lengths"] = {"from": str(Path(lengths).resolve())}
        res.notes.append(f"lengths: from {lengths} (given with --lengths)")
    elif model is not None and dataset is not None and (model, dataset) in setups.LENGTHS:
        lm = setups.LENGTHS[(model, dataset)]
        data["lengths"] = lm.as_dict()
        res.notes.append(f"lengths: {model} on {dataset}, median {lm.median:,.0f} tokens (an "
                         f"estimate: {lm.source}; docs/scenarios.md)")
        setups.fit_to_cap(data, res.notes, res.warnings, estimated=True)
    else:
        res.notes.append("lengths: no length model for this model and dataset; the default's "
                         "(Qwen3-4B on DAPO-Math-17k) is an assumption")
        setups.fit_to_cap(data, res.notes, res.warnings, estimated=False)


def _assumptions(res: ImportResult) -> None:
    """Say every value the cluster took from verl's defaults, and where the preset does not fit."""
    from aprilsim.engine.cost import PRESETS

    m, data = res.mapped, res.data
    separate = "rollout.n_gpus_per_node" in m or "rollout.nnodes" in m
    keys = (("rollout.nnodes", 1), ("rollout.n_gpus_per_node", 8)) if separate else (
        ("trainer.nnodes", 1), ("trainer.n_gpus_per_node", 8))
    for key, default in (*keys, (_R + "tensor_model_parallel_size", 2)):
        if key not in m:
            res.notes.append(f"{key} not set: verl's default, {default}")
    tp = int(m.get(_R + "tensor_model_parallel_size", 2))
    preset = data["cluster"].get("preset", "qwen3-4b-h100-tp2")
    if preset in PRESETS and PRESETS[preset].tp != tp:
        res.warnings.append(f"cluster.preset: {preset} is a TP-{PRESETS[preset].tp} estimate "
                            f"kept for a TP-{tp} launch: another setup's per-engine costs "
                            "(calibrate, or pick a preset with `aprilsim presets`)")


def _scheduler(res: ImportResult) -> None:
    m, data = res.mapped, res.data
    if "async_training.partial_rollout" in m or any(k.startswith("async_training.")
                                                     for k in res.unmapped):
        name = "fully_async"
        knobs: dict[str, Any] = {"interrupt": bool(m.get("async_training.partial_rollout", True))}
        res.notes.append("async_training.staleness_threshold counts samples, not policy versions; "
                         "fully_async.eta keeps its default")
    elif "rollout.n_gpus_per_node" in m or "rollout.nnodes" in m:
        name, knobs = "async_one_step", {}
    elif m.get("algorithm.filter_groups.enable"):
        name, knobs = "dynamic_sampling", {"on_cap": "error"}
        if "data.gen_batch_size" in m:
            knobs["gen_batch_size"] = int(m["data.gen_batch_size"])
        cap = m.get("algorithm.filter_groups.max_num_gen_batches")
        if cap is not None:
            if int(cap) > 0:
                knobs["max_rounds"] = int(cap)
            else:
                knobs["max_rounds"] = 1_000_000
                res.notes.append("max_num_gen_batches <= 0 (no limit): max_rounds = 1,000,000")
        metric = m.get("algorithm.filter_groups.metric")
        if metric is not None:
            res.notes.append(f"filter_groups.metric {metric!r}: simulated as the reward's std")
    else:
        name, knobs = "sync", {}
    data["compare"] = ["sync"] if name == "sync" else ["sync", name]
    data["schedulers"] = {name: knobs} if knobs else {}
    used = {"dynamic_sampling": _SCHEDULER[:4], "fully_async": _SCHEDULER[4:]}.get(name, ())
    for key in _SCHEDULER:
        if key in m and key not in used:  # read, but it changes nothing for this scheduler
            del m[key]
            res.unmapped.append(key)
