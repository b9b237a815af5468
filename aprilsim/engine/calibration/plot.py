"""Residual plot of a calibration: relative error per record against batch size (decode, coloured
by KV load) and against prefill tokens. Needs matplotlib (the `plot` extra)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .records import Record


def write_residual_plot(records: Sequence[Record], residuals: np.ndarray, path: str | Path,
                        title: str = "calibration residuals",
                        predicted: np.ndarray | None = None) -> None:
    """Write the residual figure to `path` (.png, .pdf or .svg): relative error (predicted -
    measured) / measured per record, the definition of the error table, against batch size and
    prefill size; with ``predicted``, a third panel of predicted vs measured seconds on log-log
    axes with the line y = x."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dec = np.array([r.phase == "decode" for r in records])
    res = 100 * np.asarray(residuals)
    ncol = 3 if predicted is not None else 2
    fig, axes = plt.subplots(1, ncol, figsize=(5 * ncol - 1, 4),
                             gridspec_kw={"width_ratios": [2, 1, 1.4][:ncol]})
    ax1, ax2 = axes[0], axes[1]
    if dec.any():
        b = np.array([r.batch_size for r in records])[dec]
        k = np.array([r.kv_tokens for r in records])[dec]
        sc = ax1.scatter(b, res[dec], c=k, s=10, cmap="viridis", alpha=0.7)
        fig.colorbar(sc, ax=ax1, label="KV tokens at start")
        ax1.set_xscale("log", base=2)
    ax1.axhline(0, color="k", lw=0.8)
    ax1.set_xlabel("batch size B")
    ax1.set_ylabel("relative error (%)")
    ax1.set_title("decode iterations")
    if (~dec).any():
        n = np.array([r.prefill_tokens for r in records])[~dec]
        ax2.scatter(n, res[~dec], s=12, color="tab:orange")
    ax2.axhline(0, color="k", lw=0.8)
    ax2.set_xlabel("prefill tokens")
    ax2.set_title("prefill batches")
    if predicted is not None:
        ax3 = axes[2]
        meas = np.array([r.duration_s for r in records])
        pred = np.asarray(predicted, float)
        ax3.scatter(meas[dec], pred[dec], s=8, alpha=0.6, label="decode")
        if (~dec).any():
            ax3.scatter(meas[~dec], pred[~dec], s=12, color="tab:orange", label="prefill")
        pos = np.concatenate([meas, pred[pred > 0]])
        lo, hi = float(pos.min()), float(pos.max())
        ax3.plot([lo, hi], [lo, hi], "k-", lw=0.8, label="y = x")
        ax3.set_xscale("log")
        ax3.set_yscale("log")
        ax3.set_xlabel("measured (s)")
        ax3.set_ylabel("predicted (s)")
        ax3.set_title("predicted vs measured")
        ax3.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
