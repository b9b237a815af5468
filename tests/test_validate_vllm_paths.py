"""`experiments/validate_vllm.py` keeps to the folder it runs in (issue 36, item 26): it put the
vLLM venv at a fixed absolute path, rewrote the checkout's docs/validation.md by default and
worked in a shared temporary folder, so a newcomer's run edited the repo."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "experiments" / "validate_vllm.py"


def test_defaults_are_under_the_current_folder_and_docs_only_when_asked():
    sys.path.insert(0, str(ROOT / "experiments"))
    try:
        import validate_vllm
    finally:
        sys.path.remove(str(ROOT / "experiments"))
    args = validate_vllm.parser().parse_args([])
    if "APRILSIM_VLLM_VENV" not in os.environ:
        assert args.venv == Path("venv-vllm")
    assert not args.work.is_absolute() and args.doc is None
    assert validate_vllm.parser().parse_args(["--doc", "d.md"]).doc == Path("d.md")


def test_a_newcomers_run_edits_nothing_in_the_checkout(tmp_path):
    doc = ROOT / "docs" / "validation.md"
    before = hashlib.sha256(doc.read_bytes()).hexdigest()
    env = {k: v for k, v in os.environ.items() if k != "APRILSIM_VLLM_VENV"}
    env["PYTHONPATH"] = str(ROOT)
    r = subprocess.run([sys.executable, str(SCRIPT)], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.returncode != 0 and "no vLLM venv at venv-vllm" in r.stderr, r.stderr
    assert (tmp_path / "aprilsim_vllm").is_dir()  # its work folder is here, not in /tmp
    assert hashlib.sha256(doc.read_bytes()).hexdigest() == before
