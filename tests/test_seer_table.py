"""experiments/seer_table.py in miniature (issue 38 item 3): the paper's setups, the presets they
run on, the pairing against veRL's dispatch, and both tail-latency measures."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

import seer_table  # noqa: E402

from aprilsim.engine.cost import PRESETS, TabulatedCost  # noqa: E402
from aprilsim.engine.seer_presets import KIMI_K2, MOONLIGHT  # noqa: E402


def test_the_setups_are_the_papers():
    """GPUs, prompts per step, responses per prompt and caps as the Seer paper states them."""
    got = {s.name: (s.gpus, s.prompts, s.group, s.cap) for s in seer_table.SETUPS}
    assert got == {"Moonlight": (32, 400, 8, 65_536), "Qwen2-VL-72B": (128, 600, 16, 40_960),
                   "Kimi-K2": (256, 800, 8, 98_304)}
    for s in seer_table.SETUPS:
        assert s.preset in PRESETS and s.gpus % s.gpus_per_instance == 0
        assert PRESETS[s.preset].tp == s.gpus_per_instance


def test_moe_presets_read_the_experts_their_batch_touches():
    """A MoE step's fixed cost grows with the batch as it touches more experts, and at a full
    batch reads every weight; routed + non-routed = total, and the active count adds up."""
    for m in (MOONLIGHT, KIMI_K2):
        assert math.isclose(m.total - m.routed + m.routed * m.top_k / m.experts, m.active)
        assert m.touched(1) == pytest.approx(m.top_k / m.experts)
        assert m.touched(4096) > 0.99
    kimi = PRESETS["kimi-k2-h800-ep16"]
    assert isinstance(kimi.cost, TabulatedCost)
    f = [kimi.cost.coefficients(b)[0] for b in (1, 8, 64, 512, 4096)]
    assert f == sorted(f) and f[-1] > 2 * f[0]
    assert kimi.kv_bytes_per_token == 61 * 576  # MLA latent, FP8
    assert PRESETS["qwen2-vl-72b-h800-tp4"].kv_bytes_per_token == 80 * 2 * 128 * 2 * 2


def test_a_quick_table_pairs_seeds_against_verls_dispatch(tmp_path):
    out = tmp_path / "t"
    rows = seer_table.main(["--quick", "--only", "moonlight", "--out", str(out)])
    by = {r.variant: r for r in rows}
    assert set(by) == {label for label, *_ in seer_table.VARIANTS}
    for r in rows:
        assert r.setup == "Moonlight" and len(r.gain) == len(r.tail) == len(r.p99) == 2
        # the paper's tail (the last 10 % of requests) is a share of the baseline's rollout
        assert all(0.1 < x < 0.9 for x in r.base_tail_share)
    seer = by["seer"]
    spec = by["seer + grouped speculative decoding"]
    assert min(seer.gain) > 0 and min(seer.tail) < 0  # faster, a shorter tail
    assert all(a > b for a, b in zip(spec.gain, seer.gain))  # the drafts add to it
    text = out.with_suffix(".md").read_text()
    assert "published (Seer v1 abstract, against veRL): rollout throughput +74% to +97%" in text
    assert "scaled down 8x" in text and text.count("| Moonlight |") == 4
