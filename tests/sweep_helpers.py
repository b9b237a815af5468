"""A tiny scenario for sweep and tune tests: 2 engines, 4 groups of 4, a few steps (ms per run)."""

from __future__ import annotations

from aprilsim.config import Scenario, scenario_from_dict

TINY = {
    "name": "tiny",
    "steps": 4,
    "batch_size": 4,
    "group_size": 4,
    "max_response_len": 4096,
    "cluster": {"engines": 2},
    "lengths": {"family": "lognormal", "mu": 6.5, "sigma": 0.9},
    "schedulers": {"april": {"ratio": 2.0}},
}

TINY_TOML = """name = "tiny"
steps = 4
batch_size = 4
group_size = 4
max_response_len = 4096

[cluster]
engines = 2

[lengths]
family = "lognormal"
mu = 6.5
sigma = 0.9

[schedulers.april]
ratio = 2.0
"""


def tiny() -> Scenario:
    return scenario_from_dict(dict(TINY))
