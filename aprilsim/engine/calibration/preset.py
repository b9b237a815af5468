"""Write a fitted cost model as a preset file (TOML) that scenarios load by path.

A scenario uses it with ``[cluster] preset = "cal.toml"`` (relative to the scenario file). The
file holds a ``[cost]`` table in the scenario's own ``[cluster.cost]`` form (``a, b, c`` or
``table_b, table_f, table_g``, plus ``p0, p1, p2``) and optional engine limits (``max_running``,
``kv_capacity``, ``client_overhead_s``) measured on the engine, and a ``[speculative]`` table
fitted from accepted-token logs (``--speculative-log``); `aprilsim.config` validates it like any
scenario key.
"""

from __future__ import annotations

from pathlib import Path

from aprilsim.engine.cost import CostModel, TabulatedCost

from .errors import RegimeError


def _num(v: float) -> str:
    return repr(float(v))


def preset_toml(cost: CostModel | TabulatedCost, *, label: str = "calibrated", source: str = "",
                max_running: int | None = None, kv_capacity: int | None = None,
                client_overhead_s: float | None = None, errors: list[RegimeError] | None = None,
                measured: list[str] | None = None,
                assumed: list[str] | None = None, speculative: dict | None = None) -> str:
    """The preset file's text; ``measured`` and ``assumed`` become comment lines saying which
    of its values were measured on the engine and which were assumed."""
    lines = ["# aprilsim engine preset written by `aprilsim calibrate`.",
             "# Use it in a scenario: [cluster] preset = \"<this file>\"."]
    if errors:
        lines.append("# fit errors (predicted vs measured, relative):")
        for e in errors:
            lines.append(f"#   {e.regime}: n {e.n}, median {100 * e.median_abs:.1f}%, "
                         f"p90 {100 * e.p90_abs:.1f}%, bias {100 * e.bias:+.1f}%")
    for m in measured or ():
        lines.append(f"# measured: {m}")
    for a in assumed or ():
        lines.append(f"# assumed: {a}")
    lines.append(f"label = {_str(label)}")
    lines.append(f"source = {_str(source)}")
    if max_running is not None:
        lines.append(f"max_running = {int(max_running)}")
    if kv_capacity is not None:
        lines.append(f"kv_capacity = {int(kv_capacity)}")
    if client_overhead_s is not None:  # seconds per request outside the engine (the driver's)
        lines.append(f"client_overhead_s = {_num(client_overhead_s)}")
    lines.append("")
    lines.append("[cost]")
    if isinstance(cost, TabulatedCost):
        lines.append(f"table_b = [{', '.join(str(int(b)) for b in cost.table_b)}]")
        lines.append(f"table_f = [{', '.join(_num(v) for v in cost.table_f)}]")
        lines.append(f"table_g = [{', '.join(_num(v) for v in cost.table_g)}]")
    else:
        lines += [f"a = {_num(cost.a)}", f"b = {_num(cost.b)}", f"c = {_num(cost.c)}"]
    lines += [f"p0 = {_num(cost.p0)}", f"p1 = {_num(cost.p1)}", f"p2 = {_num(cost.p2)}"]
    if getattr(cost, "pr", 0.0):  # seconds per request of a prefill batch (both engines charge it)
        lines.append(f"pr = {_num(cost.pr)}")
    if speculative:  # fitted from accepted-token logs (`speculative_log`)
        lines += ["", "[speculative]"]
        for k, v in speculative.items():
            lines.append(
                f"{k} = "
                f"{_str(v) if isinstance(v, str) else int(v) if isinstance(v, int) else _num(v)}")
    lines.append("")
    return "\n".join(lines)


def _str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ") + '"'


def write_preset(path: str | Path, cost: CostModel | TabulatedCost, **kwargs) -> None:
    """Write `preset_toml(cost, **kwargs)` to `path`."""
    Path(path).write_text(preset_toml(cost, **kwargs))
