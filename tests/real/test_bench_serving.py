"""SGLang's own benchmark client (``sglang.bench_serving``, vendored) against the bundled server.

The client measures time to first token and inter-token latency only from non-empty ``text``
chunks, so this checks that the server's text streaming is real, with the bundled tokenizer
loaded through ``transformers.AutoTokenizer`` from its local directory. It runs in a subprocess
with the vendored modules first on the path (see third_party/sglang_bench/README.md for what is
stubbed); nothing is downloaded (the random dataset reads a ShareGPT-format file written here).
Its retokenized output count equals the generated count: the server lets the model sample only
tokens whose text re-encodes to themselves (``TextCodec.roundtrip_ids``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import tokenizer_dir

from real.torch_engine.tokenizer import TextCodec, corpus

VENDORED = Path(__file__).parent / "third_party" / "sglang_bench"
NUM_PROMPTS, IN_LEN, OUT_LEN = 24, 32, 24


def _sharegpt_file(path: Path) -> Path:
    lines = corpus(400, seed=1)
    data = [{"conversations": [{"from": "human", "value": " ".join(lines[i:i + 8])},
                               {"from": "gpt", "value": lines[i + 8]}]}
            for i in range(0, 390, 9)]
    path.write_text(json.dumps(data))
    return path


def test_bench_serving_reports_ttft_and_itl(servers, tmp_path):
    for mod in ("transformers", "orjson", "requests", "tqdm"):
        pytest.importorskip(mod)
    out = tmp_path / "bench.jsonl"
    cmd = [sys.executable, "-c", "from sglang.benchmark.serving import cli_main; cli_main()",
           "--backend", "sglang", "--base-url", servers[0].url, "--dataset-name", "random",
           "--dataset-path", str(_sharegpt_file(tmp_path / "sharegpt.json")),
           "--random-input-len", str(IN_LEN), "--random-output-len", str(OUT_LEN),
           "--random-range-ratio", "1.0", "--num-prompts", str(NUM_PROMPTS),
           "--tokenizer", str(tokenizer_dir()), "--model", "aprilsim/tiny-random",
           "--output-file", str(out), "--output-details", "--seed", "1", "--disable-tqdm",
           # unknown top-level fields go into every /generate body: ignored, as SGLang does
           "--extra-request-body", '{"foo": 1, "bench_tag": {"run": "ci"}}']
    env = {**os.environ, "PYTHONPATH": str(VENDORED), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text().splitlines()[-1])
    assert res["completed"] == NUM_PROMPTS and not any(res["errors"])
    assert res["total_output_tokens"] == NUM_PROMPTS * OUT_LEN
    assert res["mean_ttft_ms"] > 0 and res["mean_itl_ms"] > 0 and res["median_itl_ms"] > 0
    assert all(t > 0 for t in res["ttfts"]) and all(len(i) == OUT_LEN - 1 for i in res["itls"])
    texts = res["generated_texts"]
    assert all(texts)
    # The retokenized count is the bundled tokenizer's count of the text the server sent, and,
    # since the server samples only tokens whose text round-trips, the generated count.
    codec = TextCodec(tokenizer_dir())
    assert res["total_output_tokens_retokenized"] == sum(len(codec.encode(t)) for t in texts)
    assert res["total_output_tokens_retokenized"] == res["total_output_tokens"]
    print(json.dumps({k: res[k] for k in ("mean_ttft_ms", "median_ttft_ms", "mean_itl_ms",
                                          "median_itl_ms", "output_throughput",
                                          "total_output_tokens",
                                          "total_output_tokens_retokenized")}))
