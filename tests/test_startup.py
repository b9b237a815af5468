"""Start-up (issue 23 item 5, issue 22): the command line loads no heavy module it does not need.

`aprilsim --help`, importing `aprilsim.cli`, every sub-command's `--help` and `simulate` up to
the simulator's first call load none of scipy, pandas, matplotlib, torch, aiohttp (nor pydantic,
except `simulate`, whose scenario needs it); `fit` reads its file (and fails on a bad one) before
scipy loads. Checked on `sys.modules` in a fresh interpreter, not by timing
(`benchmarks/startup.py` prints the CPU seconds).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("scipy", "pandas", "matplotlib", "torch", "aiohttp", "plotly", "pyarrow", "ray")

PROBE = """
import json, os, sys
def report(*a, **k):
    print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})), flush=True)
    os._exit(0)
target = sys.argv[1]
if target != '-':
    import importlib
    mod, attr = target.rsplit(':', 1)
    setattr(importlib.import_module(mod), attr, report)
from aprilsim.cli import main
try:
    main(sys.argv[2:])
except SystemExit:
    pass
report()
"""


def loaded(*argv: str, stop_at: str = "-") -> set[str]:
    """Top-level packages loaded by `aprilsim ARGV` (stopped at `module:function` if given)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    res = subprocess.run(
        [sys.executable, "-c", PROBE, stop_at, *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    last = res.stdout.strip().splitlines()[-1]
    return set(json.loads(last))


def test_importing_the_cli_loads_no_heavy_module():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    code = ("import sys, json, aprilsim.cli; "
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, check=True
    )
    mods = set(json.loads(out.stdout))
    assert "aprilsim" in mods and "click" in mods  # the probe sees what was imported
    # nor numpy: the options of fit and calibrate load their packages lazily (PEP 562)
    assert not mods & {*HEAVY, "pydantic", "real", "numpy"}, (
        mods & {*HEAVY, "pydantic", "real", "numpy"})


@pytest.mark.parametrize(
    "argv",
    [("--help",), ("simulate", "--help"), ("fit", "--help"), ("sweep", "--help"),
     ("calibrate", "--help"), ("plot", "--help"), ("tune", "--help"),
     ("replay-validate", "--help")],
    ids=lambda a: " ".join(a),
)
def test_help_loads_no_heavy_module(argv):
    mods = loaded(*argv)
    assert "click" in mods
    light = {*HEAVY, "pydantic", "real", "numpy"}  # numpy: ~0.1 s of the 0.5 s
    assert not mods & light, mods & light


@pytest.mark.parametrize("command", ["run", "validate"])
def test_live_help_loads_the_runner_but_no_heavy_module(command):
    """`run --help` and `validate --help` import real/ for their options, but not the scenario
    model (pydantic) nor the simulator's comparison code: `validate --help` took 0.53 s CPU."""
    mods = loaded(command, "--help")
    assert "real" in mods  # the live runner's own options
    assert not mods & {*HEAVY, "pydantic"}, mods & {*HEAVY, "pydantic"}


def test_simulate_reaches_the_simulator_without_scipy():
    mods = loaded("simulate", stop_at="aprilsim.sim.run:simulate")
    assert "pydantic" in mods  # the scenario was loaded: the probe stopped at the right place
    assert not mods & set(HEAVY), mods & set(HEAVY)


def test_fit_reads_before_scipy_and_a_bad_file_never_loads_it(tmp_path):
    f = tmp_path / "x.csv"
    f.write_text("response_length\n1\n2\n3\n")
    mods = loaded("fit", str(f), stop_at="aprilsim.workload.fitting.api:read_lengths")
    assert "aprilsim" in mods and not mods & set(HEAVY), mods & set(HEAVY)
    bad = tmp_path / "bad.csv"
    bad.write_text("response_length\nfoo\nbar\n")
    mods = loaded("fit", str(bad))
    assert not mods & set(HEAVY), mods & set(HEAVY)


def test_the_listed_help_of_lazy_commands_is_their_own():
    """`aprilsim --help` lists run/validate from a copy of their short help (so that listing
    does not import real/): the copy must match the commands."""
    from aprilsim.cli import main

    group = type(main)  # the lazy group's class (no private name imported)
    assert set(group.lazy) == set(group.lazy_help)
    for name in group.lazy:
        cmd = main.get_command(None, name)
        assert main.commands[name] is cmd  # loaded once, then part of the group
        assert cmd.get_short_help_str(200) == group.lazy_help[name], name


def test_the_cli_loads_no_other_command_module():
    """`aprilsim simulate` pays for its own command only: importing the CLI loads none of the
    modules of fit, sweep/tune, plot, calibrate or replay-validate (they load when invoked)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    code = "import sys, json, aprilsim.cli; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, check=True
    )
    mods = set(json.loads(out.stdout))
    assert "aprilsim.cli" in mods  # simulate's own module loads when simulate runs, too
    others = {"aprilsim.simulate_cli", "aprilsim.sweep.cli", "aprilsim.workload.fitting.cli",
              "aprilsim.report.plot_cli", "aprilsim.engine.calibration.cli", "aprilsim.replay_cli"}
    assert not mods & others, mods & others
