"""Workloads: response-length models, rewards, drift, and the seeded group generator.

The names below load on first use (PEP 562): the command line's options import modules of this
package (`aprilsim fit`'s), and `aprilsim --help` should not load numpy for them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aprilsim.lazy_names import lazy_attributes

if TYPE_CHECKING:
    from aprilsim.workload.lengths import FAMILIES as FAMILIES
    from aprilsim.workload.lengths import Empirical as Empirical
    from aprilsim.workload.lengths import LengthModel as LengthModel
    from aprilsim.workload.lengths import LognormalMixture as LognormalMixture
    from aprilsim.workload.lengths import Parametric as Parametric
    from aprilsim.workload.lengths import cap_lengths as cap_lengths
    from aprilsim.workload.lengths import length_model_from_dict as length_model_from_dict

_LAZY = {name: "lengths" for name in (
    "FAMILIES", "Empirical", "LengthModel", "LognormalMixture", "Parametric", "cap_lengths",
    "length_model_from_dict")}

__all__ = sorted(_LAZY)


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, globals())
