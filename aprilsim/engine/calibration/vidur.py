"""Turn kernel profiles in Vidur's CSV format into timing records.

Vidur (microsoft/vidur) profiles one transformer layer's operators on a GPU and stores, per model
and device, CSVs whose timing columns are ``time_stats.<operator>.median`` in milliseconds:

* ``mlp.csv``: every non-attention operator of one layer (``attn_pre_proj``, ``attn_post_proj``,
  ``mlp_up_proj``, ``mlp_act``, ``mlp_down_proj``, norms, ``add``, ...) against ``num_tokens``,
  per ``num_tensor_parallel_workers``;
* ``attention.csv``: the attention kernel against ``batch_size`` and ``kv_cache_size`` (tokens per
  request) with ``is_prefill``: decode rows time ``time_stats.attn_decode.median``, prefill rows
  ``time_stats.attn_prefill.median`` for ``prefill_chunk_size`` tokens per request;
* optionally ``all_reduce.csv``: ``time_stats.all_reduce.median`` against ``size`` (bytes) and
  ``num_workers``, two all-reduces per layer under tensor parallelism.

One step's time is ``layers x (mlp(tokens) + attention + 2 x all_reduce(tokens x n_embd x 2 B))``,
with mlp and all-reduce times interpolated linearly in their size. A decode row at ``batch_size``
B and ``kv_cache_size`` k gives a decode record with K = B*k; a prefill row with B requests of n
tokens gives a prefill record of B*n tokens, sum of squares B*n^2. Profiles contain no scheduler,
sampling or launch overhead, so the fitted fixed cost is a lower bound.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from .records import Record

TIME_PREFIX, TIME_SUFFIX = "time_stats.", ".median"


def _read(path: Path) -> list[dict[str, str]]:
    try:
        with path.open(newline="") as fh:
            return list(csv.DictReader(fh))
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror}") from None


def _time_cols(row: dict[str, str]) -> list[str]:
    return [k for k in row if k and k.startswith(TIME_PREFIX) and k.endswith(TIME_SUFFIX)]


def _f(row: dict[str, str], key: str, where: str) -> float:
    try:
        return float(row[key])
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{where}: column {key} missing or not a number") from None


def _curve(xs: list[float], ys: list[float]) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(xs)
    x, y = np.asarray(xs, float)[order], np.asarray(ys, float)[order]
    ux = np.unique(x)
    return ux, np.array([np.median(y[x == v]) for v in ux])


def _interp(curve: tuple[np.ndarray, np.ndarray], x: float) -> float:
    cx, cy = curve
    if len(cx) == 1 or x <= cx[-1]:
        return float(np.interp(x, cx, cy))
    slope = (cy[-1] - cy[-2]) / (cx[-1] - cx[-2])  # extrapolate linearly beyond the profile
    return float(cy[-1] + slope * (x - cx[-1]))


def _is_true(v: str) -> bool:
    return str(v).strip().lower() in ("true", "1", "yes")


def read_vidur(directory: str | Path, layers: int, tp: int | None = None) -> list[Record]:
    """Records for a model of `layers` layers from the profiles in `directory` (mlp.csv and
    attention.csv, optionally all_reduce.csv) at tensor parallelism `tp` (default: the smallest
    profiled)."""
    d = Path(directory)
    if not d.is_dir():
        raise ValueError(f"{d}: not a directory (want one holding mlp.csv and attention.csv)")
    if layers < 1:
        raise ValueError(f"layers must be >= 1, got {layers}")
    mlp_rows, attn_rows = _read(d / "mlp.csv"), _read(d / "attention.csv")
    if not mlp_rows or not attn_rows:
        raise ValueError(f"{d}: mlp.csv and attention.csv must have rows")
    tps = sorted({int(_f(r, "num_tensor_parallel_workers", f"{d}/mlp.csv")) for r in mlp_rows})
    tp = tps[0] if tp is None else tp
    if tp not in tps:
        raise ValueError(f"{d}/mlp.csv: no rows at tp {tp} (profiled: {', '.join(map(str, tps))})")
    mlp_rows = [r for r in mlp_rows if int(float(r["num_tensor_parallel_workers"])) == tp]
    cols = _time_cols(mlp_rows[0])
    if not cols:
        raise ValueError(f"{d}/mlp.csv: no time_stats.<op>.median columns")
    mlp = _curve([_f(r, "num_tokens", f"{d}/mlp.csv") for r in mlp_rows],
                 [sum(float(r[c] or 0) for c in cols) for r in mlp_rows])
    n_embd = _f(mlp_rows[0], "n_embd", f"{d}/mlp.csv")
    allreduce = _all_reduce(d, tp)

    def per_layer_overhead(tokens: float) -> float:
        t = _interp(mlp, tokens)
        if allreduce is not None:
            t += 2 * _interp(allreduce, tokens * n_embd * 2)
        return t

    out: list[Record] = []
    where = f"{d}/attention.csv"
    for r in attn_rows:
        if ("num_tensor_parallel_workers" in r
                and int(_f(r, "num_tensor_parallel_workers", where)) != tp):
            continue
        batch = int(_f(r, "batch_size", where))
        if _is_true(r.get("is_prefill", "")):
            n = int(_f(r, "prefill_chunk_size", where))
            attn = _f(r, "time_stats.attn_prefill.median", where)
            ms = layers * (per_layer_overhead(batch * n) + attn)
            out.append(Record("prefill", batch, 0.0, batch * n, ms / 1e3, float(batch * n * n)))
        else:
            k = _f(r, "kv_cache_size", where)
            attn = _f(r, "time_stats.attn_decode.median", where)
            ms = layers * (per_layer_overhead(batch) + attn)
            out.append(Record("decode", batch, batch * k, 0, ms / 1e3))
    if not any(r.phase == "decode" for r in out):
        raise ValueError(f"{where}: no decode rows at tp {tp}")
    return out


def _all_reduce(d: Path, tp: int) -> tuple[np.ndarray, np.ndarray] | None:
    path = d / "all_reduce.csv"
    if tp <= 1 or not path.exists():
        return None
    rows = [r for r in _read(path) if int(_f(r, "num_workers", str(path))) == tp]
    if not rows:
        raise ValueError(f"{path}: no rows with num_workers {tp}")
    return _curve([_f(r, "size", str(path)) for r in rows],
                  [_f(r, "time_stats.all_reduce.median", str(path)) for r in rows])
