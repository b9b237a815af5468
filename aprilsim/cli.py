"""`aprilsim ...`: the command line. Bad input prints one line and exits with code 2."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from aprilsim._version import __version__
from aprilsim.cli_errors import EXIT_USAGE, OneLineGroup, command_line, fail
from aprilsim.native import build_line

__all__ = ["EXIT_USAGE", "fail", "main", "with_overrides"]


class _LazyGroup(OneLineGroup):
    """Commands load when invoked: those outside `aprilsim` (the live runner in `real/`), so that
    importing aprilsim never imports real/, torch or aiohttp, and those beside the code they drive
    (fit, sweep, calibrate, ...), so that `aprilsim simulate` loads none of their modules.

    `lazy`: name -> (module, attribute), the attribute a click command or a function returning
    one; a loaded command is added to the group, so it loads once."""

    lazy = {
        "run": ("real.runner.cli", "run_command"),
        "validate": ("real.validate_cli", "validate_command"),
        "fit": ("aprilsim.workload.fitting.cli", "fit_command"),
        "plot": ("aprilsim.cli", "_plot_group"),
        "sweep": ("aprilsim.sweep.cli", "sweep_command"),
        "tune": ("aprilsim.sweep.cli", "tune_command"),
        "calibrate": ("aprilsim.cli", "_calibrate_command"),
        "replay-validate": ("aprilsim.replay_cli", "replay_validate_command"),
        "advise": ("aprilsim.advise_cli", "advise_command"),
    }
    live = frozenset({"run", "validate"})  # the live-engine extra's commands
    # what `aprilsim --help` lists for them, so that listing imports none (test_startup checks
    # these are the commands' own short help)
    lazy_help = {
        "run": "Run schedulers on live engines and record what simulate records.",
        "validate": "Simulation vs live engines: calibrate, run both, report the errors.",
        "fit": "Fit length distributions to generation logs.",
        "plot": "Figures from simulation outputs (needs matplotlib).",
        "sweep": "Sweep scenario keys x schedulers x seeds; tidy table out.",
        "tune": "Best knob setting under constraints (seed-noise aware).",
        "calibrate": "Fit the engine cost model to measured timings; write a preset file.",
        "replay-validate": "Replay a run's logged groups, compare predicted and logged step times.",
        "advise": "From a launch config and a length log to a ranked recommendation.",
    }
    _listing = False

    def main(self, args=None, *rest, **kwargs):
        self.argv = list(sys.argv[1:] if args is None else args)  # the command line, for metadata
        if self.argv[:1] == ["run"]:  # a signal from now on: one line, exit 130, not `Aborted!`
            from aprilsim.interrupts import exit_130

            with exit_130("before the run started; nothing was sent to the engines"):
                return super().main(args, *rest, **kwargs)
        return super().main(args, *rest, **kwargs)

    def resolve_command(self, ctx, args):
        """`validate --from-log RUN ...` is `replay-validate RUN ...` (offline, no live extra);
        an unknown command gets "did you mean"."""
        if args and args[0] == "validate" and any(a == "--from-log" or a.startswith("--from-log=")
                                                  for a in args[1:]):
            from aprilsim.replay_cli import from_log_args

            args = from_log_args(args[1:])
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as e:
            from aprilsim.suggest import did_you_mean

            hint = did_you_mean(args[0], self.list_commands(ctx)) if args else ""
            if not hint or "No such command" not in e.message:
                raise
            raise click.UsageError(e.message.rstrip(".") + hint, ctx) from None

    def list_commands(self, ctx):
        return sorted({*super().list_commands(ctx), *self.lazy})

    def format_commands(self, ctx, formatter):
        self._listing = True
        try:
            super().format_commands(ctx, formatter)
        finally:
            self._listing = False

    def get_command(self, ctx, name):
        cmd = super().get_command(ctx, name)
        if cmd is None and name in self.lazy and self._listing:
            return click.Command(name, short_help=self.lazy_help[name])
        if cmd is None and name in self.lazy:
            cmd = self.load(name)
        return cmd

    def load(self, name: str) -> click.Command:
        """Import lazy command `name` and add it to the group (one line, exit 2, when the
        live-engine extra it needs is missing)."""
        import importlib

        module, attr = self.lazy[name]
        if name not in self.live:
            found = getattr(importlib.import_module(module), attr)
            cmd = found if isinstance(found, click.Command) else found()
        else:
            try:
                cmd = getattr(importlib.import_module(module), attr)
            except ImportError as e:  # the `real` extra is not installed
                fail(f"`aprilsim {name}` needs the live-engine extra (pip install "
                     f"'aprilsim[real]'): {e}")
            cmd.invoke = _missing_extra_is_one_line(cmd.invoke, name)  # torch loads on --local
        self.add_command(cmd, name)
        return cmd

    def all_commands(self) -> dict[str, click.Command]:
        """Every command, the lazy ones loaded (tests, documentation)."""
        return {n: self.get_command(None, n) for n in self.list_commands(None)}


def _missing_extra_is_one_line(invoke, name: str):
    """A module of the live-engine extra missing at run time (torch for --local, aiohttp for
    URLs) is a one-line error, exit 2, not a traceback."""

    def wrapped(ctx):
        try:
            return invoke(ctx)
        except ModuleNotFoundError as e:
            fail(f"`aprilsim {name}` needs the live-engine extra (pip install "
                 f"'aprilsim[real]'): {e}")

    return wrapped


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="aprilsim",
                      message=f"%(prog)s, version %(version)s ({build_line()})")
def main() -> None:
    """Simulate, compare and tune rollout schedulers (APRIL and friends) for RL on LLMs."""


@main.command(short_help="Simulate schedulers on a scenario and compare them.")
@click.argument("scenario", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--scheduler", "-s", "schedulers", multiple=True,
              help="Scheduler to run (repeatable): a registered name, module:Class, or "
                   "NAME@knob=value,... (e.g. april@ratio=1.5). Default: the scenario's `compare` "
                   "list.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Set any dotted scenario key, e.g. --set cluster.engines=8 --set "
                   "schedulers.april.ratio=1.5 (repeatable; validated like the file).")
@click.option("--steps", type=click.IntRange(min=1),
              help="Training steps (overrides the scenario).")
@click.option("--seed", type=int, help="Workload seed (overrides the scenario).")
@click.option("--seeds", "n_seeds", type=click.IntRange(min=1, max=1000), default=1,
              show_default=True,
              help="Run every scheduler on this many seeds (the seed and the ones after it; "
                   "paired: the same groups on a seed) and print means with 95 % intervals and "
                   "paired ratios.")
@click.option("--warmup", type=click.IntRange(min=0),
              help="Steps left out of the summary (overrides the scenario's warmup_steps, default "
                   "1).")
@click.option("--json", "as_json", is_flag=True,
              help="Print a JSON array, one object per scheduler (and seed), each with a `run` "
                   "object: scenario hash, seed, steps, aprilsim version, command.")
@click.option("--steps-out", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write per-step records as JSON lines to this file (warm-up steps "
                   "included, marked).")
@click.option("--trace", "trace_out", type=click.Path(dir_okay=False, path_type=Path),
              help="Write each scheduler's per-request trace (JSON lines; NAME inserted before the "
                   "suffix when several schedulers run; with --seeds, the first seed's).")
@click.option("--timeline", type=click.Path(dir_okay=False, path_type=Path),
              help="Draw each scheduler's timeline: .png/.pdf/.svg, or .html (interactive; needs "
                   "the `interactive` extra); with --seeds, the first seed's.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Write one folder per run here: scenario.toml (resolved), summary.json, "
                   "table.txt, and per scheduler (and seed) summary.json, steps.jsonl, trace.jsonl "
                   "(folders named like april_ratio-1.5). The folder must be new or empty.")
@click.option("--out-timelines", is_flag=True,
              help="With --out: also draw each run's timeline.png (slow on long runs; `aprilsim "
                   "plot timeline DIR/RUN/trace.jsonl` draws one later).")
@click.option("--force", is_flag=True,
              help="Write into --out even if it holds files (those of the same name are replaced).")
def simulate(scenario, schedulers, sets, steps, seed, n_seeds, warmup, as_json, steps_out,
             trace_out, timeline, out_dir, out_timelines, force) -> None:
    """Simulate SCENARIO (a TOML file; default: the embedded APRIL-paper setup) and compare
    schedulers."""
    from aprilsim.simulate_cli import run_simulate

    run_simulate(scenario=scenario, schedulers=schedulers, sets=sets, steps=steps, seed=seed,
                 n_seeds=n_seeds, warmup=warmup, as_json=as_json, steps_out=steps_out,
                 trace_out=trace_out, timeline=timeline, out_dir=out_dir, command=command_line(),
                 force=force, out_timelines=out_timelines)


def with_overrides(sc, *, steps: int | None = None, warmup: int | None = None):
    """`aprilsim.config.with_overrides`, imported on call (the CLI starts without scipy)."""
    from aprilsim.config import with_overrides as apply

    return apply(sc, steps=steps, warmup=warmup)


def _print_example(ctx: click.Context, _param: click.Parameter, name: str | None) -> None:
    """`aprilsim scenario --example NAME`: print that embedded example and exit."""
    if name is None or ctx.resilient_parsing:
        return
    from aprilsim.config import ScenarioError, example_scenario_text

    try:
        click.echo(example_scenario_text(name), nl=False)
    except ScenarioError as e:
        fail(str(e))
    ctx.exit(0)


@main.command(short_help="Print the default scenario, or convert slime/verl launch configs.")
@click.option("--from-slime", "from_slime", metavar="FILE_OR_ARGS",
              help="A slime launch script, or its arguments as one string: print the scenario it "
                   "maps to.")
@click.option("--from-verl", "from_verl", metavar="CONFIG",
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A verl PPO/GRPO config (YAML, or a script of hydra overrides): print the "
                   "scenario it maps to.")
@click.option("--to-slime", "to_slime", metavar="SCENARIO.toml",
              type=click.Path(dir_okay=False, path_type=Path),
              help="Print the slime flags that launch this scenario.")
@click.option("--scheduler", "-s", "target",
              help="With --to-slime: the scheduler to launch (default: the last non-sync one in "
                   "`compare`).")
@click.option("--lengths", "lengths", metavar="MODEL.toml",
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="With --from-slime or --from-verl: the response-length model to use (one "
                   "`aprilsim fit` wrote) instead of the per-dataset estimate.")
@click.option("--example", metavar="NAME", callback=_print_example, expose_value=False,
              is_eager=True,
              help="Print an embedded example scenario and exit: `default` (the APRIL paper's "
                   "setup) or `agentic` (tool-using episodes, docs/agents.md), each saying where "
                   "its numbers come from.")
def scenario(from_slime, from_verl, to_slime, target, lengths) -> None:
    """Print the embedded default scenario (a starting point for your own), or convert one.

    Settings with no aprilsim counterpart are listed in one warning on stderr.
    """
    from aprilsim.config import ScenarioError, default_scenario_text

    chosen = [o for o in (from_slime, from_verl, to_slime) if o is not None]
    if len(chosen) > 1:
        fail("give at most one of --from-slime, --from-verl, --to-slime")
        return
    if not chosen:
        click.echo(default_scenario_text(), nl=False)
        return
    from aprilsim import interop

    try:
        if to_slime is not None:
            from aprilsim.config import load_scenario

            argv, notes = interop.to_slime(load_scenario(to_slime), target)
            click.echo(interop.format_flags(argv, notes), nl=False)
            return
        if lengths is not None and from_slime is None and from_verl is None:
            fail("--lengths goes with --from-slime or --from-verl")
            return
        if from_slime is not None:
            from aprilsim.interop.slime import read_source

            text = read_source(from_slime)
            res, what, origin = interop.from_slime(text, lengths=lengths), "slime flags", from_slime
        else:
            res, what, origin = (interop.from_verl(from_verl.read_text(), lengths=lengths),
                                 "verl keys", str(from_verl))
        from aprilsim.config import scenario_from_dict

        scenario_from_dict(res.data)  # validate before printing
    except (ScenarioError, ValueError, OSError) as e:
        fail(str(e))
        return
    warning = res.warning(what)
    if warning:
        click.echo(f"aprilsim: warning: {warning}", err=True)
    for line in res.warnings:
        click.echo(f"aprilsim: warning: {line}", err=True)
    for note in res.notes:
        click.echo(f"aprilsim: note: {note}", err=True)
    origin = origin if len(origin) < 80 else origin[:77] + "..."
    click.echo(interop.scenario_toml(res.data, header=f"imported from {origin} by aprilsim"),
               nl=False)


@main.command(short_help="List engine presets and where their numbers come from.")
def presets() -> None:
    """List the engine presets with their cost coefficients and where the numbers come from."""
    from aprilsim.engine.cost import PRESETS

    click.echo("decode step t(B, K) = a + b*B + c*K seconds (B running requests, K tokens in KV); "
               "prefill p0 + p1*sum(n) + p2*sum(n^2) seconds (n: prompt tokens)")
    for name, spec in PRESETS.items():
        c = spec.cost
        if hasattr(c, "a"):
            decode = f"a={c.a:.3g} s, b={c.b:.3g} s/request, c={c.c:.3g} s/token"
        else:
            decode = f"decode tables over B={list(c.table_b)}"
        click.echo(f"{name}: {decode}; p0={c.p0:.3g} s, p1={c.p1:.3g} s/token, "
                   f"p2={c.p2:.3g} s/token^2; kv_capacity={spec.kv_capacity:,} tokens, "
                   f"max_running={spec.max_running} requests, tp={spec.tp} GPUs per engine")
        click.echo(f"  {spec.source}")


@main.command("schedulers", short_help="List the schedulers with their knobs.")
@click.argument("names", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array instead of text.")
def schedulers_command(names, as_json) -> None:
    """List the schedulers (or NAMES, e.g. my_pkg.my_mod:MyScheduler): mode, description, knobs."""
    from aprilsim.knob_docs import knob_doc
    from aprilsim.policies.registry import REGISTRY, describe, resolve

    try:
        rows = [describe(n) for n in (names or sorted(REGISTRY))]
    except ValueError as e:
        fail(str(e))
        return
    for r in rows:
        cls = resolve(r["name"])
        for k in r["knobs"]:
            k["meaning"], k["allowed"] = knob_doc(cls, r["name"], k["name"])
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        click.echo(f"{r['name']} ({r['mode']}): {r['description']}")
        for k in r["knobs"]:
            click.echo(f"  {k['name']} = {json.dumps(k['default'])}  ({k['type']})")
            if names:  # one scheduler asked for: what each knob means and takes
                if k["meaning"]:
                    click.echo(f"      {k['meaning']}")
                click.echo(f"      allowed: {k['allowed']}")


def _plot_group() -> click.Group:
    """`aprilsim plot` with its sub-commands (`sweep` lives with the sweeps)."""
    from aprilsim.report.plot_cli import plot
    from aprilsim.sweep.cli import plot_sweep_command

    plot.add_command(plot_sweep_command, "sweep")
    return plot


def _calibrate_command() -> click.Command:
    from aprilsim.engine.calibration.cli import make_calibrate_command

    return make_calibrate_command(_measure_live)


def _measure_live(**kwargs):
    """`aprilsim calibrate --local/--engines`: the live sweep of `real.calibrate` (lazy: only this
    command reaches `real/`, torch and aiohttp)."""
    try:
        from real.calibrate import measure
    except ImportError as e:
        raise ValueError(f"live calibration needs the live-engine extra "
                         f"(pip install 'aprilsim[real]'): {e}") from None
    return measure(**kwargs)

