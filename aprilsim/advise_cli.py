"""`aprilsim advise`: the command's options and output; the work is in `aprilsim.advise`."""

from __future__ import annotations

from pathlib import Path

import click

from aprilsim.cli_errors import FiniteFloatRange, fail


@click.command("advise",
               short_help="From a launch config and a length log to a ranked recommendation.")
@click.argument("scenario", required=False,
                type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--slime", metavar="FILE_OR_ARGS",
              help="A slime launch script (or its arguments as one string) to import.")
@click.option("--verl", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A verl PPO/GRPO config (YAML or hydra overrides) to import.")
@click.option("--log", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A generation log `aprilsim fit` reads: the response "
                   "lengths are fitted from it.")
@click.option("--column", help="The log's length column (default: detected).")
@click.option("--calibration", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A cost calibration (`aprilsim calibrate --out`): used as the engine preset.")
@click.option("--max-offpolicy", type=FiniteFloatRange(0, 1),
              help="Limit on the off-policy share of trained tokens (e.g. 0.5).")
@click.option("--max-staleness", type=click.IntRange(min=0),
              help="Limit on the staleness of any trained token (policy versions).")
@click.option("--max-length-bias", type=FiniteFloatRange(min=0),
              help="Limit on |length bias - sync's| (e.g. 0.05).")
@click.option("--candidates",
              help="Comma-separated schedulers to consider (default: every registered one; "
                   "sync is always measured).")
@click.option("--baseline", metavar="NAME",
              help="The scheduler you run today, which the gains are over (default: the one the "
                   "--slime/--verl config runs; sync for a scenario).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Set a scenario key after the import (repeatable).")
@click.option("--steps", type=click.IntRange(min=2),
              help="Training steps per simulation (default: the scenario's).")
@click.option("--warmup", type=click.IntRange(min=0), help="Steps left out of each summary.")
@click.option("--seeds", type=click.IntRange(min=3), default=3, show_default=True,
              help="Paired seeds per setting (and as many fresh ones for the figures).")
@click.option("--rounds", type=click.IntRange(min=1), default=2, show_default=True,
              help="Grid refinements of each tuned knob.")
@click.option("--grid", type=click.IntRange(min=2),
              help="Grid points per round (default: tune's, 7).")
@click.option("--jobs", "-j", type=click.IntRange(min=1), help="Local worker processes.")
@click.option("--json", "as_json", is_flag=True, help="Print the advice as JSON.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("advice"), show_default=True,
              help="Folder for the fitted lengths, the advised scenario and "
                   "advice.json (new or empty).")
@click.option("--force", is_flag=True,
              help="Write into --out even if it holds files (those of the same name are replaced).")
def advise_command(scenario, slime, verl, log, column, calibration, max_offpolicy, max_staleness,
                   max_length_bias, candidates, baseline, sets, steps, warmup, seeds, rounds, grid,
                   jobs, as_json, out_dir, force) -> None:
    """Recommend a rollout scheduler and its knobs for YOUR setup, ranked, in one command.

    Imports the launch config (--slime/--verl, or SCENARIO, or the default), fits the response
    lengths of --log, takes the engine cost from --calibration (else the imported preset), tunes
    each candidate under the limits on paired seeds, and prints the options ranked by their gain
    over the scheduler you run today on fresh seeds (infeasible ones with the limit they miss,
    each marked with whether your framework launches it), with the `aprilsim validate` command
    and the slime flags that try the winner. See docs/advise.md.
    """
    from aprilsim.config import ScenarioError, with_overrides
    from aprilsim.sim.runtime import SchedulerError
    from aprilsim.sweep.cli import _need_pandas

    _need_pandas()
    from aprilsim import advise as adv
    from aprilsim import advise_format as fmt
    from aprilsim.interop.toml_out import dumps
    from aprilsim.outputs import claim_dir
    from aprilsim.report.run_output import strict_json

    try:
        claim_dir(out_dir, "--out", force)
        setup = adv.build_scenario(scenario=scenario, slime=slime, verl=verl, log=log,
                                   calibration=calibration, sets=sets, out_dir=out_dir,
                                   log_column=column)
        sc = with_overrides(setup.scenario, steps=steps, warmup=warmup)
        limits = adv.Limits(max_offpolicy, max_staleness, max_length_bias)
        names = [c.strip() for c in candidates.split(",") if c.strip()] if candidates else None
        for w in setup.warnings:
            click.echo(f"warning: {w}", err=True)
        advice = adv.advise(sc, limits, candidates=names, seeds=seeds, rounds=rounds, grid=grid,
                            jobs=jobs, baseline=baseline or setup.runs,
                            framework=setup.framework, log=lambda m: click.echo(m, err=True))
    except (ScenarioError, SchedulerError, ValueError, OSError) as e:
        fail(str(e))
        return
    advice.sources, advice.warnings = setup.sources, setup.warnings
    scenario_file = out_dir / "advised.toml"
    win = advice.winner
    header = (f"advised by `aprilsim advise`: {win.label if win else 'no option met the limits'}; "
              f"limits: {', '.join(limits.constraints()) or 'none'}")
    scenario_file.write_text(dumps(advice.scenario, header))
    text = strict_json(advice.to_dict())  # no bare NaN: a figure not known is null
    (out_dir / "advice.json").write_text(text + "\n")
    if as_json:
        click.echo(text)
        return
    click.echo(f"advice for {sc.name}: {sc.cluster.engines} engines, {sc.batch_size} groups x "
               f"{sc.group_size} samples, max {sc.max_response_len} tokens")
    for line in advice.sources:
        click.echo(f"  {line}")
    for w in advice.warnings:
        click.echo(f"warning: {w}")
    click.echo(f"limits: {', '.join(limits.constraints()) or 'none'} (each over its 95 % interval)")
    click.echo(f"figures: {seeds} fresh seeds x {sc.steps} steps (the first {sc.warmup_steps} "
               f"left out), paired with {advice.baseline}, "
               + ("what the config runs" if not baseline and advice.framework
                  else "the baseline given" if baseline else "the default baseline"))
    for line in fmt.format_options(advice):
        click.echo(line)
    for line in fmt.try_lines(advice, scenario_file, out_dir):
        click.echo(line)
    click.echo(f"wrote {scenario_file}, {out_dir / 'advice.json'}"
               + (f", {out_dir / 'lengths.toml'}" if log is not None else ""))
