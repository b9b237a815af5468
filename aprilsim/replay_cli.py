"""`aprilsim replay-validate RUN` (and `validate --from-log`): offline validation against a run's
own logs (`aprilsim.validate.from_log`). A top-level module: importing it loads only click, so the
command line starts light (`aprilsim.validate` loads pydantic)."""

from __future__ import annotations

from pathlib import Path

import click

from aprilsim.cli_errors import OneLineCommand, fail


def from_log_args(args: list[str]) -> list[str]:
    """`validate [SCENARIO] --from-log RUN ...` as
    `replay-validate RUN [--scenario SCENARIO] ...`."""
    rest, run, scenario, i = [], None, None, 0
    takes_value = {o for p in replay_validate_command.params for o in getattr(p, "opts", [])
                   if not getattr(p, "is_flag", False) and p.param_type_name == "option"}
    while i < len(args):
        a = args[i]
        if a == "--from-log" and i + 1 < len(args):
            run, i = args[i + 1], i + 2
            continue
        if a.startswith("--from-log="):
            run, i = a.split("=", 1)[1], i + 1
            continue
        if a in takes_value and i + 1 < len(args):
            rest += [a, args[i + 1]]
            i += 2
            continue
        if not a.startswith("-") and scenario is None:
            scenario = a  # validate's positional SCENARIO
        else:
            rest.append(a)
        i += 1
    out = ["replay-validate", *([run] if run else []), *rest]
    return out + (["--scenario", scenario] if scenario else [])


def _base_scenario(scenario: Path | None, from_slime: str | None, from_verl: Path | None):
    """The run's scenario and the scheduler it names: a TOML, a slime/verl config, or the
    default."""
    from aprilsim.config import load_scenario, scenario_from_dict

    if from_slime is not None or from_verl is not None:
        from aprilsim import interop

        if from_slime is not None:
            p = Path(from_slime)
            res = interop.from_slime(p.read_text() if p.is_file() else from_slime)
        else:
            res = interop.from_verl(from_verl.read_text())
        sc = scenario_from_dict(res.data)
        return sc, sc.compare[-1]
    sc = load_scenario(scenario)
    return sc, (sc.compare[0] if len(sc.compare) == 1 else None)


@click.command("replay-validate", cls=OneLineCommand,
               short_help="Replay a run's logged groups, compare predicted and logged step times.")
@click.argument("run", required=False, type=click.Path(exists=True, path_type=Path))
@click.option("--scenario", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The run's scenario (cluster, trainer, scheduler knobs); its lengths "
                   "may hold the replay spec.")
@click.option("--from-slime", metavar="FILE_OR_ARGS",
              help="The run's slime launch script (or flags): cluster and scheduler from it.")
@click.option("--from-verl", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The run's verl config: cluster and scheduler from it.")
@click.option("--scheduler", "-s", "spec",
              help="The scheduler the run used (NAME or NAME@knob=v,...); default: "
                   "the one its config names.")
@click.option("--compare", "-c", "others", multiple=True,
              help="Counterfactual: also simulate this scheduler on the same replay "
                   "(repeatable; predictions only).")
@click.option("--timing", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Per-step rollout times: slime's log (perf N: {...}), verl's console or "
                   "metrics (timing_s/gen), a wandb export, or a CSV of step, rollout_s.")
@click.option("--timing-key", metavar="KEY",
              help="The metric the times are read under (default: perf/rollout_time, "
                   "timing_s/gen, or a table's rollout-time column), e.g. "
                   "timing_s/generate_sequences or "
                   "timing_s/agent_loop/generate_sequences/max: generation alone.")
@click.option("--calibration", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A cost to simulate with: a preset file (`aprilsim calibrate --out`) or a "
                   "TOML with a [cost] table.")
@click.option("--preset", help="An engine preset (`aprilsim presets`) instead of the scenario's.")
@click.option("--format", "fmt", type=click.Choice(["auto", "slime", "verl", "table"]),
              default="auto", show_default=True, help="The log's format.")
@click.option("--unlogged", type=click.Choice(["skip", "cap", "draw"]),
              help="Prompts the run drew but never trained (gaps in slime's group_index): leave "
                   "out, run their responses to the cap (in flight at the end), or draw them from "
                   "the logged lengths (dropped surplus).")
@click.option("--tokenizer", type=click.Path(exists=True, path_type=Path),
              help="verl: the run's tokenizer.json, to count the tokens of its text dumps.")
@click.option("--eos-tokens", type=click.IntRange(min=0),
              help="verl: tokens added to each re-tokenised response (1: the "
                   "EOS the dump skipped).")
@click.option("--warmup", type=click.IntRange(min=0),
              help="Steps left out of the errors (default: the scenario's).")
@click.option("--no-figures", is_flag=True, help="Write report.md and report.json only.")
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory for report.md, report.json and the figure (new or empty).")
@click.option("--force", is_flag=True,
              help="Write into --out even if it holds files (those of the same name are replaced).")
def replay_validate_command(run, scenario, from_slime, from_verl, spec, others, timing,
                            timing_key, calibration, preset, fmt, unlogged, tokenizer, eos_tokens,
                            warmup, no_figures, out, force) -> None:
    """Replay RUN's logged groups (slime's --save-debug-rollout-data dumps, verl's
    trainer.rollout_data_dir, or a table with step and prompt columns) under the run's scheduler,
    simulated with a preset or calibration, and report predicted vs logged per-step rollout time
    (median error and its spread) in `aprilsim validate`'s format."""
    from aprilsim.config import ScenarioError, with_overrides
    from aprilsim.outputs import claim_dir
    from aprilsim.policies.base import SchedulerError
    from aprilsim.validate.from_log import replay_run, replay_scenario, write_from_log
    from aprilsim.workload.replay.spec import notes_for

    if sum(x is not None for x in (scenario, from_slime, from_verl)) > 1:
        fail("give at most one of --scenario, --from-slime, --from-verl")
    if calibration is not None and preset is not None:
        fail("give at most one of --calibration, --preset")
    try:
        sc, named = _base_scenario(scenario, from_slime, from_verl)
        if scenario is None and from_slime is None and from_verl is None:
            cost = calibration or preset or f"preset {sc.cluster.preset}"
            click.echo(f"aprilsim: note: no --scenario, --from-slime or --from-verl: the default "
                       f"scenario's cluster is simulated ({sc.cluster.engines} engines, cost "
                       f"{cost}, its trainer); give the run's own", err=True)
        spec = spec or named
        if spec is None:
            fail(f"say which scheduler the run used: -s NAME (the scenario compares "
                 f"{', '.join(sc.compare)})")
        log_spec = dict(sc.lengths) if "replay" in sc.lengths else {}
        if run is not None:
            log_spec = {k: v for k, v in log_spec.items() if k not in ("replay", "timing")}
            log_spec["replay"] = str(run.resolve())
        if "replay" not in log_spec:
            fail("give the run's log: RUN (or lengths = { replay = ... } in --scenario)")
        claim_dir(out, "--out", force)  # before the work: a taken folder costs nothing
        for key, val in (("timing", timing), ("tokenizer", tokenizer)):
            if val is not None:
                log_spec[key] = str(val.resolve())
        if timing_key is not None:
            log_spec["timing_key"] = timing_key
        if fmt != "auto":
            log_spec["format"] = fmt
        if unlogged is not None:
            log_spec["unlogged"] = unlogged
        if eos_tokens is not None:
            log_spec["eos_tokens"] = eos_tokens
        if calibration is not None or preset is not None:
            chosen = str(calibration.resolve()) if calibration is not None else preset
            sc = sc.model_copy(update={"cluster": sc.cluster.model_copy(update={"preset": chosen})})
            from aprilsim.config import scenario_from_dict

            sc = scenario_from_dict(sc.model_dump(exclude={"base_dir"}), sc.base_dir)
        source = (f"{calibration}" if calibration is not None else
                  f"preset {sc.cluster.preset}")
        rsc = with_overrides(replay_scenario(sc, log_spec), warmup=warmup)
        for note in notes_for(rsc.workload_for()):
            click.echo(f"aprilsim: {note}", err=True)
        runs = [replay_run(rsc, spec)]
        rep = write_from_log(rsc, runs, out, calibration_from=source, figures=not no_figures)
        cf = [replay_run(rsc, o) for o in others]
    except (ScenarioError, SchedulerError, ValueError, OSError) as e:
        fail(str(e))
        return
    click.echo(f"wrote {out / 'report.md'}", err=True)
    for s in rep["schedulers"]:
        e = s["errors"]
        med = e.get("step_rollout_median_abs")
        spread = (f" [{100 * e['step_rollout_p10']:+.1f}%, {100 * e['step_rollout_p90']:+.1f}%]"
                  if med is not None else "")
        click.echo(f"{s['label']}: rollout {s['predicted']['mean_rollout_time_s']:.3f}s predicted, "
                   f"{s['measured']['mean_rollout_time_s']:.3f}s logged; per-step error "
                   f"{'n/a' if med is None else f'{100 * med:.1f}%'} median abs{spread} "
                   f"(bias {100 * e.get('step_rollout_median', 0.0):+.1f}%)")
    base = runs[0].result.summary()
    for o in cf:
        s = o.result.summary()
        gain = s["rollout_throughput_tok_s"] / base["rollout_throughput_tok_s"] - 1
        click.echo(f"counterfactual {o.label}: rollout {s['mean_rollout_time_s']:.3f}s, "
                   f"throughput {gain:+.1%} vs {runs[0].label} (predicted; {o.notes[0]})")
