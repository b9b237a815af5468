"""Scenario files: validated configuration of a whole simulated experiment.

A scenario is TOML (see `aprilsim/scenarios/default.toml`, printed by `aprilsim scenario`). Every
key is validated: an unknown key or a bad value raises `ScenarioError` with a one-line message
naming the key, which the CLI prints before exiting with code 2.
"""

from __future__ import annotations

import math
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from aprilsim.engine.cost import PRESETS, CostModel, EngineSpec, TabulatedCost
from aprilsim.engine.families import FAMILIES as ENGINE_FAMILIES
from aprilsim.engine.families import family_params, make_family
from aprilsim.engine.kv_transfer import MOONCAKE_GB_S_PER_GPU, KvTransferSpec
from aprilsim.engine.router import ROUTERS
from aprilsim.engine.speculative import SpeculativeSpec
from aprilsim.metrics.warmup import scaled_warmup
from aprilsim.scenario_limits import (
    DEFAULT_MAX_PROMPT_LEN,
    LimitError,
    check_limits,
    parse_toml,
    read_text_bounded,
    whole_tokens,
)
from aprilsim.suggest import did_you_mean
from aprilsim.trainer import TrainerModel
from aprilsim.workload.episodes import EpisodeModel, draw_from_dict
from aprilsim.workload.generator import RewardModel, Workload
from aprilsim.workload.lengths import (
    FAMILIES,
    PARAMETRIC_PARAMS,
    LengthModel,
    check_drawable,
    length_model_from_dict,
)
from aprilsim.workload.model_file import drift_from_dict, read_model_file


class ScenarioError(ValueError):
    """A scenario cannot be used; the message is one line naming the offending key."""


class _Strict(BaseModel):
    # strict: the string "1e3" or `false` is no number, 4.5 no integer; nan/inf no setting
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class CostSection(_Strict):
    """Decode t(B, K) = a + b*B + c*K, or f(B) + g(B)*K from tables over B; prefill
    p0 + p1*sum(n) + p2*sum(n^2). Give either a, b, c or table_b, table_f, table_g."""

    a: float | None = Field(default=None, ge=0)
    b: float | None = Field(default=None, ge=0)
    c: float | None = Field(default=None, ge=0)
    table_b: list[int] | None = None
    table_f: list[float] | None = None
    table_g: list[float] | None = None
    p0: float = Field(ge=0)
    p1: float = Field(ge=0)
    p2: float = Field(default=0.0, ge=0)
    pr: float = Field(default=0.0, ge=0)  # seconds per request of a prefill batch

    @model_validator(mode="after")
    def _one_form(self) -> CostSection:
        linear = [k for k in ("a", "b", "c") if getattr(self, k) is not None]
        tables = [k for k in ("table_b", "table_f", "table_g") if getattr(self, k) is not None]
        if linear and tables:
            raise ValueError("give either a, b, c or table_b, table_f, table_g, not both")
        if len(linear) not in (0, 3) or len(tables) not in (0, 3) or not (linear or tables):
            raise ValueError("give all of a, b, c, or all of table_b, table_f, table_g")
        return self

    def model(self) -> CostModel | TabulatedCost:
        """The cost model this section describes (validated by its own constructor)."""
        if self.table_b is not None:
            return TabulatedCost(tuple(self.table_b), tuple(self.table_f or ()),
                                 tuple(self.table_g or ()), self.p0, self.p1, self.p2, self.pr)
        return CostModel(a=self.a, b=self.b, c=self.c, p0=self.p0, p1=self.p1, p2=self.p2,
                         pr=self.pr)


class SpeculativeSection(_Strict):
    """`[cluster] speculative = {...}`: speculative decoding (`aprilsim.engine.speculative`);
    each key as `SpeculativeSpec`, which checks the combination."""

    acceptance: Literal["constant", "siblings", "group", "history", "model"] = "constant"
    p: float = Field(default=0.7, ge=0, le=1)
    p0: float = Field(default=0.5, ge=0, le=1)
    p_max: float = Field(default=0.9, ge=0, le=1)
    # mean tokens per verify step at k_max (bonus token included): sets p ("model",
    # "constant") or p_max ("group", "history") instead of giving them
    accept_len: float | None = Field(default=None, ge=1, le=65)
    k_max: int = Field(default=4, ge=1, le=64)
    k_min: int = Field(default=1, ge=1)
    draft_budget: int = Field(default=0, ge=0)
    draft_s: float = Field(default=0.0, ge=0)
    overhead_s: float = Field(default=0.0, ge=0)
    staleness: float = Field(default=0.0, ge=0, lt=1)
    retrain_every: int = Field(default=0, ge=0)

    def spec(self, where: str) -> SpeculativeSpec:
        """The engine's speculative setting, with the acceptance model's published defaults for
        what the table leaves out; ScenarioError naming `where` when it contradicts."""
        given = {k: getattr(self, k) for k in self.model_fields_set}
        given.setdefault("acceptance", self.acceptance)
        try:
            return SpeculativeSpec.sourced(**given)
        except ValueError as e:
            raise ScenarioError(f"{where}: {e}") from None


class KvTransferSection(_Strict):
    """`[cluster] kv_transfer = {...}`: what a migrated piece's KV costs to move
    (`aprilsim.engine.kv_transfer`: a Mooncake-style global pool by default)."""

    pool: Literal["global", "p2p", "free"] = "global"
    bandwidth_gb_s: float = Field(default=MOONCAKE_GB_S_PER_GPU, gt=0, le=1e6)
    latency_s: float = Field(default=1.0e-3, ge=0, lt=3600)
    bytes_per_token: float = Field(default=0.0, ge=0, lt=1e9)  # 0: the preset's

    def spec(self) -> KvTransferSpec:
        """The engines' setting (checked again by `KvTransferSpec`)."""
        return KvTransferSpec(**self.model_dump())


class ClusterSection(_Strict):
    engines: int = Field(default=4, ge=1)
    preset: str = "qwen3-4b-h100-tp2"
    router: str = "round_robin"
    # the engine family whose rules the engines run (`aprilsim.engine.families`); its rules'
    # parameters below (retract_to, abort_steps, prefix_cache_block, max_num_batched_tokens,
    # enable_prefix_caching, enable_chunked_prefill) default to the family's own
    family: str = "sglang"
    kv_capacity: int | None = Field(default=None, ge=1)
    max_running: int | None = Field(default=None, ge=1)
    new_token_ratio: float | None = Field(default=None, ge=0, le=1)
    max_prefill_tokens: int | None = Field(default=None, ge=1)
    # SGLang's scheduling rules (defaults in `EngineSpec`; see docs/simulator.md)
    new_token_ratio_decay_steps: int | None = Field(default=None, ge=0)
    min_new_token_ratio_factor: float | None = Field(default=None, ge=0, le=1)
    retract_decode_steps: int | None = Field(default=None, ge=0)
    clip_max_new_tokens: int | None = Field(default=None, ge=0)
    retract_to: Literal["head", "tail"] | None = None  # the family's rule (sglang: "tail")
    # -1: the abort lands at once (families.ABORT_AT_ONCE); None here, as for every key: not set
    abort_steps: int | None = Field(default=None, ge=-1)
    chunked_prefill_size: int | None = Field(default=None, ge=-1)  # 0 or -1: off
    prefix_sharing: bool | None = None  # a group's prompt held once per engine (radix cache)
    # none; group (= prefix_sharing); lru: kept past a request's life in free KV (docs/simulator.md)
    prefix_cache: Literal["none", "group", "lru"] | None = None
    prefix_cache_flush: bool | None = None  # a weight update empties the cache (default true)
    # the cache serves whole blocks of this many tokens (1: token-level; vLLM: its KV block size)
    prefix_cache_block: int | None = Field(default=None, ge=1)
    # the vllm family's rules (vLLM's names; docs/simulator.md, "vLLM family"): the token budget
    # of one step, shared by decodes and prefill chunks; prefix caching; chunked prefill
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    enable_prefix_caching: bool | None = None
    enable_chunked_prefill: bool | None = None
    client_overhead_s: float | None = Field(default=None, ge=0)  # per request, client to engine
    client_send_s: float | None = Field(default=None, ge=0)  # per request, one after another
    abort_latency_s: float | None = Field(default=None, ge=0)  # an abort's send to its answer
    abort_delivery_s: float | None = Field(default=None, ge=0)  # an abort's send to its engine
    speculative: SpeculativeSection | None = None  # speculative decoding (docs/simulator.md)
    kv_transfer: KvTransferSection | None = None  # migrated KV's cost (default: a global pool)
    cost: CostSection | None = None
    # per engine, how many times as long its steps take (stragglers, mixed devices); None: all 1
    engine_slowdown: list[float] | None = None

    @model_validator(mode="after")
    def _one_slowdown_per_engine(self) -> ClusterSection:
        s = self.engine_slowdown
        if s is not None:
            if len(s) != self.engines:
                raise ValueError(f"engine_slowdown has {len(s)} values for {self.engines} engines "
                                 "(one per engine)")
            if not all(math.isfinite(x) and x > 0 for x in s):
                raise ValueError("engine_slowdown values must be positive numbers (1: nominal)")
        return self

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, v: str) -> str:
        if v not in PRESETS and not v.endswith(".toml"):
            raise ValueError(f"unknown preset {v!r}{did_you_mean(v, PRESETS)}; known: "
                             f"{', '.join(sorted(PRESETS))}, "
                             "or a preset file (.toml, e.g. written by `aprilsim calibrate`)")
        return v

    @field_validator("router")
    @classmethod
    def _known_router(cls, v: str) -> str:
        if v not in ROUTERS:
            raise ValueError(f"unknown router {v!r}{did_you_mean(v, ROUTERS)}; known: "
                             f"{', '.join(sorted(ROUTERS))}")
        return v

    @field_validator("family")
    @classmethod
    def _known_family(cls, v: str) -> str:
        if v not in ENGINE_FAMILIES:
            raise ValueError(f"unknown engine family {v!r}{did_you_mean(v, ENGINE_FAMILIES)}; "
                             f"known: {', '.join(sorted(ENGINE_FAMILIES))}")
        return v


class PresetFile(_Strict):
    """A preset file (`aprilsim calibrate --out`): a `[cost]` table and optional engine limits;
    what it leaves out comes from the default preset."""

    label: str = "calibrated"
    source: str = ""
    kv_capacity: int | None = Field(default=None, ge=1)
    max_running: int | None = Field(default=None, ge=1)
    new_token_ratio: float | None = Field(default=None, ge=0, le=1)
    max_prefill_tokens: int | None = Field(default=None, ge=1)
    tp: int | None = Field(default=None, ge=1)
    client_overhead_s: float | None = Field(default=None, ge=0)
    client_send_s: float | None = Field(default=None, ge=0)
    abort_latency_s: float | None = Field(default=None, ge=0)
    abort_delivery_s: float | None = Field(default=None, ge=0)
    prefix_cache: Literal["none", "group", "lru"] | None = None
    prefix_cache_flush: bool | None = None
    prefix_cache_block: int | None = Field(default=None, ge=1)
    speculative: SpeculativeSection | None = None  # fitted from accepted-token logs
    cost: CostSection


def load_preset_file(path: str | Path) -> EngineSpec:
    """The engine spec of a preset file; ScenarioError (one line) when it cannot be used."""
    p = Path(path)
    try:
        data = parse_toml(read_text_bounded(p, "cluster.preset"), f"cluster.preset: {p}")
    except LimitError as e:
        raise ScenarioError(str(e)) from None
    try:
        pf = PresetFile.model_validate(data)
    except ValidationError as e:
        raise ScenarioError(f"cluster.preset: {p}: {_format_error(e)}") from None
    try:
        cost = pf.cost.model()
    except ValueError as e:
        raise ScenarioError(f"cluster.preset: {p}: cost: {e}") from None
    over: dict[str, Any] = {k: getattr(pf, k) for k in
                            ("kv_capacity", "max_running", "new_token_ratio", "max_prefill_tokens",
                             "tp", "client_overhead_s", "client_send_s", "abort_latency_s",
                             "abort_delivery_s", "prefix_cache", "prefix_cache_flush")
                            if getattr(pf, k) is not None}
    if pf.speculative is not None:
        over["speculative"] = pf.speculative.spec(f"cluster.preset: {p}: speculative")
    base = PRESETS[ClusterSection().preset]
    if pf.prefix_cache_block is not None:  # the family's rule: the cache's grain
        over["family"] = replace(base.family, cache_block=pf.prefix_cache_block)
    return replace(base, cost=cost, label=pf.label, source=pf.source or f"preset file {p}",
                   **over)


class TrainerSection(_Strict):
    base_s: float = Field(default=5.0, ge=0)
    per_token_s: float = Field(default=1.26e-5, ge=0)
    sync_s: float = Field(default=3.0, ge=0)


class RewardSection(_Strict):
    alpha: float = Field(default=1.0, gt=0)
    beta: float = Field(default=1.0, gt=0)
    difficulty_length_corr: float = Field(default=0.0, ge=-1, le=1)


class EpisodesSection(_Strict):
    """`[workload.episodes]`: every sample is an agentic episode (docs/agents.md). `lengths` is
    then the per-turn length model; a tool call's seconds and output tokens are uniform
    (`{low, high}`) or a length model (`{family = ...}`)."""

    max_turns: int = Field(ge=1)
    min_turns: int = Field(default=1, ge=1)
    tool_s: dict[str, Any] = {"low": 0.1, "high": 1.0}
    tool_tokens: dict[str, Any] = {"low": 40, "high": 200}
    max_turn_len: int | None = Field(default=None, ge=1)  # per-turn max_new_tokens (None: the cap)

    @model_validator(mode="after")
    def _turns_in_order(self) -> EpisodesSection:
        if self.min_turns > self.max_turns:
            raise ValueError(f"min_turns {self.min_turns} is above max_turns {self.max_turns}")
        return self

    def model(self) -> EpisodeModel:
        """The episode model this section describes (ScenarioError naming the key)."""
        draws = {}
        for key in ("tool_s", "tool_tokens"):
            d = getattr(self, key)
            try:
                draws[key] = (_length_model(d, f"workload.episodes.{key}") if "family" in d
                              else draw_from_dict(d, f"workload.episodes.{key}"))
            except ValueError as e:
                raise ScenarioError(str(e)) from None
        return EpisodeModel(max_turns=self.max_turns, min_turns=self.min_turns,
                            max_turn_len=self.max_turn_len, **draws)


class WorkloadSection(_Strict):
    prompt_share: float = Field(default=0.3, ge=0, lt=1)
    # 0: every prompt new; N: N prompts re-run each epoch
    dataset_prompts: int = Field(default=0, ge=0)
    rewards: RewardSection = RewardSection()
    drift: dict[str, Any] | None = None
    episodes: EpisodesSection | None = None  # agentic: turns and tool calls (docs/agents.md)


class LaunchSection(_Strict):
    """How the run is launched, beyond what the simulator models.

    The simulator reads none of these keys. They keep the launch settings of an imported slime or
    verl config (`aprilsim scenario --from-slime`) so that `--to-slime` writes them back unchanged;
    `None` means "not set, use the framework's default".
    """

    colocate: bool | None = None  # slime --colocate: training and rollout share the GPUs
    trainer_nodes: int | None = Field(default=None, ge=1)  # slime --actor-num-nodes
    trainer_gpus_per_node: int | None = Field(default=None, ge=1)  # --actor-num-gpus-per-node
    rollout_gpus: int | None = Field(default=None, ge=0)  # slime --rollout-num-gpus
    gpus_per_engine: int | None = Field(default=None, ge=1)  # --rollout-num-gpus-per-engine
    temperature: float | None = Field(default=None, gt=0)  # --rollout-temperature
    global_batch_size: int | None = Field(default=None, ge=1)  # samples per optimizer step
    mem_fraction_static: float | None = Field(default=None, gt=0, le=1)  # SGLang
    chunked_prefill_size: int | None = None  # SGLang; -1 disables chunking
    dynamic_sampling_filter: str | None = None  # slime --dynamic-sampling-filter-path
    buffer_filter: str | None = None  # slime --buffer-filter-path
    checkpoint: str | None = None  # slime --hf-checkpoint (the importer picks the preset by it)
    prompt_data: str | None = None  # slime --prompt-data (the importer picks the lengths by it)


class Scenario(_Strict):
    """The whole experiment. `lengths` is a length-model dict or {from = "model.toml"}."""

    name: str = "scenario"
    seed: int = 0
    steps: int = Field(default=10, ge=1)
    # left out of summaries (APRIL's step 0 has no buffer)
    warmup_steps: int = Field(default=1, ge=0)
    batch_size: int = Field(default=32, ge=1)
    group_size: int = Field(default=8, ge=1)
    max_response_len: int = Field(default=16384, ge=1)
    compare: list[str] = ["sync", "april"]
    cluster: ClusterSection = ClusterSection()
    trainer: TrainerSection = TrainerSection()
    lengths: dict[str, Any]
    prompts: dict[str, Any] = {"family": "lognormal", "mu": 5.3, "sigma": 0.5,
                               "max_len": DEFAULT_MAX_PROMPT_LEN}
    workload: WorkloadSection = WorkloadSection()
    schedulers: dict[str, dict[str, Any]] = {}
    launch: LaunchSection = LaunchSection()
    base_dir: str = "."

    # ------------------------------------------------------------------ derived values
    @property
    def max_prompt_len(self) -> int:
        """The longest prompt in tokens: `prompts.max_len`, 2048 when unset (LimitError when it is
        no whole number)."""
        return whole_tokens(self.prompts.get("max_len", DEFAULT_MAX_PROMPT_LEN), "prompts.max_len")

    def knobs_of(self, scheduler: str) -> dict[str, Any]:
        """Every knob of `scheduler` (`NAME`, `module:Class` or `NAME@knob=v`) as it runs here:
        its class defaults, updated by `[schedulers.NAME]`, then by the spec's own values (what
        an exporter writes back, what sizes a calibration: APRIL's ratio, read in one place)."""
        from aprilsim.policies.registry import knobs, resolve
        from aprilsim.scheduler_spec import scheduler_settings

        spec, settings = scheduler_settings(self, scheduler)
        return {**{k.name: k.default for k in knobs(resolve(spec.name))}, **settings}

    # ------------------------------------------------------------------ builders
    def engine_spec(self) -> EngineSpec:
        """The engine of one replica: the cluster's preset with the scenario's overrides."""
        c = self.cluster
        if c.preset in PRESETS:
            spec = PRESETS[c.preset]
        else:  # a preset file, relative to the scenario file
            path = Path(c.preset)
            spec = load_preset_file(path if path.is_absolute() else Path(self.base_dir) / path)
        over: dict[str, Any] = {
            k: getattr(c, k)
            for k in (
                "kv_capacity", "max_running", "new_token_ratio", "max_prefill_tokens",
                "new_token_ratio_decay_steps", "min_new_token_ratio_factor",
                "retract_decode_steps", "clip_max_new_tokens",
                "chunked_prefill_size", "prefix_sharing", "prefix_cache", "prefix_cache_flush",
                "client_overhead_s", "client_send_s", "abort_latency_s", "abort_delivery_s",
            )
            if getattr(c, k) is not None
        }
        if c.prefix_sharing and c.prefix_cache == "none":
            raise ScenarioError("cluster: prefix_sharing = true and prefix_cache = \"none\" "
                                "contradict each other (prefix_cache = \"group\" is the same "
                                "as prefix_sharing = true)")
        block = c.prefix_cache_block
        if block is not None and block > 1 and (c.prefix_sharing or c.prefix_cache == "group"):
            raise ScenarioError(f"cluster: prefix_cache_block {block} needs prefix_cache = "
                                "\"lru\" (the within-group cache \"group\" is token-level only)")
        over["family"] = self._family(spec)
        if c.speculative is not None:
            over["speculative"] = c.speculative.spec("cluster.speculative")
        if c.kv_transfer is not None:
            over["kv_transfer"] = c.kv_transfer.spec()
        if c.cost is not None:
            try:
                over["cost"] = c.cost.model()
            except ValueError as e:
                raise ScenarioError(f"cluster.cost: {e}") from None
            over["label"] = "custom"
        try:
            return replace(spec, **over) if over else spec
        except ValueError as e:
            raise ScenarioError(f"cluster: {e}") from None

    def _family(self, spec: EngineSpec) -> Any:
        """The engines' family: `[cluster] family` with the rules' parameters the scenario sets,
        the others the preset's (same family) or the family's own defaults."""
        c = self.cluster
        given = {"retract_to": c.retract_to, "abort_steps": c.abort_steps,
                 "cache_block": c.prefix_cache_block,
                 "max_num_batched_tokens": c.max_num_batched_tokens,
                 "enable_prefix_caching": c.enable_prefix_caching,
                 "enable_chunked_prefill": c.enable_chunked_prefill}
        takes = family_params(c.family)
        for key, value in given.items():
            if value is not None and key not in takes:
                name = "prefix_cache_block" if key == "cache_block" else key
                raise ScenarioError(f"cluster.{name}: the {c.family} engine family has no such "
                                    f"rule (its rules: {', '.join(takes) or 'none'})")
        params = {k: v for k, v in given.items() if v is not None}
        if spec.family.name == c.family:  # the preset's own values for what the scenario leaves
            params = {f: getattr(spec.family, f) for f in takes} | params
        try:
            return make_family(c.family, **params)
        except ValueError as e:
            raise ScenarioError(f"cluster: {e}") from None

    def trainer_model(self) -> TrainerModel:
        """The training and weight-sync time model of `[trainer]`."""
        return TrainerModel(**self.trainer.model_dump())

    def length_model(self) -> tuple[LengthModel, dict[str, Any]]:
        """The response-length model, and what a referenced model file adds (drift, share)."""
        d = dict(self.lengths)
        if "from" in d:
            if len(d) != 1:
                raise ScenarioError("lengths: with 'from', no other key is allowed")
            path = Path(d["from"])
            if not path.is_absolute():
                path = Path(self.base_dir) / path
            try:
                if path.exists():  # a folder, a device or a huge file is refused before reading
                    parse_toml(read_text_bounded(path, "lengths.from"), f"lengths.from: {path}")
                mf = read_model_file(path)
            except LimitError as e:
                raise ScenarioError(str(e)) from None
            except ValueError as e:
                raise ScenarioError(f"lengths.from: {e}") from None
            check_drawable(mf.lengths)
            extra = {"prompt_share": mf.prompt_share, "drift": mf.drift}
            return mf.lengths, extra
        return _length_model(d, "lengths"), {}

    def workload_for(self, seed: int | None = None) -> Workload:
        """The group generator: lengths, prompts, rewards and drift (seed: the scenario's).
        With `lengths = { replay = LOG, ... }`, the log's groups (`aprilsim.workload.replay`)."""
        if "replay" in self.lengths:
            from aprilsim.workload.replay.spec import scenario_workload

            try:
                return scenario_workload(self, seed)  # type: ignore[return-value]
            except ValueError as e:
                raise ScenarioError(str(e)) from None
        lengths, extra = self.length_model()
        p = dict(self.prompts)
        p.pop("max_len", None)
        max_prompt = self.max_prompt_len
        prompt_model = _length_model(p, "prompts")
        w = self.workload
        drift = extra.get("drift")
        if w.drift is not None:
            try:
                drift = drift_from_dict(w.drift)
            except (ValueError, KeyError, TypeError) as e:
                key, sep, _ = str(e).partition(": ")  # `kind: missing` -> workload.drift.kind
                at = "workload.drift." if sep and key.isidentifier() else "workload.drift: "
                raise ScenarioError(f"{at}{e}") from None
        share = w.prompt_share
        if extra.get("prompt_share") is not None and "prompt_share" not in w.model_fields_set:
            share = float(extra["prompt_share"])
        kwargs: dict[str, Any] = {}
        if drift is not None:
            kwargs["drift"] = drift
        if w.episodes is not None:
            kwargs["episodes"] = w.episodes.model()
        return Workload(
            lengths=lengths,
            max_len=self.max_response_len,
            group_size=self.group_size,
            prompt_lengths=prompt_model,
            max_prompt_len=max_prompt,
            prompt_share=share,
            dataset_prompts=w.dataset_prompts,
            rewards=RewardModel(**w.rewards.model_dump()),
            seed=self.seed if seed is None else seed,
            **kwargs,
        )

    def settings_for(self, scheduler: str) -> dict[str, Any]:
        """The knobs of `[schedulers.NAME]` for `scheduler` (empty: its defaults)."""
        return dict(self.schedulers.get(scheduler, {}))

    def check(self) -> Scenario:
        """Cross-field checks pydantic cannot express one key at a time."""
        try:
            check_limits(self)
        except LimitError as e:
            raise ScenarioError(str(e)) from None
        if self.warmup_steps >= self.steps:
            raise ScenarioError(
                f"warmup_steps: {self.warmup_steps} leaves none of the {self.steps} steps to "
                "summarise"
            )
        spec = self.engine_spec()
        max_prompt = self.max_prompt_len
        need = max_prompt + self.max_response_len
        if spec.kv_capacity < need:
            raise ScenarioError(
                f"cluster.kv_capacity: {spec.kv_capacity} tokens is smaller than one max-length "
                f"request (prompts.max_len {max_prompt} + max_response_len {self.max_response_len})"
            )
        longest = getattr(spec.family, "check_longest", None)  # the family's own limits
        if longest is not None:
            try:
                longest(spec, need)
            except ValueError as e:
                raise ScenarioError(f"cluster: {e}") from None
        self.workload_for()  # builds (and so validates) lengths, prompts, drift
        from aprilsim.scheduler_spec import build_scheduler

        for name in dict.fromkeys([*self.compare, *self.schedulers]):
            try:
                build_scheduler(self, name)
            except (ValueError, TypeError) as e:
                msg = str(e)
                raise ScenarioError(msg if msg.startswith(f"schedulers.{name}")
                                    else f"schedulers.{name}: {msg}") from None
        return self


def _finite_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _length_model(d: dict[str, Any], where: str) -> LengthModel:
    """A length model from a scenario table; a key its family does not take is named with the
    family's keys (`lengths.mus` on a lognormal: it takes mu, sigma)."""
    family = d.get("family")
    takes = PARAMETRIC_PARAMS.get(family) if isinstance(family, str) else None
    if family == "lognormal_mixture":
        takes = ("weights", "mus", "sigmas")
    elif family == "empirical":
        takes = ("values",)
    if takes is not None:
        unknown = sorted(set(d) - {"family", *takes})
        if unknown:
            raise ScenarioError(f"{where}.{unknown[0]}: the {family} family has no such key; "
                                f"its keys: family, {', '.join(takes)}")
        for k in takes:
            for i, v in enumerate(d.get(k) if isinstance(d.get(k), list) else [d.get(k)]):
                if v is not None and not _finite_number(v):
                    at = f"{where}.{k}" + (f".{i}" if isinstance(d.get(k), list) else "")
                    raise ScenarioError(f"{at}: expected a finite number, got {v!r}")
    elif isinstance(family, str):
        raise ScenarioError(f"{where}.family: unknown length family {family!r}"
                            f"{did_you_mean(family, FAMILIES)}; known: "
                            f"{', '.join(FAMILIES)}")
    try:
        model = length_model_from_dict(d)
        check_drawable(model)
        return model
    except (ValueError, TypeError, KeyError) as e:
        raise ScenarioError(f"{where}: {e}") from None


def _known_keys(loc: tuple) -> list[str]:
    """The keys a table at `loc` (a pydantic error location) takes, for `did you mean`."""
    model: Any = Scenario
    for part in loc:
        field = getattr(model, "model_fields", {}).get(part)
        ann = getattr(field, "annotation", None)
        model = next((a for a in (ann, *getattr(ann, "__args__", ())) if isinstance(a, type)
                      and issubclass(a, BaseModel)), None)
        if model is None:
            return []
    return [k for k in model.model_fields if k != "base_dir"]


def _format_error(e: ValidationError) -> str:
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err["loc"])
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown key" + did_you_mean(str(err["loc"][-1]), _known_keys(err["loc"][:-1]))
    elif err["type"] == "missing":
        msg = "required key is missing"
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    more = f" (and {len(e.errors()) - 1} more problem(s))" if len(e.errors()) > 1 else ""
    return f"{loc}: {msg}{more}"


def scenario_from_dict(data: dict[str, Any], base_dir: str | Path = ".") -> Scenario:
    """Validate a parsed scenario (`[schedulers.NAME]` tables hold each scheduler's knobs)."""
    data = dict(data)
    data["base_dir"] = str(base_dir)
    try:
        sc = Scenario.model_validate(data)
    except ValidationError as e:
        raise ScenarioError(_format_error(e)) from None
    return sc.check()


def load_scenario(path: str | Path | None = None) -> Scenario:
    """Read and validate a scenario file; None gives the embedded default."""
    if path is None:
        text = default_scenario_text()
        base = Path(".")
        origin = "default scenario"
    else:
        p = Path(path)
        try:
            text = read_text_bounded(p, "scenario")
        except LimitError as e:
            raise ScenarioError(str(e)) from None
        base = p.parent
        origin = str(p)
    try:
        data = parse_toml(text, origin)
    except LimitError as e:
        raise ScenarioError(str(e)) from None
    return scenario_from_dict(data, base)


def with_overrides(sc: Scenario, *, steps: int | None = None,
                   warmup: int | None = None) -> Scenario:
    """The scenario with overrides of steps and warm-up, validated together (the command line's
    `--steps`/`--warmup`; a smaller `--steps` alone keeps at least one step to summarise)."""
    update: dict[str, Any] = {}
    if steps is not None:
        update["steps"] = steps
    if warmup is not None:
        update["warmup_steps"] = warmup
    elif steps is not None:
        update["warmup_steps"] = scaled_warmup(sc.warmup_steps, sc.steps, steps)
    if not update:
        return sc
    out = sc.model_copy(update=update)
    if out.warmup_steps >= out.steps:
        flag = "--warmup" if warmup is not None else "warmup_steps"
        raise ScenarioError(f"{flag} {out.warmup_steps} leaves none of the {out.steps} steps "
                            "to summarise")
    try:  # --steps meets the bounds a file's `steps` meets (run size, simulated clock)
        check_limits(out)
    except LimitError as e:
        raise ScenarioError(str(e)) from None
    return out


def as_scenario(scenario: Scenario | str | Path | dict[str, Any] | None) -> Scenario:
    """A Scenario from a Scenario, a TOML path, a dict, or None (the embedded default)."""
    if scenario is None or isinstance(scenario, (str, Path)):
        return load_scenario(scenario)
    if isinstance(scenario, Scenario):
        return scenario
    return scenario_from_dict(dict(scenario))


def default_scenario() -> Scenario:
    """The embedded default scenario, validated."""
    return load_scenario(None)


EXAMPLES = ("default", "agentic")  # `aprilsim scenario --example NAME`: scenarios/NAME.toml


def example_scenario_text(name: str) -> str:
    """An embedded example scenario as TOML text with its comments ("default": the APRIL
    paper's setup; "agentic": tool-using episodes, docs/agents.md)."""
    if name not in EXAMPLES:
        raise ScenarioError(f"unknown example {name!r}{did_you_mean(name, EXAMPLES)}; known: "
                            f"{', '.join(EXAMPLES)}")
    return resources.files("aprilsim").joinpath(f"scenarios/{name}.toml").read_text()


def default_scenario_text() -> str:
    """The embedded default scenario (the APRIL paper's setup), as TOML text with its comments."""
    return resources.files("aprilsim").joinpath("scenarios/default.toml").read_text()
