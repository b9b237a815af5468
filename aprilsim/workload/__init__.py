"""Workloads: response-length models, rewards, drift, and the seeded group generator."""

from aprilsim.workload.lengths import (
    FAMILIES,
    Empirical,
    LengthModel,
    LognormalMixture,
    Parametric,
    cap_lengths,
    length_model_from_dict,
)

__all__ = [
    "FAMILIES",
    "Empirical",
    "LengthModel",
    "LognormalMixture",
    "Parametric",
    "cap_lengths",
    "length_model_from_dict",
]
