"""slime launch scripts -> scenarios -> slime flags, on the APRIL repository's own scripts."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

from aprilsim.config import load_scenario, scenario_from_dict
from aprilsim.interop import UnmappedFlagsWarning, format_flags, from_slime, to_slime
from aprilsim.interop.slime import parse_flags
from aprilsim.interop.toml_out import dumps

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DATA = Path(__file__).parent / "data"
PARTIAL = [
    "april-grpo-run-qwen3-4B-dapo-partial.sh",
    "april-grpo-run-qwen3-4B-deepscaler-partial.sh",
    "april-grpo-run-qwen3-4B-deepmath-partial.sh",
    "april-dapo-run-qwen3-4B-dapo-partial.sh",
]
ALL = [*PARTIAL, "april-grpo-run-qwen3-4B-dapo.sh"]


def _read(name: str) -> str:
    return (DATA / name).read_text()


@pytest.mark.parametrize("name", PARTIAL)
def test_april_scripts_import_to_the_paper_setup(name):
    res = from_slime(_read(name))
    sc = scenario_from_dict(res.data)
    paper = load_scenario()  # the default scenario is the APRIL paper's setup
    for key in ("batch_size", "group_size", "max_response_len"):
        assert getattr(sc, key) == getattr(paper, key)
    assert sc.cluster.engines == paper.cluster.engines == 4  # 8 GPUs / TP 2
    target = sc.compare[-1]
    assert sc.compare[0] == "sync"
    assert sc.schedulers[target] == {"ratio": 2.0, "recycle": True}  # 64 / 32, --partial-rollout
    assert sc.launch.colocate is True
    assert sc.launch.gpus_per_engine == 2
    assert sc.launch.temperature == 0.8
    assert sc.launch.global_batch_size == 256
    assert sc.launch.mem_fraction_static == 0.6


def test_dapo_filter_with_partial_rollout_is_april_ds():
    res = from_slime(_read("april-dapo-run-qwen3-4B-dapo-partial.sh"))
    assert res.data["compare"] == ["sync", "slime_dapo", "april_ds"]  # the script's baseline too
    assert res.data["schedulers"]["slime_dapo"] == {"ratio": 1.0}
    assert res.data["launch"]["dynamic_sampling_filter"].endswith("check_reward_nonzero_std")
    grpo = from_slime(_read("april-grpo-run-qwen3-4B-dapo-partial.sh"))
    assert grpo.data["compare"] == ["sync", "april"]


def test_script_without_partial_rollout_is_sync():
    res = from_slime(_read("april-grpo-run-qwen3-4B-dapo.sh"))
    assert res.data["compare"] == ["sync"]
    assert "--partial-rollout" not in res.mapped  # commented out in the script


@pytest.mark.parametrize("name", ALL)
def test_round_trip_keeps_every_mapped_flag(name):
    first = from_slime(_read(name))
    argv, _ = to_slime(scenario_from_dict(first.data))
    again = from_slime(" ".join(argv))
    assert first.mapped, "nothing mapped"
    for flag, value in first.mapped.items():
        assert again.mapped.get(flag) == value, flag
    # and the flags printed for a bash array parse back to the same argv
    _, flags, _ = parse_flags(format_flags(argv, ["a note"]))
    assert parse_flags(" ".join(argv))[1] == flags


@pytest.mark.parametrize("name", ALL)
def test_every_flag_is_mapped_or_listed_in_one_warning(name):
    text = _read(name)
    _, flags, unresolved = parse_flags(text)
    res = from_slime(text)
    assert set(res.mapped) | {f for f in res.unmapped if f.startswith("--")} == set(flags)
    assert not set(res.mapped) & set(res.unmapped)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res.scenario("slime flags")
    ours = [w for w in caught if issubclass(w.category, UnmappedFlagsWarning)]
    assert len(ours) == 1
    msg = str(ours[0].message)
    for flag in ["--lr", "--eps-clip-high", "--rm-type", "--num-epoch"]:
        assert flag in msg
    assert "${MODEL_ARGS[@]}" in msg and unresolved == ["MODEL_ARGS", "DISTRIBUTED_ARGS"]
    for flag in res.mapped:
        assert f"{flag}," not in msg and not msg.endswith(flag)


def test_argument_string_maps_exact_values():
    res = from_slime(
        "--rollout-batch-size 16 --n-samples-per-prompt 4 --partial-rollout "
        "--over-sampling-batch-size 48 --rollout-num-gpus 6 --rollout-num-gpus-per-engine 2 "
        "--rollout-max-response-len=8192 --rollout-max-prompt-len 1024 --num-rollout 3 "
        "--sglang-max-running-requests 128 --sglang-max-total-tokens 500000 "
        "--sglang-max-prefill-tokens 8192 --sglang-chunked-prefill-size 4096 --lr 1e-6"
    )
    sc = scenario_from_dict(res.data)
    assert (sc.batch_size, sc.group_size, sc.max_response_len, sc.steps) == (16, 4, 8192, 3)
    assert sc.prompts["max_len"] == 1024
    assert sc.cluster.engines == 3
    assert (sc.cluster.max_running, sc.cluster.kv_capacity, sc.cluster.max_prefill_tokens) == (
        128, 500000, 8192)
    assert sc.cluster.chunked_prefill_size == 4096  # simulated (issue 11), and exported back
    assert sc.engine_spec().prefill_chunk == 4096
    argv, _ = to_slime(sc)
    assert argv[argv.index("--sglang-chunked-prefill-size") + 1] == "4096"
    assert sc.launch.colocate is False
    assert sc.schedulers["april"] == {"ratio": 3.0, "recycle": True}
    assert res.unmapped == ["--lr"]


def test_over_sampling_without_partial_rollout_aborts_without_recycling():
    res = from_slime("--rollout-batch-size 32 --over-sampling-batch-size 48 --colocate")
    assert res.data["schedulers"] == {"april": {"ratio": 1.5, "recycle": False}}
    argv, _ = to_slime(scenario_from_dict(res.data))
    assert "--partial-rollout" not in argv and "--over-sampling-batch-size" in argv


def test_dynamic_sampling_without_partial_rollout_is_slimes_abort_and_discard():
    res = from_slime("--rollout-batch-size 32 --over-sampling-batch-size 96 --colocate "
                     "--dynamic-sampling-filter-path my.filters.keep")
    assert res.data["schedulers"] == {"slime_dapo": {"ratio": 3.0}}
    assert res.data["compare"] == ["sync", "slime_dapo"]
    assert any("custom filter" in n for n in res.notes)
    argv, _ = to_slime(scenario_from_dict(res.data))
    assert argv[argv.index("--dynamic-sampling-filter-path") + 1] == "my.filters.keep"


def test_train_async_is_async_one_step():
    res = from_slime("python3 train_async.py --rollout-batch-size 8 --rollout-num-gpus 4")
    assert res.data["compare"] == ["sync", "async_one_step"]
    argv, notes = to_slime(scenario_from_dict(res.data))
    assert "--colocate" not in argv and any("train_async.py" in n for n in notes)


def test_default_scenario_exports_the_april_launch():
    argv, notes = to_slime(load_scenario())
    line = " ".join(argv)
    for part in ("--rollout-batch-size 32", "--n-samples-per-prompt 8", "--colocate",
                 "--rollout-max-response-len 16384", "--rollout-num-gpus-per-engine 2",
                 "--partial-rollout", "--over-sampling-batch-size 64"):
        assert part in line
    assert "--rollout-num-gpus " not in line  # implied by --colocate on 8 GPUs
    assert any("--num-rollout" in n for n in notes)


def test_scenario_toml_writer_round_trips():
    data = from_slime(_read("april-dapo-run-qwen3-4B-dapo-partial.sh")).data
    assert tomllib.loads(dumps(data, header="x\ny")) == data


def test_script_variables_and_arithmetic_are_substituted():
    script = """#!/bin/bash
NUM_GPUS=${NUM_GPUS:-8}   # from the environment, else 8
export TP=2
BS=16
ROLLOUT_ARGS=(
   --rollout-batch-size ${BS}
   --over-sampling-batch-size $((BS * 3))   # 3x
   --partial-rollout
)
python3 train.py --colocate --actor-num-gpus-per-node $NUM_GPUS \\
   --rollout-num-gpus-per-engine ${TP} ${ROLLOUT_ARGS[@]} --prompt-data ${DATA_DIR}/x.jsonl
"""
    res = from_slime(script)
    assert res.mapped["--rollout-batch-size"] == 16
    assert res.mapped["--over-sampling-batch-size"] == 48
    assert res.data["cluster"]["engines"] == 4
    assert res.data["schedulers"] == {"april": {"ratio": 3.0, "recycle": True}}
    assert res.unmapped == []
    assert res.mapped["--prompt-data"] == "${DATA_DIR}/x.jsonl"  # unknown variable: left as written


FALLBACK = ("slime.rollout.filter_hub.dynamic_sampling_filters."
            "check_reward_nonzero_std_with_fallback")


def _dapo_args(extra: str = "") -> str:
    return ("--hf-checkpoint /m/Qwen3-4B --prompt-data /d/dapo-math-17k.jsonl "
            "--rollout-batch-size 8 --n-samples-per-prompt 4 --rollout-max-response-len 4096 "
            f"--dynamic-sampling-filter-path {FALLBACK} {extra}")


def test_the_fallback_filter_is_modelled_not_read_as_the_plain_one():
    """Issue 36 item 4: `check_reward_nonzero_std_with_fallback` keeps a zero-std group rather
    than start a new over-sampling batch while no more than N groups remain; at an
    over-sampling batch of N, slime's baseline then never drops a group and is exactly sync."""
    res = from_slime(_dapo_args())
    assert res.data["compare"] == ["sync", "slime_dapo"]
    assert res.data["schedulers"]["slime_dapo"]["keep_when_insufficient"] is True
    assert any("runs as sync does" in n for n in res.notes)
    d = dict(res.data, steps=4, warmup_steps=1,
             workload={"rewards": {"alpha": 0.3, "beta": 0.3}})  # many zero-std groups
    sc = scenario_from_dict(d)
    from aprilsim.sim.run import simulate

    sync, fb = (simulate(sc, s).summary() for s in ("sync", "slime_dapo"))
    plain = simulate(sc, "slime_dapo", settings={"keep_when_insufficient": False}).summary()
    assert fb["rollout_throughput_tok_s"] == sync["rollout_throughput_tok_s"]
    assert fb["wasted_tokens"] == 0 < plain["wasted_tokens"]  # the plain filter drops groups
    argv, _ = to_slime(sc, "slime_dapo")  # and the export names the fallback filter again
    assert argv[argv.index("--dynamic-sampling-filter-path") + 1] == FALLBACK


def test_the_fallback_still_drops_while_more_than_n_remain():
    """Over-sampling 2N with the fallback: zero-std groups are dropped while more than N remain
    (in flight or accepted), kept once no more than N do."""
    from aprilsim.sim.run import simulate

    res = from_slime(_dapo_args("--partial-rollout --over-sampling-batch-size 16"))
    assert res.data["schedulers"]["april_ds"]["keep_when_insufficient"] is True
    d = dict(res.data, steps=4, warmup_steps=1,
             workload={"rewards": {"alpha": 0.3, "beta": 0.3}})
    run = simulate(scenario_from_dict(d), "april_ds")
    stats = [s.scheduler_stats for s in run.steps]
    assert sum(s["filtered_groups"] for s in stats) > 0
    assert sum(s.get("kept_insufficient", 0) for s in stats) > 0
