"""Read SGLang's scheduler log lines into timing records.

The lines (SGLang 0.5.23, ``srt/managers/scheduler_components/metrics_reporter.py``)::

    [2026-01-01 10:00:00 TP0] Decode batch, #running-req: 32, #token: 41000, token usage: 0.05,
        cuda graph: True, gen throughput (token/s): 2650.12, #queue-req: 0
    [2026-01-01 10:00:00 TP0] Prefill batch, #new-seq: 4, #new-token: 2048, #cached-token: 0,
        token usage: 0.04, #running-req: 28, #queue-req: 2, #pending-token: 0, cuda graph: False,
        input throughput (token/s): 51200.00

(each on one line; ``Decode batch [N],`` when forward iterations are logged; other fields may be
inserted, so each is read by name). SGLang logs a decode line every ``decode_log_interval``
iterations (default 40) with the *throughput* over that window, not an iteration time: the
per-iteration time is derived as ``#running-req / gen throughput`` (tokens per iteration over
tokens per second), which assumes the batch stayed about the size it has at the log line and
counts any prefill in the window into decode time. ``#token`` (KV in use) is taken as the KV load.

A prefill line's ``input throughput`` is its new tokens over the time since the *previous* prefill
line, so it times a prefill only when two prefill lines follow each other with no decode between;
such pairs give the earlier batch's time (an upper bound: scheduling overhead included). Prefill
lines carry no per-request sizes, so sums of squares assume equal sizes.
"""

from __future__ import annotations

import re
from pathlib import Path

from .records import Record

_FIELD = re.compile(r"(#?[A-Za-z][\w\- ()/.]*?):\s*([-+0-9.eE]+|True|False)")


def _fields(line: str) -> dict[str, str]:
    body = line.split("batch", 1)[1]
    return {k.strip(): v for k, v in _FIELD.findall(body)}


def parse_sglang_line(line: str) -> tuple[str, dict[str, str]] | None:
    """("decode" | "prefill", fields by name) for a scheduler stats line, else None."""
    if "Decode batch" in line and "gen throughput" in line:
        return "decode", _fields(line[line.index("Decode batch"):])
    if "Prefill batch" in line and "#new-token" in line:
        return "prefill", _fields(line[line.index("Prefill batch"):])
    return None


def records_from_sglang_lines(lines: list[str], where: str = "log") -> list[Record]:
    """Decode records (one per decode line), and prefill records from consecutive prefill lines."""
    out: list[Record] = []
    prev: tuple[str, dict[str, str]] | None = None
    for n, line in enumerate(lines, start=1):
        parsed = parse_sglang_line(line)
        if parsed is None:
            continue
        kind, f = parsed
        try:
            if kind == "decode":
                running = int(f["#running-req"])
                tput = float(f["gen throughput (token/s)"])
                kv = float(f.get("#token", f.get("#full token", "0")))
                if running >= 1 and tput > 0:
                    out.append(Record("decode", running, kv, 0, running / tput))
            elif prev is not None and prev[0] == "prefill":
                tput = float(f["input throughput (token/s)"])
                new = int(f["#new-token"])
                pf = prev[1]
                if tput > 0 and new > 0 and int(pf["#new-token"]) > 0:
                    out.append(Record("prefill", max(int(pf["#new-seq"]), 1), 0.0,
                                      int(pf["#new-token"]), new / tput))
        except KeyError as e:
            raise ValueError(f"{where}:{n}: {kind} batch line lacks {e.args[0]}") from None
        except ValueError:
            raise ValueError(f"{where}:{n}: {kind} batch line has a non-numeric field") from None
        prev = parsed
    return out


def read_sglang_log(path: str | Path) -> list[Record]:
    """Records from an SGLang server log (other lines are ignored)."""
    p = Path(path)
    try:
        lines = p.read_text(errors="replace").splitlines()
    except OSError as e:
        raise ValueError(f"cannot read {p}: {e.strerror}") from None
    recs = records_from_sglang_lines(lines, str(p))
    if not any(r.phase == "decode" for r in recs):
        raise ValueError(f"{p}: no 'Decode batch ... gen throughput' lines")
    return recs
