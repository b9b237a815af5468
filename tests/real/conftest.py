"""Fixtures for the real/ tests: bundled-engine servers and sglang-router on loopback.

Every process binds 127.0.0.1 on a free port and is torn down at the end (terminate, then kill).
Servers are small (2 layers, d_model 64) and pad each step to a few ms so that requests are still
running when a test aborts them, on any CPU.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("aiohttp")
# In-process engines (LocalEngine tests): one intra-op thread; OpenMP spin-waits on a busy CPU.
torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "tests") not in sys.path:  # the shared helpers of tests/ (cli_helpers, sched_helpers)
    sys.path.insert(0, str(ROOT / "tests"))
SCHEMA_PATH = Path(__file__).parent / "sglang_schema" / "api_types.py"

# What the bundled test servers run: tiny and slowed to >= STEP_S per step.
VOCAB = 512
STEP_S = 0.004
SERVER_ARGS = ["--vocab-size", str(VOCAB), "--d-model", "64", "--n-layers", "2", "--n-heads", "4",
               "--max-context", "2048", "--max-running-requests", "8",
               "--min-step-seconds", str(STEP_S), "--torch-threads", "1"]


def run(coro):
    """Run a coroutine to completion in a fresh event loop (no pytest-asyncio needed)."""
    return asyncio.run(coro)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


@dataclass
class Proc:
    """A child process serving HTTP at ``url``."""

    popen: subprocess.Popen
    url: str
    log: Path

    def wait_ready(self, path: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(f"{self.url} exited early:\n{self.log.read_text()[-3000:]}")
            if _http_ok(self.url + path):
                return
            time.sleep(0.1)
        raise TimeoutError(f"{self.url}{path} not ready in {timeout}s:\n"
                           f"{self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(timeout=10)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()


@functools.cache
def tokenizer_dir(vocab: int = VOCAB) -> Path:
    """The bundled tokenizer for the test servers, built once per session in a temp dir
    (removed when the session ends)."""
    from real.torch_engine.tokenizer import ensure_tokenizer

    where = Path(tempfile.mkdtemp(prefix="aprilsim-tok-"))
    atexit.register(shutil.rmtree, where, True)
    return ensure_tokenizer(vocab, where)


def served_logprobs(model, ids: list[int], ignore_eos: bool = True):
    """What the test servers report as output log-probs, at every position of ``ids`` [T, V]:
    ``log_softmax`` over the tokens they let the model sample (the bundled tokenizer's
    round-trip ids, plus EOS unless ``ignore_eos``)."""
    from real.torch_engine.tokenizer import TextCodec

    mask = torch.full((model.cfg.vocab_size,), -float("inf"))
    mask[list(TextCodec(tokenizer_dir()).roundtrip_ids)] = 0.0
    if not ignore_eos:
        mask[model.cfg.eos_token_id] = 0.0
    return torch.log_softmax(model.forward_full(torch.tensor(ids)) + mask, dim=-1)


def stop_all(procs: list[Proc]) -> None:
    """Terminate every process first, then wait: their shutdowns overlap."""
    for p in procs:
        if p.popen.poll() is None:
            p.popen.terminate()
    for p in procs:
        p.stop()


def start_server(tmp: Path, *extra: str, port: int | None = None) -> Proc:
    """A bundled server on ``port`` (default: a free one), ready (its /health answers)."""
    port = port or free_port()
    log = tmp / f"server-{port}.log"
    tok = [] if "--tokenizer-path" in extra else ["--tokenizer-path", str(tokenizer_dir())]
    popen = subprocess.Popen(
        [sys.executable, "-m", "real.serve", "--host", "127.0.0.1", "--port", str(port),
         *SERVER_ARGS, *tok, *extra],
        cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    proc = Proc(popen, f"http://127.0.0.1:{port}", log)
    try:
        proc.wait_ready("/health")
    except BaseException:
        proc.stop()
        raise
    return proc


def router_command() -> list[str] | None:
    """How to start sglang-router here, or None when it is not installed."""
    if importlib.util.find_spec("sglang_router") is not None:
        return [sys.executable, "-m", "sglang_router.launch_router"]
    exe = shutil.which("smg") or shutil.which("sglang-router")
    return [exe, "launch"] if exe else None


def start_router(tmp: Path, workers: list[str]) -> Proc:
    cmd = router_command()
    if cmd is None:
        pytest.skip("sglang-router is not installed (pip install sglang-router)")
    port, prom = free_port(), free_port()
    log = tmp / f"router-{port}.log"
    popen = subprocess.Popen(
        [*cmd, "--host", "127.0.0.1", "--port", str(port),
         # Its default Prometheus port (29000) clashes between instances: always pass one.
         "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prom),
         "--policy", "round_robin", "--log-level", "warn",
         "--worker-startup-timeout-secs", "30", "--health-check-interval-secs", "1",
         "--worker-urls", *workers],
        cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT,
    )
    proc = Proc(popen, f"http://127.0.0.1:{port}", log)
    try:
        proc.wait_ready("/health", timeout=60)
        # Ready means: every worker registered and healthy behind it.
        deadline = time.monotonic() + 30
        import json

        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                with urllib.request.urlopen(proc.url + "/workers", timeout=1) as r:
                    body = json.loads(r.read())
                healthy = [w for w in body.get("workers", []) if w.get("is_healthy")]
                if len(healthy) == len(workers):
                    return proc
            time.sleep(0.2)
        raise TimeoutError(f"router did not register its workers:\n{log.read_text()[-3000:]}")
    except BaseException:
        proc.stop()
        raise


@pytest.fixture(scope="session")
def tmp_logs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("real-logs")


@pytest.fixture(scope="session")
def shared_servers(tmp_logs) -> Iterator[list[Proc]]:
    """Two bundled-engine servers (cumulative streaming), shared by the session."""
    procs: list[Proc] = []
    try:
        for seed in (0, 0):
            procs.append(start_server(tmp_logs, "--seed", str(seed)))
        yield procs
    finally:
        stop_all(procs)


@pytest.fixture
def servers(shared_servers) -> list[Proc]:
    """The shared servers at their default weight version: a run or an update in an earlier test
    bumps it, and under pytest-xdist which files ran earlier differs from run to run."""
    from real.clients.sglang import SGLangClient

    async def reset() -> None:
        async with SGLangClient(worker_urls=[p.url for p in shared_servers]) as c:
            if await c.weight_version() != "default":
                await c.update_weights("default")

    asyncio.run(reset())
    return shared_servers


@pytest.fixture(scope="session")
def incremental_server(tmp_logs) -> Iterator[Proc]:
    """A bundled-engine server that streams incremental output ids."""
    p = start_server(tmp_logs, "--incremental-streaming-output")
    try:
        yield p
    finally:
        p.stop()


@pytest.fixture(scope="session")
def router(tmp_logs, shared_servers) -> Iterator[Proc]:
    """The real sglang-router in front of the two servers."""
    p = start_router(tmp_logs, [s.url for s in shared_servers])
    try:
        yield p
    finally:
        p.stop()


@pytest.fixture
def fresh_server(tmp_logs) -> Iterator[Proc]:
    """A server of its own, for tests that kill it."""
    p = start_server(tmp_logs)
    try:
        yield p
    finally:
        p.stop()


@pytest.fixture(scope="session")
def sglang_schema():
    """SGLang's own request/response schema (vendored api_types.py), loaded with msgspec only."""
    pytest.importorskip("msgspec")
    spec = importlib.util.spec_from_file_location("sglang_api_types_vendored", SCHEMA_PATH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod
