"""Validate the simulator against the bundled engine on CPU and write docs/validation.md.

Two settings. In process (``--local N``, default 1; CI's setting): `aprilsim validate`'s pipeline
(real/validate.py) on in-process bundled engines with the default scenario scaled to
max_response_len 64 (two in-process engines share one interpreter lock, which makes APRIL's
live figures vary from run to run); rewrites the part of docs/validation.md between the
`<!-- results -->` markers and docs/img/validation_*.png. In separate processes (``--serve N``:
the validation setting): N ``python -m real.serve`` servers on loopback, the scenario
experiments/scenarios/validate_live.toml, ``--repeats`` interleaved rounds after a calibration
round of their own (held out), the noise floor beside every error; rewrites the part between
`<!-- serve-results -->` markers.

    python experiments/validate_bundled.py [--steps 5] [--seed 0] [--local 1]
    python experiments/validate_bundled.py --serve 2 [--repeats 3] [--steps 4] [--pin]
        [--cross-fit] [--min-step-ms 0] [--response-len 64] [--save RUN.pkl | --load RUN.pkl]

``--pin``: server i on core i (taskset). ``--min-step-ms``: every server step padded to at least
that long (the servers sleep the rest: a device slower than the CPU's compute, and a client that
keeps its CPU on a machine with fewer cores than processes). ``--save`` pickles the live runs
(RUN.json beside them keeps the load average and wall time); ``--load`` judges them again with
this tree, without servers (experiments/validate_causes.py reads the same file).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from aprilsim.config import load_scenario, with_overrides
from real.runner.options import EngineTarget, local_scale
from real.validate import ValidateOptions, judge, load_live, validate, write_all

ROOT = Path(__file__).resolve().parents[1]
SPECS = ["sync", "april", "april@ratio=1.5", "async_one_step"]
BEGIN, END = "<!-- results -->", "<!-- /results -->"
SBEGIN, SEND = "<!-- serve-results -->", "<!-- /serve-results -->"
SERVE_SCENARIO = ROOT / "experiments" / "scenarios" / "validate_live.toml"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_servers(n: int, work: Path, pin: bool = False,
                  min_step_s: float = 0.0) -> list[tuple[subprocess.Popen, str]]:
    """N bundled servers (2 layers, d_model 64, one torch thread each), healthy; ``pin``: server
    i on core i mod cores (``taskset``); ``min_step_s``: every step padded to at least that long
    (the server's ``--min-step-seconds``: a device slower than the CPU's compute, which sleeps)."""
    out = []
    cores = sorted(os.sched_getaffinity(0))
    for i in range(n):
        port = _port()
        log = (work / f"serve-{port}.log").open("wb")
        taskset = ["taskset", "-c", str(cores[i % len(cores)])] if pin else []
        p = subprocess.Popen([*taskset, sys.executable, "-m", "real.serve", "--host", "127.0.0.1",
                              "--port", str(port), "--d-model", "64", "--n-layers", "2",
                              "--max-context", "1024",
                              "--max-running-requests", "64", "--tokenizer-path", "none",
                              "--torch-threads", "1", "--seed", "0",
                              "--min-step-seconds", str(min_step_s)],
                             cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
        out.append((p, f"http://127.0.0.1:{port}"))
    for p, url in out:
        for _ in range(600):
            with contextlib.suppress(OSError):
                if urllib.request.urlopen(f"{url}/health", timeout=1).status == 200:
                    break
            if p.poll() is not None:
                raise RuntimeError(f"server {url} exited")
            time.sleep(0.2)
    return out


def replace_section(doc: Path, begin: str, end: str, body: str) -> None:
    old = doc.read_text() if doc.exists() else "# Validation\n"
    if begin not in old or end not in old:
        old = old.rstrip() + f"\n\n{begin}\n{end}\n"
    pre, rest = old.split(begin, 1)
    doc.write_text(pre + begin + "\n" + body.rstrip() + "\n" + end + rest.split(end, 1)[1])


def serve_main(args) -> None:
    from validate_vllm import decisions_table, targets_table, verdicts_table

    work = Path("/tmp/aprilsim_serve")
    work.mkdir(parents=True, exist_ok=True)
    sc = with_overrides(load_scenario(SERVE_SCENARIO), steps=args.steps, warmup=None)
    if args.router:
        from aprilsim.engine.router import make_router

        make_router(args.router)  # an unknown name fails here, with the known ones
        sc = sc.model_copy(update={"cluster": sc.cluster.model_copy(
            update={"router": args.router})})
    scale = (args.response_len / sc.max_response_len if args.response_len
             else local_scale(sc.max_response_len))
    t0 = time.monotonic()
    load0 = os.getloadavg()
    if args.load:  # saved live runs, judged again (no servers); their load and wall beside them
        live, limits, what, checks, t_live = load_live(args.load)
        side = json.loads(args.load.with_suffix(".json").read_text())
        load0, t0 = side["load"][0], time.monotonic() - side["wall_s"]
        opts = ValidateOptions(EngineTarget(engines=("saved",)), seed=args.seed, steps=args.steps,
                               repeats=args.repeats, scale=scale, cross_fit=args.cross_fit)
        v = judge(sc, SPECS, opts, live, limits, what, checks, t_live)
        rep = write_all(v, work / "report", figures=False)
    else:
        procs = start_servers(args.serve, work, args.pin, args.min_step_ms / 1e3)
        try:
            urls = [u for _, u in procs]
            opts = ValidateOptions(EngineTarget(engines=tuple(urls)), seed=args.seed,
                                   steps=args.steps, repeats=args.repeats, scale=scale,
                                   cross_fit=args.cross_fit)
            v = validate(sc, SPECS, opts, lambda n, d, t: print(f"{n}: step {d}/{t}", flush=True),
                         save=args.save)
            rep = write_all(v, work / "report", figures=False)
        finally:
            for p, _ in procs:
                p.terminate()
            for p, _ in procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(10)
    load1 = side["load"][1] if args.load else os.getloadavg()
    if args.save:
        args.save.with_suffix(".json").write_text(json.dumps(
            {"load": [load0, load1], "wall_s": time.monotonic() - t0, "pin": args.pin,
             "min_step_ms": args.min_step_ms}))
    live = rep["meta"]["live"]
    rv = live.get("reconstruction_vs_log", {})
    cal = rep["calibration"]
    fit_of = ("the other rounds, shown for the first" if args.cross_fit
              else "the calibration round")
    md = ["## Bundled engines in separate processes (measured by "
          f"`python experiments/validate_bundled.py --serve {args.serve}`)", "",
          f"{platform.machine()}, {os.cpu_count()} cores; "
          f"load average {load0[0]:.1f} before, {load1[0]:.1f} after (1 min); "
          f"{args.serve} `python -m real.serve` servers (d_model 64, 2 layers, one torch thread "
          f"each{', each pinned to one core' if args.pin else ''}"
          f"{f', every step padded to >= {args.min_step_ms:g} ms' if args.min_step_ms else ''}"
          ") on loopback, router "
          f"{sc.cluster.router}; scenario `experiments/scenarios/validate_live.toml` at scale "
          f"{scale:g} "
          f"(max_response_len {int(round(sc.max_response_len * scale))}), {args.steps} steps "
          "(1 warm-up), "
          f"seed {args.seed}; "
          + (f"{args.repeats} interleaved rounds, each judged with the cost fitted on the other "
             f"rounds' iteration logs (`--cross-fit`). " if args.cross_fit else
             f"a calibration round of every scheduler first (its iteration logs give the cost, "
             f"held out), then {args.repeats} interleaved rounds judged. ")
          + f"{time.monotonic() - t0:.0f} s wall in all.", "",
          f"Cost (wall fit of {fit_of}): decode a {1e3 * cal['wall']['a']:.3f} ms + b "
          f"{1e6 * cal['wall']['b']:.1f} us x B + c {cal['wall']['c']:.3g} s x K; prefill p0 "
          f"{1e3 * cal['wall']['p0']:.3f} ms + p1 {1e6 * cal['wall']['p1']:.2f} us x n + pr "
          f"{1e3 * cal['wall']['pr']:.3f} ms x requests; compute fit error decode "
          f"{100 * cal['decode_median_err']:.1f}%, prefill {100 * cal['prefill_median_err']:.1f}% "
          f"({100 * cal['prefill_without_pr_err']:.1f}% without the per-request term).", "",
          "### Targets (median per-step rollout-time error <= 10 %, gain within 3 pp, ranking)", ""]
    md += targets_table(rep)
    md += ["", "### Verdicts", ""] + verdicts_table(rep)
    md += ["", "### Decision agreement", ""] + decisions_table(rep)
    if rv:
        md += ["", f"Iterations rebuilt from the token streams against the servers' own "
               f"`/iteration_log` (median over runs and engines): "
               f"{100 * rv.get('matched_share', 0):.0f}% "
               f"of logged steps matched, batch size exact in "
               f"{100 * rv.get('batch_exact_share', 0):.0f}%, "
               f"step interval error {100 * rv.get('interval_median_rel_err', 0):.1f}% median, "
               f"summed "
               f"intervals {100 * rv.get('total_rel_err', 0):+.1f}%."]
    if rep["explanations"]:
        md += ["", "### Gaps (round 1)", ""] + [f"- {x}" for x in rep["explanations"]]
    (work / "serve_section.md").write_text("\n".join(md) + "\n")
    replace_section(args.out / "validation.md", SBEGIN, SEND, "\n".join(md))
    print("\n".join(md))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--local", type=int, default=1, help="in-process bundled engines (default 1)")
    ap.add_argument("--serve", type=int, help="N bundled servers in their own processes instead")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "docs")
    ap.add_argument("--pin", action="store_true", help="--serve: pin server i to core i (taskset)")
    ap.add_argument("--save", type=Path, help="--serve: pickle the live runs to this file")
    ap.add_argument("--min-step-ms", type=float, default=0.0,
                    help="--serve: pad every server step to at least this long (a slower device: "
                         "the servers sleep the rest, which leaves the client its CPU)")
    ap.add_argument("--response-len", type=int,
                    help="--serve: max_response_len after scaling (default 64)")
    ap.add_argument("--load", type=Path,
                    help="--serve: judge live runs saved by --save (no servers)")
    ap.add_argument("--router", help="the scenario's [cluster] router on both sides (e.g. "
                                     "group_hash: placement the order of sends cannot change)")
    ap.add_argument("--cross-fit", action="store_true",
                    help="--serve: judge each round with the cost fitted on the other rounds (no "
                         "extra calibration round; with --load, runs saved with one judge it too)")
    args = ap.parse_args()
    if args.serve:
        args.steps = args.steps or 4
        sys.path.insert(0, str(Path(__file__).parent))
        serve_main(args)
        return
    args.steps = args.steps or 5
    sc = with_overrides(load_scenario(None), steps=args.steps, warmup=None)
    opts = ValidateOptions(EngineTarget(local=args.local), seed=args.seed, steps=args.steps,
                           scale=local_scale(sc.max_response_len))
    t0 = time.monotonic()
    v = validate(sc, SPECS, opts, lambda name, d, t: print(f"{name}: step {d}/{t}", flush=True))
    tmp = Path("/tmp/aprilsim_validation")
    rep = write_all(v, tmp)
    wall = time.monotonic() - t0
    img = args.out / "img"
    img.mkdir(parents=True, exist_ok=True)
    text = (tmp / "report.md").read_text()
    for f in sorted(tmp.glob("*.png")):
        dst = f"validation_{f.name}"
        shutil.copy(f, img / dst)
        text = text.replace(f"]({f.name})", f"](img/{dst})")
    body = text.split("\n", 1)[1]  # drop the report's own title
    machine = f"{platform.machine()}; {wall:.0f}s wall in all"
    results = (f"## Results\n\nMeasured by `python experiments/validate_bundled.py` "
               f"({machine}).\n" + body.replace("\n## ", "\n### "))
    replace_section(args.out / "validation.md", BEGIN, END, results)
    print(f"wrote {args.out / 'validation.md'}; targets: "
          + ", ".join(f"{k} {'n/a' if x['met'] is None else ('met' if x['met'] else 'missed')}"
                      for k, x in rep["targets"].items()))


if __name__ == "__main__":
    main()
