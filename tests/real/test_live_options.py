"""The live commands are a typed library: `aprilsim run` and `aprilsim validate` turn their flags
into `RunOptions` / `ValidateOptions` and call `run_schedulers` / `validate` with them."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from aprilsim.cli import main
from aprilsim.config import default_scenario
from real.runner.api import Outcome
from real.runner.options import EngineTarget, FreeMode, RunOptions, local_scale


def test_an_engine_target_is_exactly_one_of_local_urls_router():
    assert EngineTarget(local=2).urls == ()
    assert EngineTarget.from_flags(engines=" http://a:1, vllm+http://b:2 ,").urls == (
        "http://a:1", "vllm+http://b:2")
    assert EngineTarget(router="http://r:1").urls == ("http://r:1",)
    for bad in ({}, {"local": 1, "router": "http://r"}, {"engines": ("http://a",), "router": "http://r"}):
        with pytest.raises(ValueError, match="exactly one of"):
            EngineTarget(**bad)
    with pytest.raises(ValueError, match="at least 1"):
        EngineTarget(local=0)
    with pytest.raises(ValueError, match="no URL"):
        EngineTarget.from_flags(engines=" , ")


def test_run_options_check_the_scale():
    for bad in (0.0, 1.5, -1.0):
        with pytest.raises(ValueError, match="scale"):
            RunOptions(EngineTarget(local=1), scale=bad)
    assert RunOptions(EngineTarget(local=1)).free is None  # replay unless free mode is given


def _capture_run(monkeypatch) -> list:
    import real.runner.api as api

    seen = []

    def fake(sc, names, opts, progress_for, notify=None):
        seen.append((sc, names, opts))
        return Outcome(notes=["fake note"], error="stopped by the test", code=1)

    monkeypatch.setattr(api, "run_schedulers", fake)
    return seen


def test_aprilsim_run_calls_the_library_with_typed_options(monkeypatch, tmp_path):
    seen = _capture_run(monkeypatch)
    trace = tmp_path / "t.jsonl"
    res = CliRunner().invoke(main, ["run", "--engines", "http://a:1,http://b:2", "-s", "sync", "-s",
                                    "april", "--steps", "2", "--seed", "3", "--trace", str(trace),
                                    "--progress-deadline", "7", "--stalled-after", "5"])
    assert res.exit_code == 1, res.output
    assert "fake note" in res.output and "stopped by the test" in res.output
    ((sc, names, opts),) = seen
    assert names == ["sync", "april"] and sc.steps == 2
    assert (isinstance(opts, RunOptions) and opts.free is None and opts.scale == 1.0
            and opts.seed == 3)
    assert opts.target == EngineTarget(engines=("http://a:1", "http://b:2"),
                                       progress_deadline_s=7.0, stalled_after=5)
    assert opts.outputs == {"sync": {"trace": tmp_path / "t_sync.jsonl"},
                            "april": {"trace": tmp_path / "t_april.jsonl"}}


def test_aprilsim_run_local_and_free_mode_options(monkeypatch, tmp_path):
    seen = _capture_run(monkeypatch)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    res = CliRunner().invoke(main, ["run", "--local", "2", "-s", "sync", "--prompts", str(prompts),
                                    "--eos-id", "5", "--eos-id", "6", "--temperature", "0.5"])
    assert res.exit_code == 1, res.output
    ((sc, _, opts),) = seen
    assert opts.target.local == 2 and opts.scale == local_scale(sc.max_response_len) < 1
    assert opts.free == FreeMode(prompts=prompts, reward=None, eos_ids=(5, 6), lengths_out=None)
    assert opts.temperature == 0.5


def test_bad_engine_flags_are_one_line_errors_before_any_run(monkeypatch):
    seen = _capture_run(monkeypatch)
    for args in (["run"], ["run", "--local", "1", "--router", "http://r"],
                 ["run", "--engines", ","]):
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, (args, res.output)
    assert seen == []


def test_aprilsim_validate_calls_the_library_with_typed_options(monkeypatch, tmp_path):
    import real.validate as rv

    seen = []

    def fake(sc, specs, opts, progress, **kw):
        seen.append((specs, opts))
        raise RuntimeError("stopped by the test")

    monkeypatch.setattr(rv, "validate", fake)
    res = CliRunner().invoke(main, ["validate", "--router", "http://r:1", "-s", "sync",
                                    "--repeats", "2", "--max-running", "8", "--vocab-size", "100",
                                    "--out", str(tmp_path)])
    assert res.exit_code == 2 and "stopped by the test" in res.output, res.output
    ((specs, opts),) = seen
    assert specs == ["sync"] and isinstance(opts, rv.ValidateOptions)
    assert opts.target == EngineTarget(router="http://r:1", vocab_size=100)
    assert (opts.repeats, opts.max_running, opts.scale, opts.calibration) == (2, 8, 1.0, None)


def test_local_scale_brings_the_longest_response_to_about_64_tokens():
    sc = default_scenario()
    assert round(sc.max_response_len * local_scale(sc.max_response_len)) == 64
    assert local_scale(32) == 1.0
