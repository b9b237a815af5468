"""experiments/paper_table.py in miniature: the grid, the pairing, the baselines slime ran."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

import paper_table  # noqa: E402


def test_the_grid_has_every_setup_with_its_baseline_script():
    setups = paper_table.find_setups()
    assert len(setups) == 18
    assert {(s.family, s.algo, s.dataset) for s in setups} == {
        (f, a, d) for f in ("qwen", "deepseek") for a in ("grpo", "dapo", "gspo")
        for d in ("dapo", "deepscaler", "deepmath")}
    assert all(s.baseline.is_file() and "-partial" not in s.baseline.name for s in setups)


def test_a_tiny_table_pairs_seeds_against_the_baseline_slime_ran(tmp_path):
    out = tmp_path / "t"
    rows = paper_table.main(["--seeds", "2", "--steps", "5", "--warmup", "1",
                             "--only", "qwen/.*/deepmath", "--out", str(out)])
    assert all(r.dataset == "DeepMath-103K" and r.model == "Qwen3-4B" for r in rows)
    by_algo = {r.algorithm: r for r in rows}
    assert set(by_algo) == {"GRPO", "DAPO", "GSPO"}
    assert (by_algo["GRPO"].april, by_algo["GRPO"].baseline) == ("april", "sync")
    assert (by_algo["DAPO"].april, by_algo["DAPO"].baseline) == ("april_ds", "slime_dapo")
    assert by_algo["GRPO"].preset == "qwen3-4b-mi300x-tp2"
    assert by_algo["GRPO"].gain == by_algo["GSPO"].gain  # GSPO changes the loss, not the rollout
    assert by_algo["GRPO"].gain == by_algo["GRPO"].sync_gain  # its baseline is sync
    assert by_algo["DAPO"].baseline_waste > 0.3  # slime's DAPO baseline throws away a lot
    assert all(len(r.gain) == 2 and r.published == 0.35 for r in rows)
    assert out.with_suffix(".md").read_text().count("| Qwen3-4B |") == 3
