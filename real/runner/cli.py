"""``aprilsim run``: the schedulers of a scenario on live engines, with the records of ``simulate``.

The command is registered by ``aprilsim.cli`` and imported only when it runs (torch and aiohttp
stay out of ``aprilsim``'s import). Exit codes: 0 done, 1 every engine gone (after writing the
steps that finished), 2 bad input (an ``--engines`` / ``--router`` URL that does not answer
``/health`` within 1.5 s, asked of every engine before the first step), 130 interrupted (Ctrl-C
/ SIGTERM, also before the run loop starts: in-flight work aborted on every engine, finished
steps written, engines the command started stopped).

``--progress-deadline S`` (default 60): an engine that holds requests and streams no token for
S seconds is health-checked, and declared dead when it does not answer (its requests are
resubmitted to the others and the fault is reported); 0 turns it off. ``--stalled-after N``
(default 3): an engine that answers healthy but streams no token for N such deadlines in a row
is treated as dead the same way (0: a healthy engine never is). Engine events are said on stderr
as they happen (an engine dropped, silent, re-admitted between steps) and, after the run, one
fault line per event with the requests it cost (docs/real.md).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from aprilsim.cli_errors import FiniteFloatRange, OneLineCommand, fail
from aprilsim.interrupts import set_phase
from aprilsim.metrics.end_state import end_state_lines

from .options import EngineTarget, FreeMode, RunOptions, local_scale


@click.command("run", cls=OneLineCommand,
               short_help="Run schedulers on live engines and record what simulate records.")
@click.argument("scenario", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--scheduler", "-s", "schedulers", multiple=True,
              help="Scheduler to run (repeatable); default: the scenario's `compare` list.")
@click.option("--steps", type=click.IntRange(min=1),
              help="Training steps (overrides the scenario).")
@click.option("--seed", type=int, help="Workload seed (overrides the scenario).")
@click.option("--warmup", type=click.IntRange(min=0), help="Steps left out of the summary.")
@click.option("--json", "as_json", is_flag=True,
              help="Print a JSON array, one object per scheduler (the keys of `simulate --json`).")
@click.option("--steps-out", type=click.Path(dir_okay=False, path_type=Path),
              help="Write per-step records as JSON lines.")
@click.option("--trace", type=click.Path(dir_okay=False, path_type=Path),
              help="Write each scheduler's per-request trace (JSON lines; NAME inserted before the "
                   "suffix when several run).")
@click.option("--timeline", type=click.Path(dir_okay=False, path_type=Path),
              help="Draw each scheduler's timeline (.png/.pdf/.svg, or .html).")
@click.option("--local", type=click.IntRange(min=1),
              help="Start N bundled engines in this process (CPU) and stop them at the end.")
@click.option("--engines",
              help="Comma-separated engine URLs (SGLang or `python -m real.serve`; vllm+http://... "
                   "for vLLM).")
@click.option("--router", help="URL of an sglang-router in front of the engines.")
@click.option("--scale", type=FiniteFloatRange(min=0, max=1, min_open=True),
              help="Multiply every length and the trainer's fixed times by this (default: 1; with "
                   "--local, max_response_len -> 64).")
@click.option("--vocab-size", type=click.IntRange(min=17),
              help="Vocabulary of the engines (default: what the server states, else probed: the "
                   "smallest token id it refuses).")
@click.option("--temperature", type=float, default=1.0, show_default=True)
@click.option("--prompts", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Free mode: prompts JSONL (`input_ids` or `prompt`, optional `answer`); lengths "
                   "from EOS.")
@click.option("--reward",
              help="Free mode: reward function module:function(prompt, output_ids, sample), or "
                   "`toy` (default).")
@click.option("--eos-id", type=int, multiple=True, default=(2,), show_default=True,
              help="Free mode: stop token ids.")
@click.option("--lengths-out", type=click.Path(dir_okay=False, path_type=Path),
              help="Free mode: log observed lengths as JSONL for `aprilsim fit`.")
@click.option("--trainer",
              help="Training callable module:function(groups, step) instead of the modelled sleep.")
@click.option("--checkpoint", help="Weights to load on every update (/update_weights_from_disk).")
@click.option("--progress-deadline", type=FiniteFloatRange(min=0), default=60.0, show_default=True,
              help="Seconds an engine holding requests may stream no token before it is "
                   "health-checked and, if it does not answer, treated as dead (0: never).")
@click.option("--stalled-after", type=click.IntRange(min=0), default=3, show_default=True,
              help="Progress deadlines in a row an engine may answer /health healthy yet stream no "
                   "token before it is treated as dead anyway (0: never).")
@click.option("--local-step-s", type=float, default=0.0, hidden=True,
              help="Pad each step of the --local engines (tests).")
def run_command(scenario, schedulers, steps, seed, warmup, as_json, steps_out, trace, timeline,
                local, engines, router, scale, vocab_size, temperature, prompts, reward, eos_id,
                lengths_out, trainer, checkpoint, progress_deadline, stalled_after,
                local_step_s) -> None:
    """Run SCENARIO's schedulers, unchanged, on live engines (one of --local, --engines,
    --router)."""
    with early_signals_interrupt():
        _run_command(scenario, schedulers, steps, seed, warmup, as_json, steps_out, trace,
                     timeline, local, engines, router, scale, vocab_size, temperature, prompts,
                     reward, eos_id, lengths_out, trainer, checkpoint, progress_deadline,
                     local_step_s, stalled_after)


def early_signals_interrupt():
    """Until the run loop installs its own handlers, SIGINT/SIGTERM end the command with one
    line and exit 130 (not a silent 143 or a traceback while torch imports); `aprilsim run`
    is under the same rule from before the command loads (`aprilsim.cli`)."""
    from aprilsim.interrupts import exit_130

    return exit_130("before the run started; nothing was sent to the engines")


def _printers(live: bool, as_json: bool):
    """(progress, notify) of a run on stderr: steps done (one rewritten line on a terminal), and
    engine events (dropped, re-admitted, silent) at once, each on a line of its own."""
    def progress_for(name: str, done: int, total: int) -> None:
        if live:
            click.echo(f"\r\033[Krunning {name}: step {done}/{total}", err=True, nl=False)
        elif not as_json:
            click.echo(f"{name}: step {done}/{total}", err=True)

    def notify(line: str) -> None:
        click.echo(("\r\033[K" if live else "") + line, err=True)

    return progress_for, notify


def _run_command(scenario, schedulers, steps, seed, warmup, as_json, steps_out, trace, timeline,
                 local, engines, router, scale, vocab_size, temperature, prompts, reward, eos_id,
                 lengths_out, trainer, checkpoint, progress_deadline, local_step_s,
                 stalled_after) -> None:
    from aprilsim.config import ScenarioError, load_scenario, with_overrides
    from aprilsim.policies.base import SchedulerError
    from aprilsim.report.run_output import per_scheduler_paths
    from aprilsim.report.table import format_table

    from .api import run_schedulers

    if (reward or lengths_out) and not prompts:
        fail("--reward and --lengths-out need --prompts (free mode)")
    try:
        target = EngineTarget.from_flags(local=local, engines=engines, router=router,
                                         vocab_size=vocab_size,
                                         progress_deadline_s=progress_deadline,
                                         stalled_after=stalled_after, local_step_s=local_step_s)
        sc = with_overrides(load_scenario(scenario), steps=steps, warmup=warmup)
        names = list(dict.fromkeys(schedulers)) or list(sc.compare)
        from aprilsim.scheduler_spec import check_schedulers

        check_schedulers(sc, names)
        outputs = per_scheduler_paths(names, trace_out=trace, timeline=timeline)
        free = FreeMode(prompts, reward, tuple(eos_id), lengths_out) if prompts else None
        opts = RunOptions(target=target, seed=seed, temperature=temperature, free=free,
                          trainer=trainer, checkpoint=checkpoint, outputs=outputs,
                          scale=scale if scale is not None else (
                              local_scale(sc.max_response_len) if local else 1.0))
    except (ScenarioError, SchedulerError, ValueError, TypeError) as e:
        fail(str(e))
        return
    live = sys.stderr.isatty()
    try:
        out = run_schedulers(sc, names, opts, *_printers(live, as_json))
    except (ScenarioError, SchedulerError, ValueError) as e:
        fail(str(e))
        return
    set_phase("while the results were written; what was written is kept")
    if live:
        click.echo("\r\033[K", err=True, nl=False)
    for path in out.written:
        click.echo(f"wrote {path}", err=True)
    if steps_out is not None:
        steps_out.write_text("".join(json.dumps(r) + "\n" for r in out.records))
    for note in out.notes:
        click.echo(note, err=True)
    if out.rows:
        if as_json:  # the keys of `simulate --json`, its `run` metadata included
            from aprilsim.cli_errors import command_line
            from aprilsim.metrics.gain import gain_vs_sync
            from aprilsim.report.run_output import run_meta

            meta = run_meta(sc, sc.seed if opts.seed is None else opts.seed, command_line())
            gains = gain_vs_sync({r["scheduler"]: [r] for r in out.rows})  # live: idle and context
            rows = [{**r, "run": meta, **({"gain_vs_sync": gains[r["scheduler"]][1][0]}
                                          if r["scheduler"] in gains else {})} for r in out.rows]
            click.echo(json.dumps(rows, indent=2))
        else:
            click.echo(f"scenario: {sc.name} live, lengths x{opts.scale:.4g}  ({len(out.rows)} "
                       f"scheduler(s), {sc.batch_size} groups x {sc.group_size} samples, "
                       f"{sc.steps} steps)")
            click.echo(format_table(out.rows))
            click.echo(end_state_lines(out.rows))
            from aprilsim.metrics.gain import gain_lines, gain_vs_sync

            gains = gain_vs_sync({r["scheduler"]: [r] for r in out.rows})
            for line in gain_lines({name: g[0] for name, g in gains.items()}):
                click.echo(line)
    if out.error:
        click.echo(f"aprilsim: error: {out.error}", err=True)
        sys.exit(out.code)
