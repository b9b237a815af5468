"""`--plot fit.png`: histogram + fitted densities (log x), survival (log-log), QQ of the chosen
family.

matplotlib is imported here only (optional extra `aprilsim[fit]`), so fitting works without it.
With a drift, a fourth panel shows mean length by step with the linear and table fits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np

from aprilsim.workload.fitting.data import LengthData
from aprilsim.workload.fitting.drift_fit import DriftFitter
from aprilsim.workload.fitting.errors import LengthDataError
from aprilsim.workload.fitting.fitter import LengthFitter


class FitReport(Protocol):
    """What the figure reads of a fit report (`report.FitReport` has it; no import back)."""

    data: LengthData
    fitter: LengthFitter | None
    drift: DriftFitter | None

MAX_CURVES = 4


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - depends on the environment
        raise LengthDataError("--plot needs matplotlib: pip install 'aprilsim[fit]'") from None
    return plt


def _density_panel(ax, rep: FitReport) -> None:
    f = rep.fitter
    h = f.histogram_
    lo, hi = max(float(h.values[0]) - 1, 0.5), float(h.values[-1]) + 1
    edges = np.unique(np.round(np.geomspace(lo, hi, 60)))
    exact = h.values < f.max_len_ if f.max_len_ is not None else np.ones(len(h.values), bool)
    # capped responses are drawn as a note at the cap, not as a density bar
    counts, _ = np.histogram(h.values[exact], bins=edges, weights=h.counts[exact])
    dens = counts / (np.diff(edges) * h.n)
    ax.stairs(dens, edges, fill=True, alpha=0.35, color="0.5", label="data")
    x = np.geomspace(lo, hi, 400)
    shown = [r for r in f.results_ if r.family != "empirical"][:MAX_CURVES]
    for i, r in enumerate(shown):
        ax.plot(x, r.model.pdf(x), lw=2.2 if i == 0 else 1.2, label=r.family)
    if f.max_len_ is not None:
        ax.axvline(f.max_len_, color="k", ls=":", lw=1)
        ax.annotate(
            f"cap {f.max_len_}\n{f.cap_.n_censored:,} censored",
            (f.max_len_, ax.get_ylim()[1] * 0.5),
            fontsize=7,
            ha="right",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    floor = dens[dens > 0].min() if np.any(dens > 0) else 1e-9
    ax.set_ylim(floor / 3, None)
    ax.set_xlabel("response length (tokens)")
    ax.set_ylabel("density")
    ax.set_title("histogram and fitted densities")
    ax.legend(fontsize=7)


def _survival_panel(ax, rep: FitReport) -> None:
    f = rep.fitter
    h = f.histogram_
    sf_emp = 1.0 - np.cumsum(h.counts) / h.n
    keep = sf_emp > 0
    ax.step(h.values[keep], sf_emp[keep], where="post", color="0.3", lw=1.5, label="data")
    x = np.geomspace(max(float(h.values[0]), 1.0), float(h.values[-1]), 300)
    shown = [r for r in f.results_ if r.family != "empirical"][:MAX_CURVES]
    for i, r in enumerate(shown):
        # P(L > k) = P(X > k) for integer lengths L = ceil(X)
        ax.plot(x, r.model.sf(x), lw=2.2 if i == 0 else 1.0, label=r.family)
    if f.max_len_ is not None:
        ax.axvline(f.max_len_, color="k", ls=":", lw=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(max(0.3 / h.n, 1e-7), 1.5)
    ax.set_xlabel("response length (tokens)")
    ax.set_ylabel("P(length > x)")
    ax.set_title("survival function")
    ax.legend(fontsize=7)


def _qq_panel(ax, rep: FitReport) -> None:
    f = rep.fitter
    best = f.results_[0]
    top = 1.0 - f.cap_.share if f.max_len_ is not None else 1.0
    m = min(f.histogram_.n, 500)
    q = (np.arange(m) + 0.5) / m * top
    emp = f.histogram_.quantile(q).astype(float)
    mod = np.maximum(np.ceil(np.asarray(best.model.ppf(q), float)), 1.0)
    ax.plot(mod, emp, ".", ms=3)
    lim = [min(emp.min(), mod.min()), max(emp.max(), mod.max())]
    ax.plot(lim, lim, "k--", lw=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"{best.family} quantile")
    ax.set_ylabel("data quantile")
    ax.set_title(f"QQ plot: {best.family}")


def _drift_panel(ax, rep: FitReport) -> None:
    dr = rep.drift
    ax.plot(dr.steps_, dr.means_, "o", ms=3, color="0.3", label="mean length by step")
    s = np.linspace(0, max(dr.extrapolate_to_, dr.steps_[-1]), 200)
    ax.plot(s, dr.m0_ * (1 + dr.linear_.slope * s), label=f"linear (R^2 {dr.r2_:.2f})")
    ax.plot(s, [np.interp(v, dr.steps_, dr.means_) for v in s], lw=1, label="table (held beyond)")
    ax.axvline(dr.extrapolate_to_, color="k", ls=":", lw=1)
    ax.annotate("trusted to", (dr.extrapolate_to_, ax.get_ylim()[0]), fontsize=7, ha="right")
    ax.set_xlabel("training step")
    ax.set_ylabel("mean response length")
    ax.set_title(f"drift ({dr.kind_} chosen)")
    ax.legend(fontsize=7)


def plot_target(path: str | Path) -> Path:
    """The file a figure saved to `path` really lands in: matplotlib appends `.png` to a name
    without a suffix. An unsupported suffix is a one-line error (before any fitting)."""
    plt = _pyplot()
    path = Path(path)
    fmt = path.suffix[1:].lower()
    if not fmt:
        return path.with_name(path.name + ".png")
    fig = plt.figure()
    try:
        known = fig.canvas.get_supported_filetypes()
    finally:
        plt.close(fig)
    if fmt not in known:
        raise LengthDataError(
            f"--plot {path}: unknown figure format {fmt!r}; use one of {', '.join(sorted(known))}"
        )
    return path


def plot_report(rep: FitReport, path: str | Path, title: str | None = None) -> Path:
    """Write the fit figure to `path` (format from the suffix, e.g. .png or .pdf; none: .png)
    and return the path written."""
    path = plot_target(path)
    plt = _pyplot()
    panels = []
    if rep.fitter is not None:
        panels += [_density_panel, _survival_panel, _qq_panel]
    if rep.drift is not None:
        panels.append(_drift_panel)
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.2), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        panel(ax, rep)
    fig.suptitle(title or Path(rep.data.source).name, fontsize=10)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except (OSError, ValueError) as e:
        raise LengthDataError(f"cannot write plot {path}: {e}") from None
    finally:
        plt.close(fig)
    return path
