"""`aprilsim validate` lands simulated aborts and re-queues retracted requests as the live
engine family does."""

from __future__ import annotations

from real.clients.vllm import VLLMEngine
from real.validate import abort_steps_of, retract_to_of


def test_abort_steps_by_engine_family():
    assert abort_steps_of(object(), "aprilsim-torch-0.2") == 0  # bundled server: between steps
    assert abort_steps_of(object(), "aprilsim-torch-local") == 0  # bundled, in-process
    assert abort_steps_of(object(), "0.5.23") == 1  # SGLang: one more decode pass (to_finish)
    assert abort_steps_of(object(), None) == 1
    vllm = VLLMEngine.__new__(VLLMEngine)
    assert abort_steps_of(vllm, None) == 0


def test_retracted_requests_re_enter_the_queue_as_the_engine_family_does():
    assert retract_to_of(object()) == "tail"  # SGLang and the bundled engine append
    assert retract_to_of(VLLMEngine.__new__(VLLMEngine)) == "head"  # vLLM prepends
