"""Every knob of every registered scheduler against values of every type: a value of the wrong
declared type is refused with a one-line ValueError naming the knob; one that is accepted has the
declared type on the instance (the string "false" never lands in a bool knob)."""

from __future__ import annotations

import math
from collections import Counter

from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from test_engine_equivalence import no_mined_constants

from aprilsim.knob_types import knob_types
from aprilsim.policies.registry import REGISTRY, knobs, make_scheduler

KNOBS = [(name, k.name) for name, cls in sorted(REGISTRY.items()) for k in knobs(cls)]
VALUES = st.one_of(
    st.booleans(), st.integers(-10, 10**7), st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["false", "true", "no", "1", "2.5", ""]),
    st.sampled_from(["fifo", "most_progress", "complete", "discard", "error", "train", "drop",
                     "recycle", "chunk", "one_for_one", "router", "group", "episode",
                     "turn"]),  # the string knobs' own values
    st.lists(st.integers(0, 3), max_size=2), st.none(),
)


def _kind(v) -> str:
    return "bool" if isinstance(v, bool) else type(v).__name__


def _has_type(value, tp) -> bool:
    import types
    import typing

    if typing.get_origin(tp) is typing.Union or isinstance(tp, types.UnionType):
        if value is None:
            return type(None) in typing.get_args(tp)
        return any(_has_type(value, a) for a in typing.get_args(tp) if a is not type(None))
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return (isinstance(value, (int, float)) and not isinstance(value, bool)
                and math.isfinite(value))
    if tp is str:
        return isinstance(value, str)
    return True


def test_knob_values_of_any_type():
    seen: Counter[str] = Counter()

    @settings(derandomize=True, max_examples=600, deadline=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(st.sampled_from(KNOBS), VALUES)
    # a string a string knob takes, whatever the draws pair (each registered scheduler's knobs
    # change which pairs a derandomized run draws)
    @example(("sync", "dispatch"), "group")
    @example(("sync", "barrier"), "turn")
    @example(("april", "resume_order"), "most_progress")
    def check(knob, value):
        name, key = knob
        tp = knob_types(REGISTRY[name])[key]
        try:
            policy = make_scheduler(name, {key: value})
        except ValueError as e:
            msg = str(e)
            assert "\n" not in msg and (key in msg or name in msg), msg
            outcome = "refused"
        else:
            assert _has_type(getattr(policy, key), tp), (name, key, value)
            outcome = "accepted"
        if _has_type(value, tp) is False:
            assert outcome == "refused", (name, key, value)
        seen[f"{_kind(value)}:{outcome}"] += 1
        event(f"{_kind(value)} {outcome}")

    with no_mined_constants():  # the examples, whichever modules (or build) are loaded
        check()
    for kind in ("bool", "int", "float", "str", "list"):
        assert seen[f"{kind}:refused"] >= 10, seen
    for kind in ("bool", "int", "float", "str", "NoneType"):
        assert seen[f"{kind}:accepted"] >= 3, seen
    assert seen["NoneType:refused"] >= 3, seen  # None where a knob is not optional
