"""Residual plot of a calibration: relative error per record against batch size (decode, coloured
by KV load) and against prefill tokens. Needs matplotlib (the `plot` extra)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .records import Record


def write_residual_plot(records: Sequence[Record], residuals: np.ndarray, path: str | Path,
                        title: str = "calibration residuals") -> None:
    """Write the two-panel residual figure to `path` (.png, .pdf or .svg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dec = np.array([r.phase == "decode" for r in records])
    res = 100 * np.asarray(residuals)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4), gridspec_kw={"width_ratios": [2, 1]})
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
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
