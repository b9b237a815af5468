"""``python -m real.serve --port P ...``: run the bundled engine behind SGLang's native HTTP API.

Example (what the tests start, two of them behind sglang-router)::

    python -m real.serve --port 31001 --n-layers 2 --d-model 64 --max-running-requests 16
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from aiohttp import web

from .torch_engine import EngineConfig, ModelConfig, build_engine
from .torch_engine.http_server import EngineHTTPServer, ServerConfig
from .torch_engine.runner import EngineRunner
from .torch_engine.tokenizer import MIN_VOCAB, ensure_tokenizer


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m real.serve", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    m = p.add_argument_group("model")
    m.add_argument("--checkpoint", default=None, help="directory written by TinyDecoder.save")
    m.add_argument("--seed", type=int, default=0, help="random-init seed (without --checkpoint)")
    m.add_argument("--vocab-size", type=int, default=512)
    m.add_argument("--d-model", type=int, default=128)
    m.add_argument("--n-layers", type=int, default=2)
    m.add_argument("--n-heads", type=int, default=4)
    m.add_argument("--d-ff", type=int, default=None, help="MLP width (default: 4 x d_model)")
    m.add_argument("--max-context", type=int, default=2048)
    m.add_argument("--eos-token-id", type=int, default=2)
    e = p.add_argument_group("engine")
    e.add_argument("--max-running-requests", type=int, default=32)
    e.add_argument("--kv-budget-tokens", type=int, default=None,
                   help="KV token budget (default: max running requests x max context)")
    e.add_argument("--max-prefill-tokens", type=int, default=8192)
    e.add_argument("--enable-priority-scheduling", action="store_true",
                   help="admit waiting requests by their /generate `priority`, higher first "
                        "(SGLang's flag)")
    e.add_argument("--device", default="cpu")
    e.add_argument("--dtype", default="float32")
    e.add_argument("--min-step-seconds", type=float, default=0.0,
                   help="pad every step to at least this long (emulate a slower device)")
    e.add_argument("--torch-threads", type=int, default=1,
                   help="torch intra-op threads (default 1: a tiny model gains nothing from more, "
                        "and OpenMP spin-waits badly on a shared CPU); 0 leaves torch's default")
    e.add_argument("--weight-version", default="default")
    e.add_argument("--init-new-token-ratio", type=float, default=EngineConfig.init_new_token_ratio,
                   help="SGLang's SGLANG_INIT_NEW_TOKEN_RATIO (admission reserve)")
    e.add_argument("--clip-max-new-tokens", type=int, default=EngineConfig.clip_max_new_tokens,
                   help="SGLang's SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION")
    e.add_argument("--iteration-log", default=None,
                   help="append one JSON line per engine step (phase, batch, KV, duration) here")
    s = p.add_argument_group("server")
    s.add_argument("--incremental-streaming-output", action="store_true",
                   help="stream per-chunk deltas instead of cumulative output_ids (as SGLang)")
    s.add_argument("--model-path", default="aprilsim/tiny-random")
    s.add_argument("--tokenizer-path", default="auto",
                   help="directory with tokenizer.json; 'auto' builds the bundled byte-level BPE "
                        "for --vocab-size (cached under $APRILSIM_TOKENIZER_CACHE or "
                        "~/.cache/aprilsim); 'none' serves token ids only")
    s.add_argument("--enable-memory-saver", action="store_true",
                   help="allow /release_memory_occupation (SGLang's flag; reported in "
                        "/server_info)")
    s.add_argument("--read-timeout", type=float, default=60.0,
                   help="seconds a connection may hold no request (an unfinished request head, "
                        "a half-open socket) or take to send its body; then it is closed (408 "
                        "for a slow body); 0: never")
    s.add_argument("--log-level", default="warning")
    return p.parse_args(argv)


def resolve_tokenizer(arg: str, vocab_size: int) -> str | None:
    """The tokenizer directory to serve with (``auto``: the bundled BPE for this vocab size)."""
    if arg == "none":
        return None
    if arg != "auto":
        return arg
    if vocab_size < MIN_VOCAB:
        logging.warning("vocab size %d is too small for the bundled tokenizer: serving ids only",
                        vocab_size)
        return None
    return str(ensure_tokenizer(vocab_size))


async def serve(args: argparse.Namespace) -> None:
    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)
    model_cfg = ModelConfig(vocab_size=args.vocab_size, d_model=args.d_model,
                            n_layers=args.n_layers, n_heads=args.n_heads, d_ff=args.d_ff,
                            max_context=args.max_context, eos_token_id=args.eos_token_id)
    engine_cfg = EngineConfig(max_running_requests=args.max_running_requests,
                              kv_budget_tokens=args.kv_budget_tokens,
                              max_prefill_tokens=args.max_prefill_tokens, device=args.device,
                              dtype=args.dtype, min_step_seconds=args.min_step_seconds,
                              enable_priority_scheduling=args.enable_priority_scheduling,
                              init_new_token_ratio=args.init_new_token_ratio,
                              clip_max_new_tokens=args.clip_max_new_tokens)
    engine = build_engine(model_cfg, engine_cfg, seed=args.seed, checkpoint=args.checkpoint)
    runner = EngineRunner(engine, weight_version=args.weight_version,
                          iteration_log=args.iteration_log)
    server = EngineHTTPServer(runner, ServerConfig(
        host=args.host, port=args.port, model_path=args.model_path,
        incremental_streaming_output=args.incremental_streaming_output,
        tokenizer_path=resolve_tokenizer(args.tokenizer_path, engine.vocab_size),
        enable_memory_saver=args.enable_memory_saver, read_timeout_s=args.read_timeout))
    # handler_cancellation: a client that disconnects cancels its handler, which aborts the
    # request (SGLang does the same), streaming or not.
    # auto_decompress off: read_json decodes Content-Encoding itself (bounded; 415 for others).
    # lingering_time: after an error answered before its body arrived (408, 413, ...), the rest
    # of the body is read and dropped for at most this long, then the connection is closed.
    app_runner = web.AppRunner(server.app, access_log=None, handler_cancellation=True,
                               auto_decompress=False,
                               lingering_time=min(2.0, max(args.read_timeout, 0.0)))
    await app_runner.setup()
    reaper = asyncio.create_task(server.watch_connections(app_runner.server))
    site = web.TCPSite(app_runner, args.host, args.port)
    await site.start()
    print(f"real.serve listening on http://{args.host}:{args.port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    reaper.cancel()
    await app_runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)
    try:
        asyncio.run(serve(args))
    except (ValueError, OSError) as exc:  # a bad checkpoint or flag, a busy port: one line
        print(f"real.serve: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
