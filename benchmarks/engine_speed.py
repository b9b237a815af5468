"""Bundled torch engine speed: decode tokens/s at batch 1, 8, 32, HTTP overhead, TTFT/ITL.

    python benchmarks/engine_speed.py --json [--bench-serving]

Decode throughput times only decode steps of :class:`real.torch_engine.BatchEngine` (B requests
running together, prompt 16 tokens, ``--decode-tokens`` each). HTTP overhead is the median
latency of a 1-token request through ``real.serve``'s HTTP server and
:class:`real.clients.sglang.SGLangClient` (streaming), minus the same request on
:class:`real.torch_engine.local.LocalEngine` in-process. ``--bench-serving`` also starts
``python -m real.serve`` (with the bundled tokenizer) and runs SGLang's own benchmark client
(vendored in ``tests/real/third_party/sglang_bench``) against it: TTFT and ITL as SGLang reports
them (random dataset, ``--bench-prompts`` requests of 32 input / 64 output tokens, all at once).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import socket
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from aiohttp import web  # noqa: E402

from real.clients.sglang import SGLangClient  # noqa: E402
from real.protocol import GenerateRequest, SamplingParams  # noqa: E402
from real.torch_engine import (  # noqa: E402
    BatchEngine,
    EngineConfig,
    EngineRequest,
    ModelConfig,
    TinyDecoder,
)
from real.torch_engine.http_server import EngineHTTPServer, ServerConfig  # noqa: E402
from real.torch_engine.local import LocalEngine  # noqa: E402
from real.torch_engine.runner import EngineRunner  # noqa: E402


def decode_tok_s(model: TinyDecoder, batch: int, tokens: int, device: str) -> float:
    eng = BatchEngine(model, EngineConfig(max_running_requests=batch, device=device))
    for i in range(batch):
        eng.add(EngineRequest(f"b{i}", [16 + (i % 50)] * 16, tokens, ignore_eos=True))
    secs, toks = 0.0, 0
    while eng.has_work:
        out = eng.step()
        if out.kind == "decode":
            secs += out.seconds
            toks += len(out.new_tokens)
    return toks / secs


async def http_overhead(model: TinyDecoder, n: int) -> dict:
    req = GenerateRequest((20, 21, 22, 23), 1, SamplingParams(temperature=0.0))
    async with LocalEngine(BatchEngine(model, EngineConfig(max_running_requests=4))) as local:
        for _ in range(5):
            await local.generate(req)
        local_lat = []
        for _ in range(n):
            t = time.perf_counter()
            await local.generate(req)
            local_lat.append(time.perf_counter() - t)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = EngineHTTPServer(
        EngineRunner(BatchEngine(model, EngineConfig(max_running_requests=4))),
        ServerConfig(port=port))
    app = web.AppRunner(server.app, access_log=None)
    await app.setup()
    await web.TCPSite(app, "127.0.0.1", port).start()
    try:
        async with SGLangClient(f"http://127.0.0.1:{port}") as c:
            for _ in range(5):
                await c.generate(req)
            http_lat = []
            for _ in range(n):
                t = time.perf_counter()
                await c.generate(req)
                http_lat.append(time.perf_counter() - t)
    finally:
        await app.cleanup()
    lm, hm = statistics.median(local_lat), statistics.median(http_lat)
    return {"local_latency_ms": lm * 1e3, "http_latency_ms": hm * 1e3,
            "http_overhead_ms": (hm - lm) * 1e3, "requests": n}


def bench_serving(prompts: int, vocab: int) -> dict:
    """TTFT/ITL from SGLang's bench_serving client against a real.serve subprocess."""
    import os
    import subprocess
    import tempfile

    from real.torch_engine.tokenizer import corpus, ensure_tokenizer

    root = Path(__file__).resolve().parents[1]
    tmp = Path(tempfile.mkdtemp(prefix="engine-speed-"))
    tok = ensure_tokenizer(vocab, tmp)
    lines = corpus(400, seed=1)
    data = [{"conversations": [{"from": "human", "value": " ".join(lines[i:i + 8])},
                               {"from": "gpt", "value": lines[i + 8]}]} for i in range(0, 390, 9)]
    (tmp / "sharegpt.json").write_text(json.dumps(data))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "real.serve", "--port", str(port),
                               "--vocab-size", str(vocab), "--max-running-requests", "64",
                               "--tokenizer-path", str(tok)], cwd=root,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import urllib.request

        for _ in range(300):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        out = tmp / "bench.jsonl"
        subprocess.run(
            [sys.executable, "-c", "from sglang.benchmark.serving import cli_main; cli_main()",
             "--backend", "sglang", "--base-url", f"http://127.0.0.1:{port}",
             "--dataset-name", "random", "--dataset-path", str(tmp / "sharegpt.json"),
             "--random-input-len", "32", "--random-output-len", "64", "--random-range-ratio", "1",
             "--num-prompts", str(prompts), "--tokenizer", str(tok), "--model", "bench",
             "--output-file", str(out), "--seed", "1", "--disable-tqdm"],
            cwd=tmp, check=True, capture_output=True, timeout=600,
            env={**os.environ, "PYTHONPATH": str(root / "tests/real/third_party/sglang_bench"),
                 "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
        res = json.loads(out.read_text().splitlines()[-1])
    finally:
        server.terminate()
        server.wait(timeout=10)
    keys = ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_itl_ms", "median_itl_ms",
            "p99_itl_ms", "output_throughput", "completed")
    return {k: res[k] for k in keys}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--n-layers", type=int, default=2)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--vocab-size", type=int, default=512)
    p.add_argument("--decode-tokens", type=int, default=128)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--http-requests", type=int, default=50)
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (default 1, as real.serve; 0 = torch's default)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--bench-serving", action="store_true",
                   help="also run SGLang's bench_serving client against real.serve (TTFT/ITL)")
    p.add_argument("--bench-prompts", type=int, default=32)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = ModelConfig(vocab_size=args.vocab_size, d_model=args.d_model, n_layers=args.n_layers,
                      n_heads=args.n_heads, max_context=1024)
    model = TinyDecoder.random(cfg, seed=0)
    decode_tok_s(model, 1, 16, args.device)  # warm-up
    decode = {str(b): decode_tok_s(model, b, args.decode_tokens, args.device) for b in args.batches}
    http = asyncio.run(http_overhead(model, args.http_requests))
    result = {
        "model": {"d_model": cfg.d_model, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads,
                  "vocab_size": cfg.vocab_size, "params": cfg.num_params()},
        "device": args.device, "torch": torch.__version__, "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "decode_tokens_per_s": decode, **http,
    }
    if args.bench_serving:
        result["bench_serving"] = bench_serving(args.bench_prompts, args.vocab_size)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for b, v in decode.items():
            print(f"decode batch {b:>3}: {v:10.0f} tok/s")
        print(f"HTTP overhead per request: {http['http_overhead_ms']:.2f} ms "
              f"(local {http['local_latency_ms']:.2f} ms, HTTP {http['http_latency_ms']:.2f} ms)")
        if "bench_serving" in result:
            print("bench_serving:", json.dumps(result["bench_serving"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
