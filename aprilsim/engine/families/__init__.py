"""Engine families: each engine's own scheduling rules as objects, and the golden traces that
check them.

The registry of `Family` objects by name (`[cluster] family`):

    from aprilsim.engine.families import make_family, register
    spec = replace(spec, family=make_family("vllm"))   # vLLM's rules, its default parameters
    register("mine", MyFamily)                         # a new family: a frozen dataclass

`protocol` says what a family is and what its rules answer; `sglang` holds SGLang 0.5.23's rules
(which the bundled engine's and, for now, vLLM's reuse with their parameters: `bundled`,
`vllm`). docs/simulator.md, "Engine families". `vllm_steps.VllmSteps` is vLLM V1's step
scheduler (0.32) reproduced exactly, to become the `vllm` family's rules; `workloads`, `traces`
and `trace_driver` are the family-neutral workloads, trace files and replay loop that check a
family against the real engine's scheduler (tests/data/engine_traces/).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from aprilsim.engine.families.bundled import BundledFamily
from aprilsim.engine.families.protocol import ABORT_AT_ONCE, Family, Rules, Step
from aprilsim.engine.families.sglang import SIMPLE, SGLangFamily, SGLangRules
from aprilsim.engine.families.vllm import VLLMFamily

__all__ = ["ABORT_AT_ONCE", "FAMILIES", "SIMPLE", "BundledFamily", "Family", "Rules",
           "SGLangFamily", "SGLangRules", "Step", "VLLMFamily", "family_params", "make_family",
           "register"]

# name -> the family's class (called with its parameters, each defaulting to the family's own)
FAMILIES: dict[str, Callable[..., Family]] = {}


def register(name: str, cls: Callable[..., Family]) -> None:
    """Make a family known by `name` (scenarios' `[cluster] family`); its class is a frozen
    dataclass whose fields are the parameters a scenario may set."""
    FAMILIES[name] = cls


def family_params(name: str) -> tuple[str, ...]:
    """The parameters family `name` takes (its dataclass fields)."""
    cls = FAMILIES[name]
    return tuple(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]


def make_family(name: str, **params: Any) -> Family:
    """Family `name` with `params` (None: the family's default); ValueError, one line, for an
    unknown family or a parameter it does not take."""
    if name not in FAMILIES:
        raise ValueError(f"unknown engine family {name!r}; known: {', '.join(sorted(FAMILIES))}")
    given = {k: v for k, v in params.items() if v is not None}
    takes = family_params(name)
    for k in given:
        if k not in takes:
            raise ValueError(f"the {name} family has no rule {k!r}; its rules: "
                             f"{', '.join(takes) or 'none'}")
    return FAMILIES[name](**given)


register("sglang", SGLangFamily)
register("bundled", BundledFamily)
register("vllm", VLLMFamily)
