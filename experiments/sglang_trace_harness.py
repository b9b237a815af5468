"""Drive SGLang 0.5.23's own scheduler code in virtual time and record every step (issue 34).

Runs only where sglang 0.5.23 imports on CPU (see tests/data/engine_traces/sglang-0.5.23/README.md
for the environment). A real `Scheduler` instance is made without its `__init__` (which starts
the model worker, IPC sockets and the tokenizer) and given SGLang's real memory pools, radix
cache (disabled, as `--disable-radix-cache` builds it), schedule policy, new-token-ratio tracker
and batch-result processor; the loop below is `Scheduler.event_loop_normal` with the model forward
replaced by a stub that returns each request's next token. What runs is SGLang's:
`get_next_batch_to_run` (filter/merge of batches, `_get_new_batch_prefill_raw` with
`PrefillAdder`, `SchedulePolicy.calc_priority`, chunked requests, `update_running_batch` with
`check_decode_mem`, `retract_decode` and the ratio tracker), `ScheduleBatch.init_new` /
`prepare_for_extend` / `prepare_for_decode`, `SchedulerBatchResultProcessor.
process_batch_result_prefill` / `process_batch_result_decode` (output tokens, finish checks,
KV release), `_add_request_to_queue` and `abort_request`. The stubs are listed in `STUBS`.
"""

from __future__ import annotations

import logging
import os
import random
import tempfile
import types
import warnings
import zlib
from array import array
from typing import Any

STOP = 2  # the stub model's stop token (every request's `stop_token_ids`)

STUBS = {
    "Scheduler.__init__": "not run (starts the model worker, NCCL/IPC sockets, tokenizer); "
                          "the attributes the scheduling methods read are set from the config",
    "model forward (Scheduler.run_batch)": "each request's next token is given: a token of its "
                                           "own, or STOP when it reaches its target length",
    "metrics_collector / metrics_reporter": "counters only; no effect on scheduling",
    "output_streamer.stream_output": "sends to the detokenizer over IPC: dropped",
    "tp_worker.model_runner": "only attn_backend (no extend_attention_block_m: SGLang's fallback "
                              "64, used by an AMD-only tile budget) and prefill_aware_swa=False",
    "dp_attn_adapter / ngram_embedding_manager": "identity (no DP attention, no n-gram embedding)",
    "grammar_manager": "no grammar requests",
    "ipc_channels": "the abort notice to the tokenizer (send_abort_output): dropped",
    "load_inquirer._get_num_pending_tokens": "0 (prefill statistics for logging only)",
    "on_idle": "only its ratio reset runs (the rest is health checks and metrics)",
    "torchvision": "a module of dummies (reached through VLM configs; no wheel loads against "
                   "torch 2.13 CPU)",
}


def _quiet() -> None:
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)


class _Null:
    """A collaborator whose every attribute is a no-op (feature off, or metrics)."""

    def __getattr__(self, name: str) -> Any:
        return _Null()

    def __call__(self, *a: Any, **k: Any) -> None:
        return None

    def __bool__(self) -> bool:
        return False


class _Metrics(_Null):
    """The metrics reporter: the counters the result processor adds to."""

    def __init__(self) -> None:
        self.num_generated_tokens = 0
        self.enable_metrics = False
        self.num_retracted_reqs = 0
        self.forward_ct_decode = 0


_PUBLISHED: dict[str, Any] = {}


def _server_args(cfg: dict[str, Any]) -> Any:
    """Publish SGLang's ServerArgs for this config (a tiny local Llama config as the model)."""
    from sglang.srt.runtime_context import publish
    from sglang.srt.server_args import ServerArgs
    from transformers import LlamaConfig

    if "dir" not in _PUBLISHED:
        d = tempfile.mkdtemp(prefix="sglang-trace-")
        LlamaConfig(vocab_size=1000, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                    num_attention_heads=1, num_key_value_heads=1,
                    max_position_embeddings=65536,
                    architectures=["LlamaForCausalLM"]).save_pretrained(d)
        _PUBLISHED["dir"] = d
    chunk = cfg["chunked_prefill_size"] or -1
    sa = ServerArgs(model_path=_PUBLISHED["dir"], device="cpu", page_size=1,
                    chunked_prefill_size=chunk, max_running_requests=cfg["max_running_requests"],
                    max_prefill_tokens=cfg["max_prefill_tokens"], skip_tokenizer_init=True,
                    disable_overlap_schedule=True, disable_radix_cache=not cfg["radix_cache"],
                    schedule_policy=cfg["schedule_policy"])
    publish(sa, role="scheduler")
    return sa


def build_scheduler(cfg: dict[str, Any]) -> Any:
    """A real `Scheduler` object, without its __init__, on SGLang's real pools and policy."""
    import torch
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.mem_cache.radix_cache import RadixCache
    from sglang.srt.runtime_context import get_context, get_schedule
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    sa = _server_args(cfg)
    g = get_schedule()
    kv, mr = cfg["kv_tokens"], cfg["max_running_requests"]
    get_context().override("scheduler.pp_max_micro_batch_size_default",
                           pp_max_micro_batch_size=mr)
    s = Scheduler.__new__(Scheduler)
    s.server_args = sa
    s.model_config = ModelConfig.from_server_args(sa)
    attrs = dict(
        forward_ct=0, processed_tokens_counter=0, cur_batch_for_debug=None,
        schedule_policy=g.schedule_policy, enable_priority_scheduling=False,
        schedule_low_priority_values_first=False,
        priority_scheduling_preemption_threshold=g.priority_scheduling_preemption_threshold,
        enable_lora=False, enable_overlap=False, enable_overlap_mlx=False, page_size=1,
        enable_hierarchical_cache=False, enable_lmcache=False, enable_hicache_storage=False,
        enable_unified_cache_external_linker=False, enable_hisparse=False, dllm_config=None,
        is_generation=True, max_running_requests=mr, max_prefill_tokens=cfg["max_prefill_tokens"],
        max_total_num_tokens=kv, max_queued_requests=None, max_req_len=65536,
        truncation_align_size=None, is_hybrid_swa=False, is_hybrid_ssm=False,
        require_mlp_sync=False, scheduler_stage_metrics=None, min_free_slots_delayer=None,
        hisparse_coordinator=None, decode_offload_manager=None, mm_receiver=None,
        future_map=None, draft_worker=None, model_worker=None, _sched_idled=False,
        rust_server=None,
        spec_algorithm=SpeculativeAlgorithm.from_string(None),
        disaggregation_mode=DisaggregationMode.NULL,
    )
    for k, v in attrs.items():
        setattr(s, k, v)
    s.req_to_token_pool = ReqToTokenPool(size=mr, max_context_len=65536, device="cpu",
                                         enable_memory_saver=False)
    pool = MHATokenToKVPool(kv, page_size=1, dtype=torch.float16, head_num=1, head_dim=1,
                            layer_num=1, device="cpu", enable_memory_saver=False)
    s.token_to_kv_pool_allocator = TokenToKVPoolAllocator(kv, torch.float16, "cpu", pool,
                                                          need_sort=False)
    s.tree_cache = RadixCache(CacheInitParams(
        disable=not cfg["radix_cache"], req_to_token_pool=s.req_to_token_pool,
        token_to_kv_pool_allocator=s.token_to_kv_pool_allocator, page_size=1))
    s.init_running_status()
    s.init_chunked_prefill()
    s.dynamic_chunk_sizer = None
    s.metrics_collector = _Null()
    s.metrics_reporter = _Metrics()
    s.init_schedule_policy()
    _stub_collaborators(s)
    s.init_batch_result_processor()
    return s


def _stub_collaborators(s: Any) -> None:
    """The collaborators of features that are off, and of the model (see `STUBS`)."""
    ns = types.SimpleNamespace
    s.grammar_manager = ns(has_waiting_grammars=lambda: False, abort_requests=lambda r: None)
    s.prefill_delayer = None
    s._prefill_decode_interval_remaining = 0
    s.prefill_decode_interval = 0
    s.tp_worker = ns(model_runner=ns(attn_backend=object(), prefill_aware_swa=False))
    s.dp_attn_adapter = ns(maybe_prepare_mlp_sync_batch=lambda b, need_sync=False: b,
                           maybe_convert_decode_to_extend=lambda b: b)
    s.ngram_embedding_manager = ns(prepare_for_forward=lambda b, chunked_req=None: b)
    s.load_inquirer = ns(_get_num_pending_tokens=lambda chunk_deduct=0: 0)
    s.output_streamer = ns(stream_output=lambda *a, **k: None)
    s.ipc_channels = _Null()


def _log_retractions(s: Any) -> None:
    """Record the requests `update_running_batch` re-queues as retracted, in its order (a
    wrapper that calls SGLang's own `_add_request_to_queue`)."""
    s.retract_log = []
    real = type(s)._add_request_to_queue

    def add(req: Any, is_retracted: bool = False) -> None:
        if is_retracted:
            s.retract_log.append(req)
        real(s, req, is_retracted=is_retracted)

    s._add_request_to_queue = add


def _prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, 1000) for _ in range(n)]


def _token(rid: int, pos: int) -> int:
    """The stub model's output token (a request's own; never STOP)."""
    return 10 + (rid * 7919 + pos * 104729) % 990


def _make_req(r: dict[str, Any]) -> Any:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    sp = SamplingParams(max_new_tokens=r["max_new_tokens"], stop_token_ids=[STOP])
    sp.normalize(None)
    return Req(rid_str(r["rid"]), "", array("q", _prompt(r["prompt_seed"], r["prompt_len"])), sp,
               vocab_size=1000)


def rid_str(rid: int) -> str:
    """SGLang rids are matched by prefix in abort_request: fixed width keeps them apart."""
    return f"r{rid:07d}"


def batch_crc(rids: list[int]) -> int:
    """A short fingerprint of a decode batch's membership (sorted request ids)."""
    return zlib.crc32(",".join(map(str, sorted(rids))).encode())


def _stub_forward(batch: Any, targets: dict[str, tuple[int, int]]) -> Any:
    import torch
    from sglang.srt.managers.utils import GenerationBatchResult

    ids = []
    for r in batch.reqs:
        n = len(r.output_ids) + 1  # the position of the token this forward samples
        rid = int(r.rid[1:])
        target, cap = targets[r.rid]  # at the cap: a length finish, no stop token
        ids.append(STOP if n >= target and target < cap else _token(rid, n))
    return GenerationBatchResult(next_token_ids=torch.tensor(ids, dtype=torch.int64))


def _reason(req: Any) -> str:
    fr = req.finished_reason
    name = type(fr).__name__
    return {"FINISH_LENGTH": "length", "FINISH_MATCHED_TOKEN": "stop",
            "FINISH_ABORT": "abort"}.get(name, name)


def run_workload(w: dict[str, Any], max_steps: int = 2_000_000) -> dict[str, Any]:
    """Run one workload through SGLang's scheduler; the trace's `steps` and `counts`.

    The loop is `Scheduler.event_loop_normal`: take what arrives (aborts first), schedule
    (`get_next_batch_to_run`), run the batch (a stub forward) and process its result; with no
    batch and nothing queued or running, `on_idle`'s ratio reset and a jump to the next arrival."""
    _quiet()
    s = build_scheduler(w["config"])
    targets = {rid_str(r["rid"]): (r["target_len"], r["max_new_tokens"]) for r in w["requests"]}
    arrivals: dict[int, list[dict[str, Any]]] = {}
    for r in w["requests"]:
        arrivals.setdefault(r["arrival_step"], []).append(r)
    aborts = set(w["abort_all_steps"])
    rec = _Recorder()
    live: dict[str, Any] = {}
    _log_retractions(s)
    step = 0
    while step < max_steps:
        if step in aborts:
            _abort_all(s, step, rec, live)
        for r in arrivals.pop(step, []):
            req = _make_req(r)
            live[req.rid] = req
            s._add_request_to_queue(req)
        plan = s.get_next_batch_to_run(running_batch=s.running_batch, last_batch=s.last_batch)
        s.running_batch = plan.running_batch
        batch = plan.batch_to_run
        if batch:
            _run_batch(s, batch, targets, rec, live, step)
        elif s.running_batch.is_empty() and not s.waiting_queue and s.chunked_req is None:
            s.new_token_ratio_tracker.reset()  # on_idle: fully idle
            later = [a for a in (*arrivals, *aborts) if a > step]
            if not later:
                break
            s.last_batch = None
            step = min(later)
            continue
        s.last_batch = batch
        step += 1
    return {"steps": rec.steps, "counts": rec.counts}


def _abort_all(s: Any, step: int, rec: _Recorder, live: dict[str, Any]) -> None:
    """SGLang's `abort_request(abort_all=True)`: queued requests (and a chunked one, whose next
    chunk is not launched) leave now; running ones get `to_finish` and leave after one decode."""
    from sglang.srt.managers.io_struct import AbortReq

    queued = {q.rid for q in s.waiting_queue}
    if s.chunked_req is not None:
        queued.add(s.chunked_req.rid)
    s.abort_request(AbortReq(abort_all=True))
    rec.aborted(step, [[int(q[1:]), len(live[q].output_ids)] for q in sorted(queued)])
    for q in queued:
        live.pop(q, None)


def _run_batch(s: Any, batch: Any, targets: dict[str, tuple[int, int]], rec: _Recorder,
               live: dict[str, Any], step: int) -> None:
    """`run_batch` with the stub forward, then SGLang's result processing; recorded."""
    rec.before(step, s, batch)
    res = _stub_forward(batch, targets)
    s.forward_ct += 1
    if batch.forward_mode.is_decode():
        s.batch_result_processor.process_batch_result_decode(batch, res)
    else:
        s.batch_result_processor.process_batch_result_prefill(batch, res)
    rec.after(s, batch, live)


class _Recorder:
    """Turns SGLang's batches into the trace's step records (see the README's format)."""

    def __init__(self) -> None:
        self.steps: list[list[Any]] = []
        self.counts = {"steps": 0, "extend_steps": 0, "decode_steps": 0, "retractions": 0,
                       "retracting_steps": 0, "chunked_steps": 0, "aborts": 0,
                       "finished": 0, "ratio_decays": 0}
        self._prev_crc: int | None = None
        self._pending: dict[str, Any] = {}

    def aborted(self, step: int, left: list[list[int]]) -> None:
        self.steps.append(["A", step, left])
        self.counts["aborts"] += 1

    def before(self, step: int, s: Any, batch: Any) -> None:
        self.counts["steps"] += 1
        ratio = s.new_token_ratio_tracker.current
        p = {"step": step, "ratio": ratio}
        if batch.forward_mode.is_decode():
            self.counts["decode_steps"] += 1
            p["kind"] = "D"
            p["rids"] = [int(r.rid[1:]) for r in batch.reqs]
            mr = s.metrics_reporter
            p["retracted"] = [int(r.rid[1:]) for r in s.retract_log]
            assert len(p["retracted"]) == mr.num_retracted_reqs
            mr.num_retracted_reqs = 0
            self.counts["retractions"] += len(p["retracted"])
            self.counts["retracting_steps"] += bool(p["retracted"])
            self.counts["ratio_decays"] += not p["retracted"]
        else:
            self.counts["extend_steps"] += 1
            p["kind"] = "E"
            p["pieces"] = [[int(r.rid[1:]), int(e), int(pl)]
                           for r, e, pl in zip(batch.reqs, batch.extend_lens, batch.prefix_lens)]
            self.counts["chunked_steps"] += int(s.chunked_req is not None)
        s.retract_log.clear()
        self._pending = p

    def after(self, s: Any, batch: Any, live: dict[str, Any]) -> None:
        p = self._pending
        fin = []
        for r in batch.reqs:
            if r.finished() and r.rid in live:
                fin.append([int(r.rid[1:]), len(r.output_ids), _reason(r)])
                del live[r.rid]
        self.counts["finished"] += len(fin)
        ratio = round(p["ratio"], 9)
        if p["kind"] == "E":
            self.steps.append(["E", p["step"], p["pieces"], fin, ratio])
            self._prev_crc = None
            return
        crc = batch_crc(p["rids"])
        retracted = p["retracted"]
        if not fin and not retracted and crc == self._prev_crc and self.steps \
                and self.steps[-1][0] in "DR":
            last = self.steps[-1]
            if last[0] == "R" and last[1] + last[2] == p["step"]:
                last[2] += 1
            else:
                self.steps.append(["R", p["step"], 1])
        else:
            self.steps.append(["D", p["step"], len(p["rids"]), crc, retracted, fin, ratio])
        self._prev_crc = crc


def record(seeds: list[int], out_dir: str, big: bool = False, tight: bool = False) -> None:
    """Record the workloads of `seeds` (`sglang_trace_workloads.make_workload`) into
    `out_dir`, one gzipped JSON file each (skipped when present: resumable)."""
    import gzip
    import json
    import time

    from sglang_trace_workloads import make_workload

    os.makedirs(out_dir, exist_ok=True)
    for seed in seeds:
        path = os.path.join(out_dir, f"w{seed:05d}.json.gz")
        if os.path.exists(path):
            continue
        w = make_workload(seed, big=big, tight=tight)
        t = time.process_time()
        w.update(run_workload(w))
        w["cpu_s"] = round(time.process_time() - t, 1)
        w["engine"] = "sglang 0.5.23"
        with gzip.open(path + ".tmp", "wt") as f:
            json.dump(w, f, separators=(",", ":"))
        os.replace(path + ".tmp", path)
        print(seed, w["counts"], w["cpu_s"], flush=True)


def rerecord(trace_file: str, count: int) -> int:
    """Record the first `count` workloads of `trace_file` again against the installed SGLang;
    0 when every one gives the stored steps and counts, else 1 (the first difference said)."""
    import gzip
    import json

    with gzip.open(trace_file, "rt") as f:
        for i, line in enumerate(f):
            if i >= count:
                break
            w = json.loads(line)
            again = run_workload(w)
            if again["steps"] != w["steps"] or again["counts"] != w["counts"]:
                print(f"{w['id']}: re-recorded steps differ from the stored trace")
                return 1
            print(f"{w['id']}: {len(w['steps'])} records equal", flush=True)
    return 0


def pack(in_dir: str, out_path: str) -> None:
    """Combine the per-workload files of `record` into one gzipped JSON-lines trace file."""
    import glob
    import gzip
    import json

    with gzip.open(out_path, "wt", compresslevel=9) as out:
        for path in sorted(glob.glob(os.path.join(in_dir, "w*.json.gz"))):
            with gzip.open(path, "rt") as f:
                out.write(json.dumps(json.load(f), separators=(",", ":")) + "\n")


def main(argv: list[str] | None = None) -> int:
    """`record OUT_DIR FIRST_SEED END_SEED [--big] [--tight]`, `rerecord TRACE_FILE COUNT` or
    `pack OUT_DIR TRACE_FILE`."""
    import argparse
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="record workloads FIRST..END-1 into OUT_DIR")
    rec.add_argument("out_dir")
    rec.add_argument("first", type=int)
    rec.add_argument("end", type=int)
    rec.add_argument("--big", action="store_true", help="16k caps, 300-1,000 requests")
    rec.add_argument("--tight", action="store_true", help="long outputs, small KV cache")
    rr = sub.add_parser("rerecord", help="record a trace file's first COUNT workloads again")
    rr.add_argument("trace_file")
    rr.add_argument("count", type=int)
    pk = sub.add_parser("pack", help="combine OUT_DIR's workloads into one .jsonl.gz")
    pk.add_argument("out_dir")
    pk.add_argument("trace_file")
    a = ap.parse_args(argv)
    if a.cmd == "record":
        record(list(range(a.first, a.end)), a.out_dir, big=a.big, tight=a.tight)
    elif a.cmd == "rerecord":
        return rerecord(a.trace_file, a.count)
    else:
        pack(a.out_dir, a.trace_file)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
