"""Step records and the run summary. Every figure here is defined in docs/metrics.md."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from aprilsim.metrics.agents import AgentStep, agent_summary
from aprilsim.metrics.gain import engine_time
from aprilsim.metrics.steady import steady_state


@dataclass
class StepRecord:
    """What happened in one training step (see docs/metrics.md for each definition)."""

    step: int
    rollout_start_s: float
    rollout_time_s: float
    step_time_s: float = 0.0
    train_time_s: float = 0.0
    generated_tokens: int = 0  # during the rollout phase, aborted segments included
    busy_time_s: float = 0.0  # summed over engines, during the rollout phase
    busy_by_engine_s: list[float] = field(default_factory=list)  # the same, engine by engine
    trained_samples: int = 0
    trained_groups: int = 0
    trained_tokens: int = 0  # response tokens of the batch
    trained_prompt_tokens: int = 0
    mean_trained_length: float = 0.0
    workload_mean_length: float = 0.0
    truncated_samples: int = 0
    offpolicy_tokens: int = 0
    staleness: dict[int, int] = field(default_factory=dict)  # staleness -> trained tokens
    resumed_tokens: int = 0  # tokens resubmitted samples carried into their resubmission
    wasted_tokens: int = 0
    discarded_samples: int = 0
    partial_samples: int = 0  # unfinished samples carried to later steps (buffer)
    retractions: int = 0
    kv_peak_tokens: int = 0
    generation_paused_s: float = 0.0  # time submissions were held by PauseGeneration
    scheduler_stats: dict[str, float] = field(default_factory=dict)  # what the scheduler adds
    # request latency of the trained responses (aprilsim.metrics.latency): None where not known
    latency_p50_s: float | None = None  # first submit -> completion
    latency_p99_s: float | None = None
    queue_wait_p50_s: float | None = None  # first submit -> first scheduled on an engine
    queue_wait_p99_s: float | None = None
    # engine time during the rollout phase (the gain decomposition, aprilsim.metrics.gain);
    # 0 where the engines do not report it (live)
    decode_iterations: int = 0  # summed over engines
    prefill_time_s: float = 0.0  # seconds of prefill batches that ended, summed over engines
    prefill_tokens: int = 0  # tokens those batches prefilled
    # speculative decoding: decode seconds less what the same steps cost without it (negative
    # when it saves), summed over engines; 0 without it
    speculative_time_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (one line of `simulate --steps-out`); staleness keys as strings."""
        d = asdict(self)
        d["staleness"] = {str(k): v for k, v in sorted(self.staleness.items())}
        return d


@dataclass
class AgentStepRecord(StepRecord):
    """The record of a step of an agentic run: a `StepRecord` with its episodes' figures
    (`agent`, `aprilsim.metrics.agents`). Only agentic runs use it, so a single-turn run's
    records keep their exact shape (JSON lines, digests)."""

    agent: AgentStep = field(default_factory=AgentStep)

    @classmethod
    def of(cls, rec: StepRecord) -> AgentStepRecord:
        """`rec` with an empty `agent` (a run learns it is agentic when its first groups come)."""
        if isinstance(rec, AgentStepRecord):
            return rec
        return cls(**{f.name: getattr(rec, f.name) for f in fields(StepRecord)})


@dataclass
class RunResult:
    """One scheduler's simulated run: its step records and what the summary needs besides."""

    scheduler: str
    steps: list[StepRecord]
    n_engines: int
    peak_tokens_per_s: float  # per engine, the ideal used by `efficiency`
    total_time_s: float
    end_state: dict[str, int] = field(default_factory=dict)
    warmup_steps: int = 0  # steps the summary leaves out (cold start: no buffer yet)
    iteration_cost_s: float = 0.0  # fixed seconds per decode iteration (aprilsim.metrics.gain)

    def summary(self, warmup: int | None = None) -> dict[str, Any]:
        """The run's table row, leaving out the first `warmup` steps (default: `warmup_steps`)."""
        return summarize(self, self.warmup_steps if warmup is None else warmup)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def slime_off_policy_ratio(steps: list[StepRecord]) -> float:
    """slime's `partial_rollout/off_policy_ratio`, averaged over `steps` (0 where none is logged).

    Per step, as the APRIL fork computes it (`slime/backends/megatron_utils/data.py`):
    off / (generated + off), where off = `scheduler_stats["slime_offpolicy_tokens"]` (the last
    segment's tokens of each resubmitted sample, added at resubmission) and generated = the tokens
    generated in the step's rollout (slime's `total_completion_tokens`).
    """
    ratios = []
    for s in steps:
        off = s.scheduler_stats.get("slime_offpolicy_tokens", 0.0)
        if s.generated_tokens + off > 0:
            ratios.append(off / (s.generated_tokens + off))
    return _mean(ratios)


def mean_latency(steps: list[StepRecord]) -> dict[str, float | None]:
    """Each latency figure of the steps (p50, p99 of completion time and queue wait), averaged
    over the steps that know it (None where none does)."""
    out: dict[str, float | None] = {}
    for key in ("latency_p50_s", "latency_p99_s", "queue_wait_p50_s", "queue_wait_p99_s"):
        xs = [v for s in steps if (v := getattr(s, key)) is not None]
        out[key] = sum(xs) / len(xs) if xs else None
    return out


def summarize(run: RunResult, warmup: int = 0) -> dict[str, Any]:
    """The per-run table row over steps `warmup`.. (JSON keys are part of the CLI's contract).

    Warm-up steps are left out of every figure: step 0 of APRIL has no buffer to resume, so
    counting it understates what the scheduler does in steady state.
    """
    if not 0 <= warmup < max(1, len(run.steps)):
        raise ValueError(f"warmup {warmup} must be >= 0 and below the {len(run.steps)} steps run")
    st = run.steps[warmup:]
    measured_s = run.total_time_s - st[0].rollout_start_s if st else 0.0
    roll = sum(s.rollout_time_s for s in st)
    gen = sum(s.generated_tokens for s in st)
    trained = sum(s.trained_tokens for s in st)
    samples = sum(s.trained_samples for s in st)
    hist: Counter[int] = Counter()
    for s in st:
        hist.update(s.staleness)
    busy = sum(s.busy_time_s for s in st)
    samples_per_s = samples / measured_s if measured_s else 0.0
    per_engine = [sum(b) for b in zip(*(s.busy_by_engine_s for s in st))] if st else []
    workload_mean = _mean([s.workload_mean_length for s in st])
    mean_len = trained / samples if samples else 0.0
    ideal = run.n_engines * run.peak_tokens_per_s * roll
    return {
        "scheduler": run.scheduler,
        "steps": len(st),
        "warmup_steps": warmup,
        "rollout_throughput_tok_s": gen / roll if roll else 0.0,
        "samples_per_s": samples_per_s,
        "mean_rollout_time_s": roll / len(st) if st else 0.0,
        "mean_step_time_s": _mean([s.step_time_s for s in st]),
        "total_time_s": measured_s,
        "engine_busy_fraction": min(1.0, busy / (run.n_engines * roll)) if roll else 0.0,
        "engine_busy_fraction_by_engine": [min(1.0, b / roll) if roll else 0.0 for b in per_engine],
        "engine_idle_time_s": max(0.0, run.n_engines * roll - busy),  # no rounding remainder
        "efficiency_vs_ideal": gen / ideal if ideal else 0.0,
        "generated_tokens": gen,
        "trained_tokens": trained,
        "trained_samples": samples,
        "offpolicy_token_fraction": (sum(s.offpolicy_tokens for s in st) / trained
                                     if trained else 0.0),
        "max_staleness": max((k for k, v in hist.items() if v), default=0),
        "staleness_histogram": {str(k): v for k, v in sorted(hist.items())},
        "resumed_token_fraction": (
            sum(s.resumed_tokens for s in st) / trained if trained else 0.0
        ),
        "slime_off_policy_ratio": slime_off_policy_ratio(st),
        "masked_token_fraction": (
            sum(s.scheduler_stats.get("masked_tokens", 0.0) for s in st) / trained
            if trained else 0.0
        ),
        "mean_trained_length": mean_len,
        "workload_mean_length": workload_mean,
        "length_bias": mean_len / workload_mean - 1.0 if workload_mean else 0.0,
        "truncated_fraction": sum(s.truncated_samples for s in st) / samples if samples else 0.0,
        "wasted_tokens": sum(s.wasted_tokens for s in st),
        "discarded_samples": sum(s.discarded_samples for s in st),
        "mean_partial_samples": _mean([s.partial_samples for s in st]),
        "retractions": sum(s.retractions for s in st),
        "kv_peak_tokens": max((s.kv_peak_tokens for s in st), default=0),
        "generation_paused_s": sum(s.generation_paused_s for s in st),
        **mean_latency(st),
        "engine_time_s": engine_time(st, run.n_engines, run.iteration_cost_s),
        **steady_state(st),
        **agent_summary(st, samples_per_s),
    }
