"""verl configs -> scenarios: the DAPO e2e config, the fully-async config, hydra overrides."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from aprilsim.config import scenario_from_dict
from aprilsim.interop import from_verl

pytest.importorskip("yaml")
DATA = Path(__file__).parent / "data"


def test_dapo_config_maps_exact_values():
    res = from_verl((DATA / "verl-dapo-e2e.yaml").read_text())
    sc = scenario_from_dict(res.data)
    assert (sc.batch_size, sc.group_size, sc.max_response_len, sc.steps) == (256, 4, 2048, 1)
    assert sc.prompts["max_len"] == 1024
    assert sc.cluster.engines == 4  # 8 GPUs, rollout TP 2, colocated (hybrid engine)
    assert sc.compare == ["sync", "dynamic_sampling"]
    assert sc.schedulers["dynamic_sampling"] == {"on_cap": "error", "gen_batch_size": 1024,
                                                 "max_rounds": 10}
    assert sc.launch.colocate is True and sc.launch.mem_fraction_static == 0.8
    assert "actor_rollout_ref.actor.optim.lr" in res.unmapped
    assert "data.train_batch_size" not in res.unmapped


def test_fully_async_config():
    res = from_verl((DATA / "verl-fully_async_ppo_trainer.yaml").read_text())
    sc = scenario_from_dict(res.data)
    assert sc.compare == ["sync", "fully_async"]
    assert sc.schedulers["fully_async"] == {"interrupt": True}
    assert sc.group_size == 4 and sc.cluster.engines == 4 and sc.launch.colocate is False
    assert "async_training.staleness_threshold" in res.unmapped
    assert "data.gen_batch_size" in res.unmapped  # read, but meaningless without filter_groups


def test_hydra_overrides_in_a_command():
    res = from_verl(
        "python3 -m verl.trainer.main_ppo data.train_batch_size=64 actor_rollout_ref.rollout.n=16 "
        "data.max_response_length=4096 trainer.n_gpus_per_node=4 "
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1 "
        "actor_rollout_ref.rollout.max_num_seqs=512 trainer.logger=console"
    )
    sc = scenario_from_dict(res.data)
    assert (sc.batch_size, sc.group_size, sc.max_response_len) == (64, 16, 4096)
    assert sc.cluster.engines == 4 and sc.cluster.max_running == 512
    assert sc.compare == ["sync"]
    assert res.unmapped == ["trainer.logger"]


def test_one_step_off_policy():
    res = from_verl("rollout:\n  nnodes: 1\n  n_gpus_per_node: 4\ndata:\n  train_batch_size: 32\n")
    assert res.data["compare"] == ["sync", "async_one_step"]
    assert res.data["cluster"]["engines"] == 2


def test_verl_launch_script_with_shell_arithmetic_matches_its_yaml():
    """verl's own DAPO e2e script (variables, $((...)), hydra overrides) maps like its YAML."""
    script = from_verl((DATA / "verl-run_dapo.sh").read_text())
    yaml_form = from_verl((DATA / "verl-dapo-e2e.yaml").read_text())
    setup = ("actor_rollout_ref.model.path", "data.train_files")  # ${HOME}/... vs ~/...
    assert {k: v for k, v in script.mapped.items() if k not in setup} == \
        {k: v for k, v in yaml_form.mapped.items() if k not in setup}
    for key in setup:
        assert script.mapped[key].split("/")[-2:] == yaml_form.mapped[key].split("/")[-2:]
    assert script.data == yaml_form.data
    assert [w.split("/")[-1] for w in script.warnings] == \
        [w.split("/")[-1] for w in yaml_form.warnings]  # the same model named, in both
    assert set(script.unmapped) == set(yaml_form.unmapped)  # paths under ${HOME} included


def test_unresolved_values_of_mapped_keys_are_listed():
    res = from_verl("python3 -m verl.trainer.main_ppo data.train_batch_size=${BS} "
                    "actor_rollout_ref.rollout.n=8")
    assert res.mapped == {"actor_rollout_ref.rollout.n": 8}
    assert res.unmapped == ["data.train_batch_size (value '${BS}' not resolved)"]


def test_a_one_step_config_keeps_one_summarised_step():
    res = from_verl((DATA / "verl-dapo-e2e.yaml").read_text())  # trainer.total_training_steps: 1
    assert res.data["steps"] == 1 and res.data.get("warmup_steps", 0) == 0


def test_verl_import_notes_every_assumed_value():
    from aprilsim.interop import from_verl

    res = from_verl("actor_rollout_ref.rollout.name=vllm "
                    "actor_rollout_ref.rollout.tensor_model_parallel_size=4 "
                    "trainer.n_gpus_per_node=8")
    notes = " | ".join(res.notes)
    assert "trainer.nnodes not set: verl's default, 1" in notes
    assert any("TP-2 estimate kept for a TP-4 launch" in w for w in res.warnings)
    assert 'name=vllm: cluster.family = "vllm"' in notes
    assert res.data["cluster"]["engines"] == 2


def test_a_vllm_rollout_runs_under_vllms_rules():
    """Issue 34 item 4: rollout.name=vllm picks the vllm family, its step's token budget and its
    chunked prefill; under sglang the budget bounds prefill batches and vLLM's key is unmapped."""
    keys = ("actor_rollout_ref.rollout.max_num_batched_tokens=32768 "
            "actor_rollout_ref.rollout.enable_chunked_prefill=false "
            "actor_rollout_ref.rollout.gpu_memory_utilization=0.7 ")
    vllm = from_verl(keys + "actor_rollout_ref.rollout.name=vllm")
    sc = scenario_from_dict(vllm.data)
    assert sc.cluster.family == "vllm" and sc.cluster.max_num_batched_tokens == 32768
    assert sc.cluster.enable_chunked_prefill is False and sc.cluster.max_prefill_tokens is None
    spec = sc.engine_spec()
    assert spec.family.max_num_batched_tokens == 32768 and not spec.family.enable_chunked_prefill
    assert sc.launch.mem_fraction_static == 0.7  # the launch's; the KV pool is the preset's
    sglang = from_verl(keys + "actor_rollout_ref.rollout.name=sglang")
    sc = scenario_from_dict(sglang.data)
    assert sc.cluster.family == "sglang" and sc.cluster.max_prefill_tokens == 32768
    assert "actor_rollout_ref.rollout.enable_chunked_prefill" in sglang.unmapped
    unnamed = scenario_from_dict(from_verl("actor_rollout_ref.rollout.max_num_batched_tokens=2048")
                                 .data)
    assert unnamed.cluster.family == "sglang" and unnamed.cluster.max_prefill_tokens == 2048


def test_a_model_with_no_preset_and_a_short_cap_are_said_and_fitted():
    """Issue 36 item 4: verl's DAPO e2e config (Qwen2.5-0.5B, 2,048 cap) got the Qwen3-4B preset
    and the default median of 5,000 tokens under its 2,048 cap (83 % truncated), silently."""
    from aprilsim.interop.setups import truncated_share

    res = from_verl((DATA / "verl-dapo-e2e.yaml").read_text())
    (w,) = [w for w in res.warnings if w.startswith("model:")]
    assert "Qwen2.5-0.5B-Instruct" in w and "matches no preset model" in w
    assert "actor_rollout_ref.model.path" not in res.unmapped
    share = truncated_share(res.data["lengths"], res.data["max_response_len"])
    assert share == pytest.approx(0.10, abs=0.01)  # the default's share at its own 16k cap
    assert any("scaled to the 2,048 cap" in n and "83% unscaled" in n for n in res.notes)
    # a model with a preset gets it, and its lengths where the dataset is known
    known = from_verl("actor_rollout_ref:\n  model:\n    path: /m/Qwen3-4B\n"
                      "  rollout:\n    tensor_model_parallel_size: 2\n"
                      "data:\n  train_files: /d/dapo-math-17k.parquet\n"
                      "  max_response_length: 16384\n")
    assert known.data["cluster"]["preset"] == "qwen3-4b-h100-tp2" and not known.warnings
    assert round(math.exp(known.data["lengths"]["mu"])) == pytest.approx(5000, rel=0.01)
    short = from_verl("actor_rollout_ref:\n  model:\n    path: /m/Qwen3-4B\n"
                      "data:\n  train_files: /d/dapo-math-17k.parquet\n"
                      "  max_response_length: 4096\n")
    assert any("of responses reach the 4,096 cap under the estimate" in w for w in short.warnings)


def test_from_verl_takes_a_fitted_length_model(tmp_path):
    from click.testing import CliRunner

    from aprilsim.cli import main

    model = tmp_path / "m.toml"
    model.write_text('[lengths]\nfamily = "lognormal"\nmu = 6.0\nsigma = 0.5\n')
    r = CliRunner().invoke(main, ["scenario", "--from-verl", str(DATA / "verl-dapo-e2e.yaml"),
                                  "--lengths", str(model)])
    assert r.exit_code == 0, r.stderr
    assert f'from = "{model.resolve()}"' in r.stdout
