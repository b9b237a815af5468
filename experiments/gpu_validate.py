"""Validation at real scale on a GPU, in one command: engines, calibration, validation, report.

On a machine with a CUDA GPU it starts bundled engines (``python -m real.serve``) on the GPU with a
realistic model shape (a 1.1 B parameter decoder, d_model 2048, 12 layers, MLP 16384, vocabulary
32,000, built from its config with random bf16 weights: nothing is downloaded), calibrates one
(the others are replicas: ``aprilsim calibrate --engines ... --scenario``), and validates sync,
APRIL at ratios 2 and 1.5 and async_one_step at realistic scale (32 prompts x 8 samples: 128
requests in flight per engine under sync, more under APRIL; responses up to 4,096 tokens) in 2
interleaved rounds, judged twice on the same runs (with calibrate's sweep, and cross-fitted);
report, figures and every finished run go to ``--out``. A time budget (``--budget-s``, default
540 s: under 9 minutes with the engines' start) is kept: after calibrating, the simulation
predicts the validation's wall time from the fitted cost and the steps are cut to fit; at the
deadline the live runs stop, the finished rounds are kept and judged.

    python experiments/gpu_validate.py [--out DIR] [--engines 2] [--budget-s 540] [--wheels DIR]
    python experiments/gpu_validate.py --device cpu --tiny --out DIR   # CI: the same, in a minute

A bare GPU machine has PyTorch, transformers and numpy but not pydantic, simpy, msgspec, aiohttp,
scipy, click or matplotlib, and no network: bring them as wheels (on a machine with network, for
the GPU machine's Python version, e.g. 3.12:
``pip download --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 -d
wheels pydantic simpy msgspec aiohttp scipy click matplotlib``) and pass ``--wheels wheels``: the
missing ones are installed from there into ``OUT/site`` (``pip --no-index``) before anything else.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # a bare machine runs the tree as it is, nothing installed
NEEDED = {"pydantic": "pydantic", "simpy": "simpy", "msgspec": "msgspec", "aiohttp": "aiohttp",
          "scipy": "scipy", "click": "click", "matplotlib": "matplotlib"}
SPECS = ["sync", "april", "april@ratio=1.5", "async_one_step"]
GPU_MODEL_PARAMS_MIN, GPU_MODEL_PARAMS_MAX = 1.0e9, 3.0e9
JUDGE_RESERVE_S = 45.0  # kept at the end of the budget: two judgements, figures, timelines


# ------------------------------------------------------------------------------ dependencies
def missing_modules() -> list[str]:
    """The packages aprilsim needs that this Python cannot import."""
    return [pkg for mod, pkg in NEEDED.items() if importlib.util.find_spec(mod) is None]


def ensure_dependencies(wheels: Path | None, site: Path) -> None:
    """Install what is missing from ``wheels`` into ``site`` (no index) and restart with it on
    the path; exit with the recipe when there are no wheels."""
    missing = missing_modules()
    if not missing:
        return
    if wheels is None or not wheels.is_dir():
        sys.exit(f"gpu_validate: missing {', '.join(missing)}; bring them as wheels (see the "
                 "docstring: pip download ... -d wheels) and pass --wheels DIR")
    site.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--find-links",
                    str(wheels), "--target", str(site), "--quiet", *missing], check=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT),
                                                        os.environ.get("PYTHONPATH", "")])}
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


# ------------------------------------------------------------------------------ the setting
@dataclass(frozen=True)
class Shape:
    """The model, the engines and the workload of one mode."""

    vocab: int
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    dtype: str
    max_running: int
    batch_size: int
    group_size: int
    max_response: int
    max_prompt: int
    scale: float
    steps: int

    @property
    def max_context(self) -> int:
        return self.max_prompt + self.max_response + 8

    def params(self) -> float:
        d, f, v = self.d_model, self.d_ff, self.vocab
        return v * d + self.max_context * d + self.n_layers * (4 * d * d + 2 * d * f + 9 * d + f)

    def kv_bytes(self) -> int:
        """One engine's KV pool: a slot of max_context tokens per running request."""
        width = 2 if self.dtype in ("bfloat16", "float16") else 4
        return 2 * self.n_layers * self.max_running * self.max_context * self.d_model * width

    def weight_bytes(self) -> int:
        return int(self.params()) * (2 if self.dtype in ("bfloat16", "float16") else 4)


GPU = Shape(vocab=32000, d_model=2048, n_layers=12, n_heads=16, d_ff=16384, dtype="bfloat16",
            max_running=128, batch_size=32, group_size=8, max_response=4096, max_prompt=512,
            scale=1.0, steps=3)
TINY = Shape(vocab=512, d_model=64, n_layers=2, n_heads=4, d_ff=256, dtype="float32",
             max_running=32, batch_size=4, group_size=4, max_response=4096, max_prompt=512,
             scale=1 / 64, steps=2)


def scenario_toml(shape: Shape) -> str:
    """The workload: a two-component lognormal mixture of response lengths (median about 600
    tokens, a tail to the cap), prompts about 150 tokens, a short trainer stand-in."""
    return f"""name = "gpu-validate"
seed = 7
steps = {shape.steps}
warmup_steps = 1
batch_size = {shape.batch_size}
group_size = {shape.group_size}
max_response_len = {shape.max_response}
compare = ["sync", "april", "async_one_step"]
[cluster]
engines = 2
[trainer]
base_s = 2.0
per_token_s = 2e-6
sync_s = 1.0
[lengths]
family = "lognormal_mixture"
weights = [0.7, 0.3]
mus = [6.2, 7.6]
sigmas = [0.6, 0.6]
[prompts]
family = "lognormal"
mu = 5.0
sigma = 0.5
max_len = {shape.max_prompt}
[schedulers.april]
ratio = 2.0
"""


# ------------------------------------------------------------------------------ engines
def _env() -> dict[str, str]:
    """This environment with the tree (and the installed wheels, already there) on the path."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engines_that_fit(shape: Shape, want: int, device: str) -> tuple[int, str]:
    """How many engines fit the GPU's free memory (KV pool and weights, 10 % spare), and why."""
    if device != "cuda":
        return want, "CPU: no memory check"
    import torch

    free, total = torch.cuda.mem_get_info()
    each = shape.kv_bytes() + shape.weight_bytes()
    n = max(1, min(want, int(0.9 * free // each)))
    return n, (f"{torch.cuda.get_device_name(0)}: {free / 2**30:.0f} of {total / 2**30:.0f} GiB "
               f"free; each engine needs {each / 2**30:.1f} GiB (KV pool "
               f"{shape.kv_bytes() / 2**30:.1f} GiB): {n} engine(s)")


def start_engines(shape: Shape, n: int, device: str, out: Path,
                  deadline: float) -> list[tuple[subprocess.Popen, str]]:
    """``n`` bundled servers, healthy (their logs in ``out``); none left running on a failure."""
    procs: list[tuple[subprocess.Popen, str]] = []
    try:
        _launch(shape, n, device, out, procs)
        for p, url in procs:
            _wait_healthy(p, url, out, deadline)
    except BaseException:
        stop_engines(procs)
        raise
    return procs


def _launch(shape: Shape, n: int, device: str, out: Path,
            procs: list[tuple[subprocess.Popen, str]]) -> None:
    """Start ``n`` servers of ``shape``, appending each to ``procs`` as it starts."""
    env = _env()
    for i in range(n):
        port = free_port()
        cmd = [sys.executable, "-m", "real.serve", "--host", "127.0.0.1", "--port", str(port),
               "--device", device, "--dtype", shape.dtype, "--vocab-size", str(shape.vocab),
               "--d-model", str(shape.d_model), "--n-layers", str(shape.n_layers), "--n-heads",
               str(shape.n_heads), "--d-ff", str(shape.d_ff), "--max-context",
               str(shape.max_context), "--max-running-requests", str(shape.max_running),
               "--max-prefill-tokens", "16384", "--tokenizer-path", "none", "--torch-threads", "1",
               "--seed", str(i)]
        log = (out / f"engine-{i}.log").open("wb")
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        procs.append((proc, f"http://127.0.0.1:{port}"))


def _wait_healthy(p: subprocess.Popen, url: str, out: Path, deadline: float) -> None:
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise RuntimeError(f"engine {url} exited; see {out}/engine-*.log")
        with contextlib.suppress(OSError):
            if urllib.request.urlopen(f"{url}/health", timeout=2).status == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"engine {url} not healthy before the deadline; see {out}/engine-*.log")


def stop_engines(procs: list[tuple[subprocess.Popen, str]]) -> None:
    for p, _ in procs:
        p.terminate()
    for p, _ in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(15)
        if p.poll() is None:
            p.kill()


# ------------------------------------------------------------------------------ the steps
def calibrate(urls: list[str], scenario: Path, shape: Shape, out: Path, timeout: float) -> dict:
    """``aprilsim calibrate`` on the engines, the sweep the scenario's rollouts reach."""
    cal = out / "calibration"
    cal.mkdir(parents=True, exist_ok=True)
    res = subprocess.run([sys.executable, "-m", "aprilsim", "calibrate", "--engines",
                          ",".join(urls), "--scenario", str(scenario), "--scale",
                          str(shape.scale), "--out",
                          str(cal / "cal.toml"), "--plot", str(cal / "residuals.png"), "--json"],
                         cwd=ROOT, capture_output=True, text=True, env=_env(),
                         timeout=max(30.0, timeout))
    if res.returncode != 0:
        raise RuntimeError(f"calibrate failed: {res.stderr.strip()[-2000:]}")
    (cal / "cal.json").write_text(res.stdout)
    return json.loads(res.stdout)


def predicted_wall(sc, shape: Shape, n_engines: int, cal_path: Path, steps: int) -> float:
    """The simulation's prediction of one round of every scheduler (rollout + training), seconds."""
    from aprilsim.validate.costfit import load_calibration
    from aprilsim.validate.scaled import matched_engine, simulate_matched

    eng = matched_engine(load_calibration(str(cal_path)), max_running=shape.max_running,
                         kv_capacity=shape.max_running * shape.max_context, abort_steps=0,
                         retract_to="tail")
    total = 0.0
    for spec in SPECS:
        run = simulate_matched(sc, spec, eng, n_engines=n_engines, scale=shape.scale, seed=None,
                               steps=steps)
        total += sum(s.step_time_s for s in run.steps)
    return total


def plan_steps(sc, shape: Shape, n: int, cal_path: Path, left_s: float,
               rounds: int) -> tuple[int, str]:
    """The most steps (at least 2) whose predicted validation fits ``left_s`` (with 25 % spare)."""
    for steps in range(shape.steps, 1, -1):
        need = 1.25 * rounds * predicted_wall(sc, shape, n, cal_path, steps)
        if need <= left_s or steps == 2:
            fits = ("fits" if need <= left_s else
                    "does NOT fit (the deadline keeps the finished rounds)")
            return steps, (f"{steps} steps per run: {rounds} rounds predicted {need:.0f} s "
                           "with 25 % "
                           f"spare, {fits} in the {left_s:.0f} s left")
    return 2, ""


def validate_until(sc, urls: list[str], shape: Shape, steps: int, out: Path, deadline: float):
    """Run the validation (2 rounds, every finished run kept in ``out/validate``), stopped at the
    deadline (SIGINT to this process); the store of kept runs, the options, whether it finished."""
    from real.runner.options import EngineTarget
    from real.validate import Interrupted, ValidateOptions, validate
    from real.validate_store import RunStore, identity

    keep = out / "validate"
    opts = ValidateOptions(EngineTarget(engines=tuple(urls)), scale=shape.scale, steps=steps,
                           repeats=2, cross_fit=True, keep=keep)
    RunStore(keep).begin(identity(sc, SPECS, opts.live_rounds, opts),
                         resume=(keep / "runs" / "state.json").is_file())
    timer = threading.Timer(max(1.0, deadline - time.monotonic()),
                            lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        validate(sc, SPECS, opts, lambda n, d, t: print(f"  {n}: step {d}/{t}", flush=True))
        finished = True
    except Interrupted:
        finished = False
    finally:
        timer.cancel()
    return RunStore(keep).load(), opts, finished


def judge_both(sc, store, opts, cal_path: Path, out: Path) -> dict[str, dict]:
    """The kept runs of complete rounds, judged cross-fitted and with calibrate's sweep."""
    from dataclasses import replace

    from real.validate import judge, write_all

    by_round: dict[int, list] = {}
    for o in store.done().values():
        by_round.setdefault(o.round, []).append(o)
    full = sorted(r for r, got in by_round.items() if len(got) == len(SPECS))
    live = [replace(o, round=i) for i, r in enumerate(full)
            for o in sorted(by_round[r], key=lambda o: SPECS.index(o.label))]
    if not live:
        raise RuntimeError("no complete round finished before the deadline")
    setup = store.setup
    reps = {}
    for name, o in (("crossfit", replace(opts, repeats=len(full), cross_fit=len(full) >= 2)),
                    ("sweep", replace(opts, repeats=len(full), cross_fit=False,
                                      calibration=cal_path))):
        v = judge(sc, SPECS, o, live, dict(setup["limits"]), setup["what"], setup["checks"], 0.0)
        reps[name] = write_all(v, out / f"report_{name}")
    return reps


def summary(facts: dict, reps: dict[str, dict]) -> list[str]:
    """The run in a few lines (``OUT/summary.md``), every target with its verdict."""
    lines = ["# gpu_validate", "", *(f"- {k}: {v}" for k, v in facts.items()), ""]
    for name, rep in reps.items():
        t = rep["targets"]
        lines += [f"## {name}: {rep['verdict']} ({rep['meta']['rounds']} rounds judged; "
                  f"report_{name}/report.md)", ""]
        for k in ("step_rollout_error", "step_priced_error", "gain_vs_sync_pp", "gain_priced_pp",
                  "ranking"):
            lines.append(f"- {k}: {t[k].get('verdict')} ({t[k].get('reason')})")
        for lab, d in rep.get("decisions", {}).items():
            p = d["pooled"]
            share = "n/a" if p["share"] is None else f"{100 * p['share']:.0f}%"
            lines.append(f"- decisions of {lab}: agree in {share} of {p['compared']} steps")
        lines.append("")
    return lines


def machine_facts(device: str) -> dict:
    import platform

    import torch

    facts = {"host": f"{platform.machine()}, {os.cpu_count()} cores, Python "
                     f"{platform.python_version()}, torch {torch.__version__}",
             "load average at the start": f"{os.getloadavg()[0]:.1f}"}
    if device == "cuda":
        facts["gpu"] = torch.cuda.get_device_name(0)
    return facts


def run(args: argparse.Namespace) -> dict:
    """The whole of it; returns the facts and the reports."""
    from aprilsim.config import load_scenario, with_overrides

    t0 = time.monotonic()
    deadline = t0 + args.budget_s
    shape = TINY if args.tiny else GPU
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "scenario.toml").write_text(scenario_toml(shape))
    sc = load_scenario(out / "scenario.toml")
    facts = {**machine_facts(args.device), "model": (
        f"decoder, {shape.params() / 1e9:.2f} B parameters (d_model {shape.d_model}, "
        f"{shape.n_layers} layers, {shape.n_heads} heads, MLP {shape.d_ff}, vocabulary "
        f"{shape.vocab}), random {shape.dtype} weights")}
    n, why = engines_that_fit(shape, args.engines, args.device)
    facts["engines"] = why
    procs = start_engines(shape, n, args.device, out, deadline - 120)
    urls = [u for _, u in procs]
    facts["engine start"] = f"{time.monotonic() - t0:.0f} s"
    try:
        t1 = time.monotonic()
        cal = calibrate(urls[:1], out / "scenario.toml", shape, out,  # replicas: one is enough
                        deadline - time.monotonic() - JUDGE_RESERVE_S - 60)
        facts["calibrate"] = (f"{time.monotonic() - t1:.0f} s on the first engine (the others are "
                              f"replicas), {cal['n_decode']} decode and {cal['n_prefill']} "
                              "prefill records")
        steps, plan = plan_steps(sc, shape, n, out / "calibration" / "cal.toml",
                                 deadline - time.monotonic() - JUDGE_RESERVE_S, 2)
        facts["plan"] = plan
        t2 = time.monotonic()
        sc = with_overrides(sc, steps=steps)
        store, opts, finished = validate_until(sc, urls, shape, steps, out,
                                               deadline - JUDGE_RESERVE_S)
        facts["validate"] = f"{time.monotonic() - t2:.0f} s" + ("" if finished else
                                                                 " (stopped at the deadline)")
    finally:
        stop_engines(procs)
    reps = judge_both(sc, store, opts, out / "calibration" / "cal.toml", out)
    facts["wall in all"] = f"{time.monotonic() - t0:.0f} s (budget {args.budget_s:.0f} s)"
    (out / "summary.md").write_text("\n".join(summary(facts, reps)) + "\n")
    return {"facts": facts, "reports": reps, "shape": asdict(shape), "engines": n}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tiny", action="store_true", help="a tiny model and workload (CI, CPU)")
    ap.add_argument("--engines", type=int, default=2)
    ap.add_argument("--budget-s", type=float, default=540.0)
    ap.add_argument("--out", type=Path, default=Path("gpu_validate_out"))
    ap.add_argument("--wheels", type=Path, help="wheels of the packages a bare machine lacks")
    args = ap.parse_args(argv)
    ensure_dependencies(args.wheels, args.out / "site")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("gpu_validate: no CUDA device here (use --device cpu --tiny)", file=sys.stderr)
            return 2
    got = run(args)
    print((args.out / "summary.md").read_text())
    return 0 if got["reports"] else 1


if __name__ == "__main__":
    sys.exit(main())
