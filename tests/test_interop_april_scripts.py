"""Every script of the APRIL repository imports to the scheduler slime runs for it, with its
baseline, its model's and GPU's preset and its dataset's lengths, and every assumption noted."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import event, given, settings
from hypothesis import strategies as st

from aprilsim.cli import main
from aprilsim.config import scenario_from_dict
from aprilsim.interop import from_slime, to_slime
from aprilsim.interop.slime import read_source

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DATA = Path(__file__).parent / "data"
SCRIPTS = sorted((DATA / "april" / "scripts" / "partial_rollout").rglob("*.sh"))
PRESET = {"qwen": "qwen3-4b-mi300x-tp2", "deepseek": "r1-distill-qwen-1.5b-mi300x-tp2"}


def _shape(path: Path) -> tuple[str, str, str, bool]:
    """(model family, algorithm, dataset, partial) from the script's place in the repository."""
    family, algo = path.parts[-3], path.parts[-2]
    stem = path.stem
    partial = stem.endswith("-partial")
    dataset = next(d for d in ("deepmath", "deepscaler", "dapo") if f"-{d}" in stem)
    return family, algo, dataset, partial


def test_the_vendored_scripts_cover_the_papers_grid():
    shapes = {_shape(p) for p in SCRIPTS}
    assert len(SCRIPTS) == 36 and len(shapes) == 36
    assert (DATA / "april" / "LICENSE").read_text().lstrip().startswith("Apache License")


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: f"{p.parts[-3]}/{p.parts[-2]}/{p.stem}")
def test_each_script_maps_to_what_slime_runs(path):
    family, algo, dataset, partial = _shape(path)
    res = from_slime(path.read_text())
    data, notes = res.data, " | ".join(res.notes)
    expected = {  # (partial, DAPO filter) -> compare, the script's baseline before it
        (True, True): ["sync", "slime_dapo", "april_ds"],
        (True, False): ["sync", "april"],
        (False, True): ["sync", "slime_dapo"],
        (False, False): ["sync"],
    }[(partial, algo == "dapo")]
    assert data["compare"] == expected
    if partial:
        assert data["schedulers"][expected[-1]]["ratio"] == 2.0
    assert data["cluster"]["preset"] == PRESET[family]
    assert data["cluster"]["engines"] == 4 and data["launch"]["gpus_per_engine"] == 2
    assert "AMD GPUs" in notes and "picked by model" in notes
    assert "lengths:" in notes and "an estimate" in notes
    assert "--rollout-num-gpus-per-engine not set" not in notes  # the scripts set it
    sc = scenario_from_dict(data)
    assert sc.engine_spec().tp == 2


def test_datasets_map_to_distinct_length_models():
    by_model: dict[str, set[tuple]] = {}
    for path in SCRIPTS:
        family, _, dataset, _ = _shape(path)
        lengths = from_slime(path.read_text()).data["lengths"]
        by_model.setdefault(family, set()).add((dataset, lengths["mu"], lengths["sigma"]))
    for family, models in by_model.items():
        assert len(models) == 3, (family, models)  # one per dataset
        assert len({m[1] for m in models}) == 3  # and they differ


def test_unknown_model_and_gpu_are_said_plainly():
    res = from_slime("--rollout-batch-size 8 --colocate --hf-checkpoint /m/Llama-3-8B")
    notes = " | ".join(res.notes)
    assert "matches no preset model" in notes and "WARNING" in notes
    assert "NVIDIA H100 assumed" in notes
    assert "--actor-num-gpus-per-node not set: slime's default, 8" in notes
    assert "--rollout-num-gpus-per-engine not set: slime's default, 1 GPU per engine" in notes
    tp4 = from_slime("--rollout-batch-size 8 --colocate --hf-checkpoint /m/Qwen3-4B "
                     "--rollout-num-gpus-per-engine 4")
    assert any("no preset for qwen3-4b on H100 at TP 4" in n and "WARNING: TP 2" in n
               for n in tp4.notes)


def test_train_async_with_april_flags_is_async_april_and_an_interval_is_refused():
    res = from_slime("python3 train_async.py --rollout-batch-size 32 --partial-rollout "
                     "--over-sampling-batch-size 64 --rollout-num-gpus 8 "
                     "--dynamic-sampling-filter-path x.check_reward_nonzero_std")
    assert res.data["compare"] == ["sync", "async_one_step", "async_april"]
    assert res.data["schedulers"]["async_april"] == {"ratio": 2.0, "recycle": True,
                                                     "dynamic_filter": True}
    argv, notes = to_slime(scenario_from_dict(res.data))
    for flag in ("--partial-rollout", "--dynamic-sampling-filter-path"):
        assert flag in argv
    assert argv[argv.index("--over-sampling-batch-size") + 1] == "64"
    assert "--colocate" not in argv and any("train_async.py" in n for n in notes)
    with pytest.raises(ValueError, match="--update-weights-interval 2"):
        from_slime("python3 train_async.py --rollout-batch-size 32 --update-weights-interval 2")
    r = CliRunner().invoke(main, ["scenario", "--from-slime", "python3 train_async.py "
                                  "--rollout-batch-size 32 --update-weights-interval 3"])
    assert r.exit_code == 2 and "not modelled" in r.stderr
    ok = from_slime("python3 train.py --rollout-batch-size 32 --update-weights-interval 2")
    assert any("ignores it" in n for n in ok.notes)


def test_long_argument_strings_and_a_lengths_model(tmp_path):
    args = " ".join(["--rollout-batch-size 16 --n-samples-per-prompt 4 --colocate"]
                    + [f"--lr 1e-6 --eps-clip 0.2 --weight-decay 0.{i}" for i in range(12)])
    assert len(args) > 255
    assert read_source(args) == args
    lengths = tmp_path / "model.toml"
    lengths.write_text("[lengths]\nfamily = \"lognormal\"\nmu = 7.0\nsigma = 0.5\n")
    r = CliRunner().invoke(main, ["scenario", "--from-slime", args, "--lengths", str(lengths)])
    assert r.exit_code == 0, r.stderr
    data = tomllib.loads(r.stdout)
    assert data["batch_size"] == 16 and data["lengths"] == {"from": str(lengths)}
    assert "given with --lengths" in r.stderr


def test_a_ratio_that_is_not_a_whole_number_of_groups_is_said():
    sc = scenario_from_dict({**from_slime("--rollout-batch-size 30 --colocate").data,
                             "compare": ["sync", "april"],
                             "schedulers": {"april": {"ratio": 1.33333}}})
    argv, notes = to_slime(sc)
    assert argv[argv.index("--over-sampling-batch-size") + 1] == "40"
    assert any("not a whole number" in n and "40" in n for n in notes)
    exact = scenario_from_dict({**sc.model_dump(), "schedulers": {"april": {"ratio": 43 / 30}}})
    argv, notes = to_slime(exact)
    assert argv[argv.index("--over-sampling-batch-size") + 1] == "43"  # 43/30 x 30, not 44
    assert not any("not a whole number" in n for n in notes)


def _gpus(argv: list[str]) -> int:
    """Every GPU a slime launch uses: the trainer's, plus the rollout's unless colocated."""
    res = from_slime(" ".join(argv))
    m = res.mapped
    trainer = m.get("--actor-num-nodes", 1) * m.get("--actor-num-gpus-per-node", 8)
    if "--colocate" in m:
        return max(trainer, m.get("--rollout-num-gpus", trainer))
    return trainer + m.get("--rollout-num-gpus", 0)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(colocate=st.booleans(), nodes=st.sampled_from([None, 1, 2]),
       per_node=st.sampled_from([None, 4, 8]), rollout=st.sampled_from([None, 4, 8, 16]),
       tp=st.sampled_from([None, 1, 2, 4]), entry=st.sampled_from(["train.py", "train_async.py"]),
       partial=st.booleans())
def test_round_trips_keep_every_gpu_count(colocate, nodes, per_node, rollout, tp, entry, partial):
    if entry == "train_async.py":
        colocate, partial = False, False  # slime asserts it; APRIL flags are refused there
    if not colocate and rollout is None:
        rollout = 8  # slime needs the rollout's GPUs when they are separate
    argv = ["python3", entry, "--rollout-batch-size", "8"]
    for flag, value in (("--actor-num-nodes", nodes), ("--actor-num-gpus-per-node", per_node),
                        ("--rollout-num-gpus", rollout), ("--rollout-num-gpus-per-engine", tp)):
        if value is not None:
            argv += [flag, str(value)]
    argv += ["--colocate"] * colocate + ["--partial-rollout"] * partial
    first = from_slime(" ".join(argv))
    sc = scenario_from_dict(first.data)
    back, _ = to_slime(sc)
    event("colocated" if colocate else "disaggregated")
    assert _gpus(argv[2:]) == _gpus(back)
    again = scenario_from_dict(from_slime(" ".join(back)).data)
    assert again.cluster.engines == sc.cluster.engines


def test_a_colocated_import_exported_for_async_says_the_gpus_change():
    sc = scenario_from_dict(from_slime("--rollout-batch-size 8 --colocate "
                                       "--actor-num-gpus-per-node 8").data)
    argv, notes = to_slime(sc, "async_one_step")
    assert "--colocate" not in argv
    assert any("not 8 in all" in n for n in notes)
