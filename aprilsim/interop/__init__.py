"""Launch configs in and out: slime flags and verl configs <-> aprilsim scenarios.

Pure functions over text: `from_slime(text)` and `from_verl(text)` return an `ImportResult` (a
scenario dict plus every setting that could not be mapped), `to_slime(scenario)` the slime flags
that launch a scenario. `aprilsim scenario --from-slime/--from-verl/--to-slime` wraps them.
"""

from aprilsim.interop.common import ImportResult, UnmappedFlagsWarning
from aprilsim.interop.slime import format_flags, from_slime, to_slime
from aprilsim.interop.toml_out import dumps as scenario_toml
from aprilsim.interop.verl import from_verl

__all__ = [
    "ImportResult",
    "UnmappedFlagsWarning",
    "format_flags",
    "from_slime",
    "from_verl",
    "scenario_toml",
    "to_slime",
]
