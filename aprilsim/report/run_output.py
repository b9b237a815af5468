"""What `aprilsim simulate` writes beside its table: run metadata, the paired multi-seed table and
the `--out DIR` folder (resolved scenario, summaries, steps, traces, figures)."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aprilsim._version import __version__


def scenario_dict(sc: Any) -> dict[str, Any]:
    """The resolved scenario as plain data (what the run used; base_dir left out)."""
    d = sc.model_dump(mode="json", exclude_none=True)
    d.pop("base_dir", None)
    return d


def scenario_hash(sc: Any) -> str:
    """A short content hash of the resolved scenario: equal hashes, equal inputs."""
    blob = json.dumps(scenario_dict(sc), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def run_meta(sc: Any, seed: int, command: str) -> dict[str, Any]:
    """What makes a row reproducible: scenario hash, seed, steps, aprilsim version, command."""
    return {"scenario": sc.name, "scenario_hash": scenario_hash(sc), "seed": seed,
            "steps": sc.steps, "warmup_steps": sc.warmup_steps,
            "aprilsim_version": __version__, "command": command}


def check_timeline_deps(path: Path | None) -> None:
    """ValueError (one line) when the timeline's plotting library is missing: checked before
    any simulation runs, so no run is lost to a missing extra."""
    if path is None:
        return
    html = path.suffix.lower() in (".html", ".htm")
    try:
        if html:
            import plotly  # noqa: F401
        else:
            import matplotlib  # noqa: F401
    except ImportError:
        extra, lib = ("interactive", "plotly") if html else ("plot", "matplotlib")
        raise ValueError(f"--timeline {path}: needs {lib} "
                         f"(pip install 'aprilsim[{extra}]')") from None


def _interval(values: Sequence[float]) -> tuple[float, float, float]:
    from aprilsim.sweep.stats import t_interval

    mean, _, lo, hi = t_interval(list(values))
    return mean, lo, hi


def _fmt(x: float, spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else spec.format(x)


def seeds_table(runs: dict[str, list[dict[str, Any]]], baseline: str | None = "sync") -> str:
    """A table over seeds: mean [95 % t interval] per scheduler, and the paired ratio to the
    baseline taken seed by seed (common random numbers: same groups on a seed)."""
    base = runs.get(baseline) if baseline else None
    heads = ["scheduler", "rollout tok/s [95% CI]", "samples/s [95% CI]", "step s", "off-policy",
             "len bias", "lat p50/p99 s"]
    if base is not None:
        heads += [f"tok/s vs {baseline} [95% CI]", f"samples/s vs {baseline} [95% CI]"]
    cells = []
    for name, rows in runs.items():
        tok = _interval([r["rollout_throughput_tok_s"] for r in rows])
        sps_ = _interval([r["samples_per_s"] for r in rows])
        line = [name, f"{tok[0]:,.0f} [{_fmt(tok[1], '{:,.0f}')}, {_fmt(tok[2], '{:,.0f}')}]",
                f"{sps_[0]:,.2f} [{_fmt(sps_[1], '{:,.2f}')}, {_fmt(sps_[2], '{:,.2f}')}]",
                f"{sum(r['mean_step_time_s'] for r in rows) / len(rows):.1f}",
                f"{sum(r['offpolicy_token_fraction'] for r in rows) / len(rows):.0%}",
                f"{sum(r['length_bias'] for r in rows) / len(rows):+.1%}",
                _latency_cell(rows)]
        if base is not None:
            for key in ("rollout_throughput_tok_s", "samples_per_s"):
                ratios = [r[key] / b[key] if b[key] else math.nan for r, b in zip(rows, base)]
                m, lo, hi = _interval(ratios)
                line.append(f"{_fmt(m, '{:.2f}x')} [{_fmt(lo, '{:.2f}')}, {_fmt(hi, '{:.2f}')}]")
        cells.append(line)
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]

    def row(xs: list[str]) -> str:
        return "  ".join(x.rjust(w) if i else x.ljust(w)
                         for i, (x, w) in enumerate(zip(xs, widths)))

    return "\n".join([row(heads), "  ".join("-" * w for w in widths), *map(row, cells)])


def _latency_cell(rows: list[dict[str, Any]]) -> str:
    """Mean p50/p99 response completion time over the seeds ('-' where not known)."""
    out = []
    for key in ("latency_p50_s", "latency_p99_s"):
        xs = [r[key] for r in rows if r.get(key) is not None]
        out.append(f"{sum(xs) / len(xs):.0f}" if xs else "-")
    return "/".join(out)


def safe_name(label: str) -> str:
    """A scheduler label as a file or folder name that every shell and file system takes
    unquoted: `april@ratio=1.5,recycle=false` -> `april_ratio-1.5_recycle-false`,
    `pkg.mod:Cls` -> `pkg.mod_Cls`."""
    return "".join(c if c.isalnum() or c in "._-" else "-" if c == "=" else "_" for c in label)


def prepare_out_dir(path: Path, force: bool = False) -> Path:
    """Create `--out DIR` (ValueError when it exists and is not empty, unless `force`, or cannot
    be made): `aprilsim.outputs.claim_dir`."""
    from aprilsim.outputs import claim_dir

    return claim_dir(path, "--out", force)


def run_folder(out: Path, label: str, seed: int, n_seeds: int) -> Path:
    """`DIR/<scheduler>` (or `DIR/<scheduler>/seed<k>` with several seeds), created."""
    p = out / safe_name(label)
    if n_seeds > 1:
        p = p / f"seed{seed}"
    p.mkdir(parents=True, exist_ok=True)
    return p


def write_scenario(out: Path, sc: Any) -> Path:
    """The resolved scenario the run used, as TOML: `aprilsim simulate DIR/scenario.toml` reruns
    it."""
    from aprilsim.interop.toml_out import dumps

    data = scenario_dict(sc)
    base = Path(sc.base_dir)
    lengths = data.get("lengths", {})
    if isinstance(lengths, dict) and isinstance(lengths.get("from"), str):
        data["lengths"] = {"from": str((base / lengths["from"]).resolve())}
    preset = data.get("cluster", {}).get("preset", "")
    if preset.endswith(".toml"):
        data["cluster"]["preset"] = str((base / preset).resolve())
    p = out / "scenario.toml"
    p.write_text(dumps(data, f"resolved scenario, hash {scenario_hash(sc)}, "
                                          f"aprilsim {__version__}"))
    return p


def strict_json(data: Any) -> str:
    """Strict JSON (indented): a non-finite number is `null`, never a bare `NaN` a JSON parser
    refuses; values JSON does not know are written as their text."""
    def finite(x: Any) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: finite(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [finite(v) for v in x]
        return x

    return json.dumps(finite(data), indent=2, allow_nan=False, default=str)


def write_json(path: Path, data: Any) -> Path:
    """`data` as strict JSON at `path` (`strict_json`)."""
    path.write_text(strict_json(data) + "\n")
    return path


def per_scheduler_paths(names: list[str], **paths: Path | None) -> dict[str, dict[str, Path]]:
    """{scheduler: {kind: path}}: with several schedulers, NAME goes before each path's suffix.
    Paths are checked before any simulation runs, so a bad one costs nothing."""
    out: dict[str, dict[str, Path]] = {}
    for kind, path in paths.items():
        if path is None:
            continue
        kind = "trace" if kind == "trace_out" else kind
        if kind == "timeline" and path.suffix.lower() not in (".png", ".pdf", ".svg", ".html",
                                                              ".htm"):
            raise ValueError(f"--timeline {path}: the file must end in .png, .pdf, .svg or .html")
        if not path.parent.exists() or not path.parent.is_dir():
            raise ValueError(f"--{kind} {path}: folder {path.parent} does not exist")
        for name in names:
            safe = safe_name(name)
            p = path if len(names) == 1 else path.with_name(f"{path.stem}_{safe}{path.suffix}")
            out.setdefault(name, {})[kind] = p
    return out
