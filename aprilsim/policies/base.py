"""The policy interface shared by the simulator and the live-engine runner.

A scheduler is a small state machine with no clock, no I/O, no simpy and no asyncio. The rollout
core (`aprilsim.rollout`) feeds it events and carries out the actions it returns; the core is
driven in simulated time by `aprilsim.sim` and against live engines by `real/`. Because a scheduler
sees only events, the very same object can run in simulation and on live engines, which is what
makes predicted-vs-measured comparisons meaningful.

What a scheduler may rely on, the same in both runtimes (decided in `aprilsim.rollout.core`):

* Actions are carried out in order; the next event comes only after the whole list.
* `AbortAll`: the aborted samples stay RUNNING (and count in `ctx.in_flight`) until the abort lands,
  so the actions after it in the same list see them in flight (resubmitting or discarding one is
  an error). They come back later in one `SamplesReturned`, in the order they were sent
  (requests that finished first arrive as `SampleFinished`/`GroupFinished` before it), never
  before the events already queued have been handled; how much later depends on the engine
  (`abort_steps`), and other events may come in between. Samples submitted meanwhile start once
  it has landed; aborts land in the order asked. An interrupting `UpdateWeights` aborts the same
  way; the sync starts once its
  abort has landed.
* A `Submit` during a weight sync is taken at once: the samples are RUNNING, stamped with the new
  version, and count in flight; their requests start once the new weights are loaded.
* A sample is complete when it reaches its end: its target length in simulation and replay, the
  model's stop (or max_response_len) in free generation. A request that ends short of it came back
  at a token cap (`SampleCapped`). `Sample.truncated` (complete at max_response_len) is the one
  definition of truncation.
* An episode (an agentic sample, `Sample.episode`) is one sample to a scheduler: it is submitted
  once and finishes once (`SampleFinished` at its last turn's end). In between, the core drives
  its turns: when a turn ends short of the episode's end, the sample stays RUNNING (in flight)
  while its tool call runs, then its next turn is sent, under the version of that moment. A
  scheduler that sets `turn_events = True` takes the turns itself: `TurnEnded`, `CallTools`,
  `ToolReturned`, `Submit`. `AbortAll` stops turns in flight and cancels tool calls running; an
  episode comes back at the turn where it stopped, and a cancelled tool call runs again when it
  is resubmitted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal, Protocol, runtime_checkable

from aprilsim.types import Group, Sample

Mode = Literal["colocated", "disaggregated"]


class SchedulerError(RuntimeError):
    """A scheduler asked for something impossible, or gave up (e.g. dynamic sampling's round
    cap)."""


# ------------------------------------------------------------------------------------ events
@dataclass(frozen=True, slots=True)
class RolloutStarted:
    """A rollout for training step `step` begins; engines hold policy `version`."""

    step: int
    version: int


@dataclass(frozen=True, slots=True)
class SampleFinished:
    """One sample finished (stop token or max length)."""

    sample: Sample


@dataclass(frozen=True, slots=True)
class GroupFinished:
    """Every sample of `group` has finished."""

    group: Group


@dataclass(frozen=True, slots=True)
class SamplesReturned:
    """Samples came back unfinished (after an abort or an interrupting weight update)."""

    samples: tuple[Sample, ...]


@dataclass(frozen=True, slots=True)
class SampleCapped:
    """A sample used up the `max_new_tokens` of its submission (a token budget) and came back
    unfinished; it is PARTIAL and may be resubmitted later."""

    sample: Sample


@dataclass(frozen=True, slots=True)
class TurnEnded:
    """An episode's model turn ended and it called a tool; only to a scheduler that sets
    `turn_events = True` (a per-turn barrier). The episode is PARTIAL with its tool call
    pending (`sample.episode.calling`): `CallTools` runs it, and a `Submit` runs it, then the
    next turn."""

    sample: Sample


@dataclass(frozen=True, slots=True)
class ToolReturned:
    """A tool call started by `CallTools` returned: its tokens are appended and the episode is
    PARTIAL, ready for its next turn (`Submit`)."""

    sample: Sample


@dataclass(frozen=True, slots=True)
class TrainStepDone:
    """Disaggregated mode: the trainer finished step `step`; new weights wait to be synced."""

    step: int


@dataclass(frozen=True, slots=True)
class WeightsUpdated:
    """Engines now hold policy `version`."""

    version: int


Event = (
    RolloutStarted
    | SampleFinished
    | GroupFinished
    | SamplesReturned
    | SampleCapped
    | TurnEnded
    | ToolReturned
    | TrainStepDone
    | WeightsUpdated
)


# ----------------------------------------------------------------------------------- actions
@dataclass(frozen=True, slots=True)
class Submit:
    """Generate these samples (new, or resumed: the runtime re-prefills what they carry).

    `max_new_tokens` caps what this submission may generate per sample (a per-step token budget);
    a sample that reaches the cap unfinished comes back in a SampleCapped event.

    `priority` (higher first) orders the requests in their engine's admission queue (SGLang's
    priority scheduling); `route` sends each to a named engine (its index), with `MOST_ROOM`
    to the engine with the most free KV room at that moment, with `BY_GROUP` to its group's
    engine (the group's first request to the least-loaded one); None leaves it to the runtime's
    router. Length-aware schedulers (Seer) use the three together: a piece of at most
    `max_new_tokens` tokens, longest-first by priority, to the engine with room. `keep_kv`: a
    resumed sample's KV moves with it to its new engine (Seer's global KV cache), so its prefill
    computes only its last token, once the KV has arrived (`[cluster] kv_transfer`: a
    Mooncake-style pool by default); simulated only (live engines re-prefill).
    """

    samples: tuple[Sample, ...]
    max_new_tokens: int | None = None
    priority: int = 0
    route: int | str | None = None
    keep_kv: bool = False


MOST_ROOM = "most_room"  # Submit.route: the engine with the most free KV room (per request)
"""`Submit(..., route=MOST_ROOM)`: each request goes to the engine with the most free KV room at
the moment it is sent (what Seer's divided rollout does), instead of the runtime's router."""
BY_GROUP = "by_group"
"""`Submit(..., route=BY_GROUP)`: each request goes to its group's engine (the group's first
request to the least-loaded engine, the rest follow): veRL's dispatch of whole groups per
instance, `sync@dispatch=group`."""


@dataclass(frozen=True, slots=True)
class CloseBatch:
    """Hand these finished groups to the trainer as the batch of the current step."""

    groups: tuple[Group, ...]


@dataclass(frozen=True, slots=True)
class AbortAll:
    """Abort everything in flight; unfinished samples come back in one SamplesReturned event."""


@dataclass(frozen=True, slots=True)
class Discard:
    """Throw these samples away; their tokens count as waste."""

    samples: tuple[Sample, ...]


@dataclass(frozen=True, slots=True)
class UpdateWeights:
    """Disaggregated mode: sync the trained weights to the engines now.

    interrupt=False: in-flight requests pause during the sync and continue (their tokens keep the
    version they were submitted under); interrupt=True: they are aborted and come back in a
    SamplesReturned event, to be resubmitted (re-prefilled) under the new version.
    """

    interrupt: bool = False


@dataclass(frozen=True, slots=True)
class CallTools:
    """Run the pending tool calls of these episodes (each PARTIAL after a `TurnEnded`); each
    comes back in a `ToolReturned` event (a per-turn barrier on tools)."""

    samples: tuple[Sample, ...]


@dataclass(frozen=True, slots=True)
class PauseGeneration:
    """Stop admitting new work (in-flight requests continue); e.g. a staleness bound is hit."""


@dataclass(frozen=True, slots=True)
class ResumeGeneration:
    """Undo PauseGeneration: submissions held back are sent."""


Action = (Submit | CloseBatch | AbortAll | Discard | UpdateWeights | PauseGeneration
          | ResumeGeneration | CallTools)


# ---------------------------------------------------------------------------------- context
class GroupSource(Protocol):
    """Where new prompts come from (a dataset in real runs, the workload in simulation)."""

    def new_groups(self, n: int, step: int) -> list[Group]: ...


@dataclass
class Context:
    """What a scheduler may read about the world when it handles an event."""

    source: GroupSource
    batch_size: int  # N: groups per training step
    max_len: int
    step: int = 0
    version: int = 0
    in_flight: int = 0  # samples submitted and not yet returned
    total_steps: int | None = None  # steps the runtime will train (None: unbounded)
    group_size: int | None = None  # samples per prompt of the workload

    def new_groups(self, n: int, group_size: int | None = None) -> list[Group]:
        """`n` new prompts; `group_size` asks for more (or fewer) samples per prompt than usual."""
        if group_size is None:
            return self.source.new_groups(n, self.step)
        return self.source.new_groups(n, self.step, group_size)  # type: ignore[call-arg]

    def regenerate(self, groups: Sequence[Group], group_size: int) -> list[Group]:
        """Fresh groups for the prompts of `groups`, generated from scratch (new samples)."""
        regen = getattr(self.source, "regenerate", None)
        if regen is None:
            raise SchedulerError("this runtime's group source cannot re-run prompts")
        return regen(groups, self.step, group_size)


@runtime_checkable
class Scheduler(Protocol):
    """Events in, actions out. `mode` says whether training blocks the engines (colocated).

    A scheduler may set a class attribute `sample_events = False` to skip SampleFinished events
    (group completions still arrive); runtimes honour it to save work on large clusters. A class
    attribute `variants` (knob settings) names what the test suites run besides its defaults
    (`registry.variants`).
    """

    name: ClassVar[str]
    mode: Mode

    def handle(self, event: Event, ctx: Context) -> Sequence[Action]:
        """The actions for `event`, carried out in order before the next event comes."""
        ...

    def step_stats(self) -> dict[str, float]:
        """Scheduler-specific per-step figures (e.g. dynamic-sampling rounds); reset on read."""
        ...
