"""`aprilsim calibrate`: fit the engine cost model to measured timings and write a preset file.

The command is built by `make_calibrate_command(live)`: `live` measures running engines (it is
`real.calibrate.measure`, imported lazily by `aprilsim.cli`, since `aprilsim/` itself never imports
`real/`). Bad input prints one line and exits with code 2.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from aprilsim.cli_errors import OneLineCommand, fail

if TYPE_CHECKING:  # loaded where used: every `aprilsim` command loads these options
    from .estimator import CostCalibrator
    from .records import Record

LiveMeasure = Callable[..., "tuple[list[Record], dict[str, Any]]"]
SOURCES = ("csv", "sglang_log", "iteration_log", "vidur", "local", "engines")


def _ints(text: str | None, flag: str) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{flag} must be comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise ValueError(f"{flag} must list integers >= 1, got {text!r}")
    return vals


def _read(kind: str, value: Any, opts: dict[str, Any], live: LiveMeasure | None,
          ) -> tuple[list[Record], dict[str, Any]]:
    from . import read_csv, read_iteration_log, read_sglang_log, read_vidur

    if kind == "csv":
        return read_csv(value), {"source": f"CSV {value}"}
    if kind == "sglang_log":
        from .client import prefix_cache_line, sglang_cached_share

        recs = read_sglang_log(value)
        share = sglang_cached_share(Path(value).read_text(errors="replace").splitlines())
        which, line = prefix_cache_line(share)
        return recs, {
            "source": f"SGLang scheduler log {value} (decode time = #running-req / gen throughput)",
            which: [line], "prefix_hit_share": share}
    if kind == "iteration_log":
        return read_iteration_log(value), {"source": f"bundled engine iteration log {value}"}
    if kind == "vidur":
        return read_vidur(value, opts["layers"], opts["tp"]), {
            "source": f"Vidur-format profiles {value} ({opts['layers']} layers)"}
    if live is None:
        raise ValueError("live calibration is not available here")
    engines = [u.strip() for u in value.split(",") if u.strip()] if kind == "engines" else None
    if kind == "engines" and not engines:
        raise ValueError("--engines needs at least one URL")
    if kind == "local" and value < 1:
        raise ValueError(f"--local must be >= 1, got {value}")
    return live(local=value if kind == "local" else None, engines=engines,
                batch_sizes=opts["batch_sizes"], kv_loads=opts["kv_loads"],
                progress=opts["progress"], max_batch=opts.get("max_batch"),
                vocab_size=opts.get("vocab_size"), scenario=opts.get("scenario"),
                scale=opts.get("scale"))


GOOD_FIT = 0.05  # a decode median error above this is a poor fit


def form_advice(records: list[Record], cal: CostCalibrator, form: str,
                max_knots: int) -> dict | None:
    """The other form's fit on the same records when the chosen one fits decode badly and the
    other clearly better: {form, median_abs (both), advice}; None otherwise."""
    from .estimator import CostCalibrator

    other = "tables" if form == "linear" else "linear"
    try:
        alt = CostCalibrator(form=other, max_knots=max_knots).fit(records)
    except ValueError:
        return None

    def dec(c: CostCalibrator) -> float | None:
        rows = [e for e in c.errors_ if e.regime.startswith("decode")]
        if not rows:
            return None
        n = sum(e.n for e in rows)
        return sum(e.median_abs * e.n for e in rows) / n  # n-weighted over the regimes

    mine, theirs = dec(cal), dec(alt)
    if mine is None or theirs is None or mine <= GOOD_FIT or theirs > 0.7 * mine:
        return None
    return {"form": other, "median_abs": theirs, "this_median_abs": mine,
            "advice": (f"the {form} form fits decode with {100 * mine:.1f}% median error, "
                       f"--form {other} with {100 * theirs:.1f}% on the same records: use "
                       f"--form {other}")}


def _check_output_paths(out: Path | None, plot: Path | None, records_out: Path | None,
                        force: bool = False) -> None:
    """Every output's folder exists, none is a file already (unless ``force``: the rule of
    `aprilsim.outputs`), and the plot's format is one matplotlib writes."""
    from aprilsim.outputs import claim_files

    for flag, path in (("--out", out), ("--plot", plot), ("--records-out", records_out)):
        if path is not None:
            claim_files([path], flag, force)
    if plot is not None and plot.suffix.lower() not in (".png", ".pdf", ".svg"):
        raise ValueError(f"--plot {plot}: the file must end in .png, .pdf or .svg")


def _live_progress(as_json: bool) -> Callable[[str], None] | None:
    """A live sweep's progress: one rewritten line on a terminal, the finished parts in a log."""
    if sys.stderr.isatty():
        def rewrite(msg: str) -> None:
            click.echo(f"\r\033[K{msg}", err=True, nl=False)

        return rewrite
    if as_json:
        return None

    def finished(msg: str) -> None:
        if msg.endswith("done"):
            click.echo(msg, err=True)

    return finished


def _with_options(options: list[Callable[[Any], Any]]) -> Callable[[Any], Any]:
    """Apply click options as stacked decorators would (the first listed shows first)."""
    def apply(f: Any) -> Any:
        for option in reversed(options):
            f = option(f)
        return f

    return apply


_CALIBRATE_OPTIONS = [  # `calibrate`'s options, in --help order
    click.option("--csv", "csv_path", type=click.Path(dir_okay=False, path_type=Path),
                 help="CSV: phase, batch_size, kv_tokens, prefill_tokens, duration_s [, "
                      "prefill_tokens_sq | prefill_sizes]."),
    click.option("--sglang-log", type=click.Path(dir_okay=False, path_type=Path),
                 help="An SGLang server log ('Decode batch ...' / 'Prefill batch ...' lines)."),
    click.option("--iteration-log", type=click.Path(dir_okay=False, path_type=Path),
                 help="The bundled engine's --iteration-log file (or a saved GET /iteration_log)."),
    click.option("--vidur", type=click.Path(file_okay=False, path_type=Path),
                 help="A folder of Vidur-format profiles: mlp.csv, attention.csv [, "
                      "all_reduce.csv]."),
    click.option("--local", type=int,
                 help="Measure N in-process bundled engines (CPU; small default sweep)."),
    click.option("--engines", help="Measure running engines: comma-separated base URLs."),
    click.option("--form", type=click.Choice(["linear", "tables"]), default="linear",
                 show_default=True,
                 help="a + b*B + c*K, or f(B) + g(B)*K with piecewise-linear tables over B."),
    click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
                 help="Write the preset file (TOML) here; a scenario loads it with [cluster] "
                      "preset = \"FILE\"."),
    click.option("--plot", type=click.Path(dir_okay=False, path_type=Path),
                 help="Write the residual plot (.png/.pdf/.svg)."),
    click.option("--json", "as_json", is_flag=True, help="Print the fit as JSON."),
    click.option("--records-out", type=click.Path(dir_okay=False, path_type=Path),
                 help="Also write the timing records as CSV (the --csv format)."),
    click.option("--layers", type=int, default=32, show_default=True,
                 help="With --vidur: the model's layer count."),
    click.option("--tp", type=int,
                 help="With --vidur: tensor-parallel degree (default: the smallest profiled)."),
    click.option("--max-knots", type=click.IntRange(min=2), default=12, show_default=True,
                 help="With --form tables: most knots over B."),
    click.option("--batch-sizes",
                 help="Live: decode batch sizes to measure (comma-separated; default 1,2,4,8 "
                      "capped at max_running)."),
    click.option("--kv-loads",
                 help="Live: prompt lengths per request for the decode sweep (default 16,128,512, "
                      "or what --scenario reaches)."),
    click.option("--max-batch", type=click.IntRange(min=1),
                 help="Live: largest decode batch of the sweep (default 64, 16 with --local, or "
                      "what --scenario's rollouts reach), capped by the engine's concurrency "
                      "(reported, else probed)."),
    click.option("--scenario", "scenario", type=click.Path(dir_okay=False, path_type=Path),
                 help="Live: sweep the batch sizes and KV loads this scenario's rollouts reach on "
                      "the measured engines."),
    click.option("--scale", type=click.FloatRange(min=0, max=1, min_open=True),
                 help="Live, with --scenario: the length scale of the runs (as validate --scale)."),
    click.option("--vocab-size", type=click.IntRange(min=17),
                 help="Live: the engines' vocabulary (default: what the server states, else "
                      "probed)."),
    click.option("--speculative-log", type=click.Path(dir_okay=False, path_type=Path),
                 help="Fit speculative decoding's acceptance p from an SGLang log ('accept len' "
                      "decode lines) or a saved vLLM /metrics page (spec_decode counters); "
                      "written as the preset's [speculative]. An --sglang-log with 'accept len' "
                      "lines is read for it too."),
    click.option("--draft-tokens", type=click.IntRange(min=1),
                 help="With the speculative fit: the draft length k (default: read from the log)."),
    click.option("--force", is_flag=True,
                 help="Replace existing --out, --plot or --records-out files (else refused before "
                      "any work)."),
]


def make_calibrate_command(live: LiveMeasure | None) -> click.Command:
    """The `calibrate` command; `live` measures engines for --local / --engines."""

    @click.command("calibrate", cls=OneLineCommand,
                   short_help="Fit the engine cost model to measured timings; write a preset file.")
    @_with_options(_CALIBRATE_OPTIONS)
    def calibrate(csv_path, sglang_log, iteration_log, vidur, local, engines, form, out, plot,
                  as_json, records_out, layers, tp, max_knots, batch_sizes, kv_loads, max_batch,
                  scenario, scale, vocab_size, speculative_log, draft_tokens, force) -> None:
        """Fit t(B, K) = f(B) + g(B)*K and prefill p0 + p1*sum(n) + p2*sum(n^2) to timings from
        ONE source (a CSV, logs, Vidur profiles, or live engines), print the per-regime error
        table, and write a preset file scenarios load by path."""
        given = {k: v for k, v in zip(SOURCES, (csv_path, sglang_log, iteration_log, vidur,
                                                  local, engines)) if v is not None}
        if len(given) != 1:
            fail("give exactly one of --csv, --sglang-log, --iteration-log, --vidur, --local, "
                 "--engines")
            return
        (kind, value), = given.items()
        try:
            _check_output_paths(out, plot, records_out, force)
            progress = _live_progress(as_json) if kind in ("local", "engines") else None
            opts = {"layers": layers, "tp": tp, "progress": progress,
                    "batch_sizes": _ints(batch_sizes, "--batch-sizes"),
                    "kv_loads": _ints(kv_loads, "--kv-loads"), "max_batch": max_batch,
                    "vocab_size": vocab_size}
            if scenario is not None and kind not in ("local", "engines"):
                raise ValueError("--scenario shapes a live sweep: give it "
                                 "with --local or --engines")
            opts.update(scenario=scenario, scale=scale)
            records, info = _read(kind, value, opts, live)
            if progress is not None and sys.stderr.isatty():
                click.echo("\r\033[K", err=True, nl=False)
            from .estimator import CostCalibrator

            cal = CostCalibrator(form=form, max_knots=max_knots).fit(records)
            from .client import client_overhead_lines, prefix_cache_line

            info["client_overhead_s"] = client_overhead_lines(cal.cost_, info)
            _speculative(info, speculative_log, sglang_log, draft_tokens)
            if "prefix_hit_share" not in info:  # the source says nothing of a prefix cache
                info.setdefault("assumed", []).append(prefix_cache_line(None)[1])
        except ValueError as e:
            fail(str(e))
            return
        info["advice"] = form_advice(records, cal, form, max_knots)
        _write_outputs(cal, info, out, plot, records_out, form)
        _print(cal, info, form, as_json, out)

    return calibrate


def _speculative(info: dict[str, Any], spec_log: Path | None, sglang_log: Path | None,
                 k: int | None) -> None:
    """The speculative fit into `info` (from --speculative-log, else an --sglang-log that
    reports accepted tokens); ValueError when --speculative-log holds none."""
    from .speculative_log import fit_from_sglang_lines, fit_speculative_file

    if spec_log is not None:
        fit = fit_speculative_file(spec_log, k)
    elif sglang_log is not None:
        lines = Path(sglang_log).read_text(errors="replace").splitlines()
        fit = fit_from_sglang_lines(lines, k, f"SGLang log {sglang_log}")
    elif k is not None:
        raise ValueError("--draft-tokens goes with --speculative-log (or an --sglang-log)")
    else:
        return
    if fit is None:
        return
    info["speculative"] = fit.to_dict()
    info["speculative_preset"] = fit.preset()  # the preset file's [speculative] table
    info.setdefault("measured", []).append(
        f"speculative decoding: accept length {fit.accept_len:.3f} tokens per verify step at "
        f"k = {fit.k} over {fit.steps:,.0f} request-steps ({fit.source}): p = {fit.p:.4f}; "
        f"{fit.range_note()}")


def _write_outputs(cal: CostCalibrator, info: dict[str, Any], out: Path | None,
                   plot: Path | None, records_out: Path | None, form: str) -> None:
    from .preset import write_preset
    from .records import write_csv

    if out is not None:
        write_preset(out, cal.cost_, label=info.get("label", "calibrated"),
                     source=f"calibrated ({form}) from {info['source']}",
                     max_running=info.get("max_running"), kv_capacity=info.get("kv_capacity"),
                     client_overhead_s=info.get("client_overhead_s"), errors=cal.errors_,
                     measured=info.get("measured"),
                     assumed=info.get("assumed"),
                     speculative=info.get("speculative_preset"))
        click.echo(f"wrote {out}", err=True)
    if records_out is not None:
        write_csv(cal.records_, records_out)
        click.echo(f"wrote {records_out}", err=True)
    if plot is not None:
        try:
            from .plot import write_residual_plot
        except ImportError:  # pragma: no cover - matplotlib is in the plot/test extras
            fail("--plot needs matplotlib (pip install 'aprilsim[plot]')")
            return
        write_residual_plot(cal.records_, cal.residuals_, plot,
                            title=f"{form} fit: {info['source']}"[:90],
                            predicted=cal.predict(cal.records_))
        click.echo(f"wrote {plot}", err=True)


def cost_dict(cost: Any) -> dict[str, Any]:
    """The cost model's coefficients as a plain dict (the preset's [cost] keys)."""
    if hasattr(cost, "table_b"):
        d: dict[str, Any] = {"table_b": list(cost.table_b), "table_f": list(cost.table_f),
                             "table_g": list(cost.table_g)}
    else:
        d = {"a": cost.a, "b": cost.b, "c": cost.c}
    d.update(p0=cost.p0, p1=cost.p1, p2=cost.p2, pr=getattr(cost, "pr", 0.0))
    return d


def _print(cal: CostCalibrator, info: dict[str, Any], form: str, as_json: bool,
           out: Path | None) -> None:
    from .errors import format_error_table

    if as_json:
        click.echo(json.dumps({
            "form": form, "source": info["source"], "n_decode": cal.n_decode_,
            "n_prefill": cal.n_prefill_, "cost": cost_dict(cal.cost_),
            "errors": [e.to_dict() for e in cal.errors_],
            **{k: info[k] for k in ("max_running", "kv_capacity", "wall_s", "vocab_size", "family",
                                    "measured", "assumed", "advice", "client_overhead_s",
                                    "prefix_hit_share", "speculative") if k in info},
            "preset_file": str(out) if out else None}, indent=2))
        return
    click.echo(f"source: {info['source']}")
    click.echo(f"records: {cal.n_decode_} decode, {cal.n_prefill_} prefill")
    d = cost_dict(cal.cost_)
    if form == "linear":
        click.echo(f"decode: t(B, K) = {d['a']:.4g} + {d['b']:.4g}*B + {d['c']:.4g}*K  (seconds)")
    else:
        click.echo("decode: t(B, K) = f(B) + g(B)*K, tables over B")
        for b, f, g in zip(d["table_b"], d["table_f"], d["table_g"]):
            click.echo(f"  B {b:>5}: f {f:.4g} s, g {g:.4g} s/token")
    click.echo(f"prefill: {d['p0']:.4g} + {d['p1']:.4g}*sum(n) + {d['p2']:.4g}*sum(n^2)"
               + (f" + {d['pr']:.4g}*requests" if d["pr"] else "")
               + ("" if cal.n_prefill_ else "  (no prefill records: zeros)"))
    click.echo(format_error_table(cal.errors_))
    for m in info.get("measured") or ():
        click.echo(f"measured: {m}")
    for a in info.get("assumed") or ():
        click.echo(f"assumed: {a}")
    if info.get("advice"):
        click.echo(f"note: {info['advice']['advice']}")
    if out is None:
        click.echo("(no --out: nothing written; add --out cal.toml to get a preset file)")
