"""The step ledger: what each training step generated, trained, wasted and carried over.

The core reports what happens (a rollout begins, tokens are wasted, generation pauses, a batch is
trained); the ledger turns it into `StepRecord`s and, at the end, into the conservation ledger
(`RunResult.end_state`). It reads the engines only through a `Meter`, at the time it is given, so
in simulation a step boundary inside a decode span is measured exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from aprilsim.metrics.agents import turn_lags
from aprilsim.metrics.latency import latency_figures
from aprilsim.metrics.records import AgentStepRecord, StepRecord
from aprilsim.rollout.ports import Meter
from aprilsim.types import Group, SampleStatus


class StepLedger:
    """Per-step accounting of one run (see docs/metrics.md for every figure)."""

    def __init__(
        self,
        meter: Meter,
        expected_length: Callable[[int], float],
        scheduler_stats: Callable[[], dict[str, float]],
    ) -> None:
        self.meter = meter
        self._expected_length = expected_length
        self._scheduler_stats = scheduler_stats
        self.records: list[StepRecord] = []
        self.current: StepRecord | None = None
        self.n_partial = 0  # unfinished samples held for later (the buffer)
        self._gen0 = 0
        self._busy0: list[float] = []
        self._retr0 = 0
        self._engine0: tuple[int, float, int, float, int] = (0, 0.0, 0, 0.0, 0)
        self._waste = self._discarded = self._resumed = 0
        self._paused = False
        self._paused_since = 0.0
        self._paused_s = 0.0
        # agentic runs (episodes): their steps' records are `AgentStepRecord`s
        self.agentic = False
        self._tool_calls = 0
        self._tool_s = 0.0
        self._tool_waiting = False
        self._tool_wait_since = 0.0
        self._tool_wait_s = 0.0
        # samples of released groups, by status value: what `end_state` adds to the live groups
        self._retired_counts = {st.value: 0 for st in SampleStatus}
        self._retired_tokens = dict(self._retired_counts)

    # ------------------------------------------------------------------ during a rollout
    def begin(self, step: int, now: float) -> StepRecord:
        """A rollout for `step` starts at `now`."""
        self.current = StepRecord(step=step, rollout_start_s=now, rollout_time_s=0.0)
        r = self.meter.read(now)
        self._gen0, self._busy0, self._retr0 = r.tokens, r.busy_by_engine, r.retractions
        self._engine0 = (r.iterations, r.prefill_s, r.prefill_tokens, r.spec_s, r.cache_hit_tokens)
        self.meter.new_window(now)
        self._waste = self._discarded = self._resumed = 0
        self._tool_calls, self._tool_s = 0, 0.0
        return self.current

    def wasted(self, tokens: int) -> None:
        """A sample carrying `tokens` was discarded."""
        self._waste += tokens
        self._discarded += 1

    def resumed(self, tokens: int) -> None:
        """A sample carrying `tokens` was resubmitted (slime's resumed-token count)."""
        self._resumed += tokens

    def pause(self, now: float) -> None:
        """PauseGeneration at `now` (a second one while paused changes nothing)."""
        if not self._paused:
            self._paused, self._paused_since = True, now

    def resume(self, now: float) -> None:
        """ResumeGeneration at `now`."""
        if self._paused:
            self._paused_s += now - self._paused_since
        self._paused = False

    def tool_returned(self, seconds: float) -> None:
        """An episode's tool call returned after `seconds`."""
        self._tool_calls += 1
        self._tool_s += seconds

    def tool_wait(self, waiting: bool, now: float) -> None:
        """From `now`, every episode in flight waits on a tool call (`waiting`), or no longer."""
        if waiting and not self._tool_waiting:
            self._tool_wait_since = now
        elif not waiting and self._tool_waiting:
            self._tool_wait_s += now - self._tool_wait_since
        self._tool_waiting = waiting

    def close(self, now: float) -> StepRecord:
        """The rollout of the current step ends at `now`: fill its rollout-phase figures."""
        rec = self.current
        assert rec is not None, "close() without begin()"
        r = self.meter.read(now)
        rec.rollout_time_s = now - rec.rollout_start_s
        rec.generated_tokens = r.tokens - self._gen0
        rec.busy_by_engine_s = [b - b0 for b, b0 in zip(r.busy_by_engine, self._busy0, strict=True)]
        rec.busy_time_s = sum(rec.busy_by_engine_s)
        rec.retractions = r.retractions - self._retr0
        rec.kv_peak_tokens = r.kv_peak
        it0, pf0, pt0, sp0, ch0 = self._engine0
        rec.decode_iterations = r.iterations - it0
        rec.prefill_time_s = r.prefill_s - pf0
        rec.prefill_tokens = r.prefill_tokens - pt0
        rec.speculative_time_s = r.spec_s - sp0
        rec.wasted_tokens = self._waste
        rec.discarded_samples = self._discarded
        rec.resumed_tokens = self._resumed
        rec.scheduler_stats = dict(self._scheduler_stats())
        rec.partial_samples = self.n_partial
        rec.generation_paused_s = self._paused_s + (now - self._paused_since if self._paused
                                                    else 0.0)
        self._paused_s = 0.0
        if self._paused:
            self._paused_since = now
        if self.agentic:
            rec = self._agent_close(rec, r.cache_hit_tokens - ch0, now)
        self.records.append(rec)
        return rec

    def _agent_close(self, rec: StepRecord, hits: int, now: float) -> StepRecord:
        """An agentic step's rollout figures: tool calls, tool time, tool wait, cache hits."""
        out = AgentStepRecord.of(rec)
        a = out.agent
        a.tool_calls, a.tool_time_s, a.cache_hit_tokens = self._tool_calls, self._tool_s, hits
        wait = self._tool_wait_s
        if self._tool_waiting:
            wait += now - self._tool_wait_since
            self._tool_wait_since = now
        a.tool_wait_s = wait
        self._tool_wait_s = 0.0
        return out

    # ------------------------------------------------------------------ training
    def trained(self, rec: StepRecord, groups: Sequence[Group], trainer_version: int) -> None:
        """Fill the trained-batch figures of `rec`; staleness is against `trainer_version`
        (an agentic step's: its episodes' figures too)."""
        self._trained_batch(rec, groups, trainer_version)
        if isinstance(rec, AgentStepRecord):
            self._trained_episodes(rec, groups, trainer_version)

    def _trained_batch(self, rec: StepRecord, groups: Sequence[Group],
                       trainer_version: int) -> None:
        """`trained`'s figures of every batch (responses, staleness, latency)."""
        hist: dict[int, int] = {}
        lat: list[float] = []  # metrics.latency.batch_latency's figures, in the same pass
        wait: list[float] = []
        tokens = prompt = trunc = n = n_groups = 0
        # staleness: the tokens of a run of segments of one lag (the usual batch: a few long
        # runs) are summed before they go into `hist`, one dict update per run, not per
        # segment; a key enters `hist` where its first run ends, so in order of first sight
        run_lag, run_tokens, in_run = 0, 0, False
        for g in groups:
            n_groups += 1
            for s in g.samples:
                n += 1
                gen = s.generated
                tokens += gen
                prompt += s.prompt_len
                trunc += s.complete and gen >= s.max_len  # Sample.truncated, inlined
                for seg in s.segments:
                    lag = trainer_version - seg.version
                    if in_run and lag == run_lag:
                        run_tokens += seg.tokens
                        continue
                    if in_run:
                        hist[run_lag] = hist.get(run_lag, 0) + run_tokens
                    run_lag, run_tokens, in_run = lag, seg.tokens, True
                t0 = s.first_submit_s
                if t0 >= 0:
                    if s.finish_s >= 0:
                        lat.append(s.finish_s - t0)
                    if s.start_s >= 0:
                        wait.append(s.start_s - t0)
        if in_run:
            hist[run_lag] = hist.get(run_lag, 0) + run_tokens
        rec.trained_groups = n_groups
        rec.trained_samples = n
        rec.trained_tokens = tokens
        rec.trained_prompt_tokens = prompt
        rec.truncated_samples = trunc
        rec.mean_trained_length = tokens / n if n else 0.0
        rec.workload_mean_length = self._expected_length(rec.step)
        rec.staleness = hist
        rec.offpolicy_tokens = sum(v for k, v in hist.items() if k > 0)
        lat_fig = latency_figures(lat, wait)
        rec.latency_p50_s, rec.latency_p99_s = lat_fig["latency_p50_s"], lat_fig["latency_p99_s"]
        rec.queue_wait_p50_s = lat_fig["queue_wait_p50_s"]
        rec.queue_wait_p99_s = lat_fig["queue_wait_p99_s"]

    def _trained_episodes(self, rec: AgentStepRecord, groups: Sequence[Group],
                          trainer_version: int) -> None:
        """The trained episodes' figures of `rec`: turns, tool tokens, contexts, policy versions
        per episode and per turn; an episode whose tool tokens took it to max_response_len is
        truncated too (`Sample.truncated`)."""
        a = rec.agent
        for g in groups:
            for s in g.samples:
                ep = s.episode
                if ep is None:
                    continue
                versions, stale = turn_lags(s, trainer_version)
                a.trained_episodes += 1
                a.trained_turns += ep.turn + 1
                a.trained_tool_tokens += ep.appended
                a.trained_context_tokens += s.prompt_len + s.generated + ep.appended
                a.trained_versions += versions
                a.trained_offpolicy_turns += stale
                rec.truncated_samples += s.generated < s.max_len and s.truncated

    def retire(self, group: Group) -> None:
        """Count the samples of `group`, each trained or discarded (they never change again), so
        that the core can let go of it: `end_state` adds them to the groups it is given."""
        counts, tokens = self._retired_counts, self._retired_tokens
        for s in group.samples:
            v = s.status._value_
            counts[v] += 1
            tokens[v] += s.generated

    def retire_trained(self, group: Group) -> None:
        """`retire` for a group whose every sample was just trained (the batch's fast path):
        one count and one token sum for the group, no status to read."""
        gen = 0
        for s in group.samples:
            gen += s.generated
        self._retired_counts["trained"] += len(group.samples)
        self._retired_tokens["trained"] += gen

    # ------------------------------------------------------------------ end of run
    def end_state(self, groups: Iterable[Group]) -> dict[str, int]:
        """Where every sample is, by status, in samples and in tokens (the conservation ledger):
        those of `groups` and of the groups retired before."""
        # keyed by the status's value: an Enum member hashes through a Python-level __hash__
        counts = dict(self._retired_counts)
        tokens = dict(self._retired_tokens)
        for g in groups:
            for s in g.samples:
                v = s.status._value_
                counts[v] += 1
                tokens[v] += s.generated
        out = {f"samples_{k}": v for k, v in counts.items()}
        out.update({f"tokens_{k}": v for k, v in tokens.items()})
        out["samples_created"] = sum(counts.values())
        out["engine_tokens"] = self.meter.engine_tokens()
        return out
