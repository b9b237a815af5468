"""The names of the candidate length families, in a module of their own so that the command
line's help can list them without loading scipy (`families.py` holds the families themselves)."""

from __future__ import annotations

PARAMETRIC_FAMILIES: tuple[str, ...] = (
    "lognormal",
    "gamma",
    "weibull",
    "loglogistic",
    "gengamma",
    "lognormal_mixture2",
    "lognormal_mixture3",
)
ALL_FAMILIES: tuple[str, ...] = (*PARAMETRIC_FAMILIES, "empirical")
