"""Three-state verdicts that respect the noise: a target is **met**, **missed** or **undecided**.

Every figure a target judges is a measurement with noise, so each verdict asks where the *model's*
error lies, given what the rounds say about the noise:

- an **error** (a median of |relative error| over the steps, with its noise floor ``f``): noise
  only inflates a median of absolute errors, so the model's own error lies in
  ``[err - NOISE_BAND * f, err]``. Met when ``err <= bound``; missed when even
  ``err - NOISE_BAND * f > bound``; undecided between (the error lies within its noise). With no
  floor (one round), an error above the bound is undecided: nothing tells model from noise;
- a **difference** (the gain error in pp, paired over rounds: mean +- 95 % half-width): met when
  the whole interval lies inside +-bound, missed when it lies wholly outside, undecided when it
  straddles the bound; one round gives no interval, so nothing is decided;
- a **ranking**: per pair of schedulers in predicted order, the measured throughput ratio per
  round with its interval: met when no pair is reversed beyond the tie, missed when one pair is
  reversed with its whole interval, undecided otherwise (or with one round).

A verdict carries its reason in words; a *missed* time target names its measured cause
(:mod:`aprilsim.validate.causes`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

NOISE_BAND = 2.0  # an error within twice its noise floor (about a 95 % band) is noise
MET, MISSED, UNDECIDED = "met", "missed", "undecided"
ONE_ROUND = "one round: no noise floor or interval (run --repeats >= 2 to decide)"


@dataclass(frozen=True)
class Verdict:
    """One target's state and why."""

    state: str  # MET | MISSED | UNDECIDED
    reason: str

    @property
    def met(self) -> bool | None:
        """The old boolean: True met, False missed, None undecided or not measured."""
        return {MET: True, MISSED: False}.get(self.state)

    def to_dict(self) -> dict[str, str]:
        return {"verdict": self.state, "reason": self.reason}


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def error_verdict(err: float | None, floor: float | None, bound: float,
                  cause: str | None = None) -> Verdict | None:
    """An error against its bound and noise floor (see the module docstring); None when the error
    was not measured. ``cause`` (the measured cause) goes into a *missed* reason."""
    if err is None:
        return None
    if err <= bound:
        return Verdict(MET, f"{_pct(err)} <= {_pct(bound)}")
    if floor is None:
        return Verdict(UNDECIDED, f"{_pct(err)} > {_pct(bound)}, but {ONE_ROUND}")
    low = err - NOISE_BAND * floor
    if low <= bound:
        return Verdict(UNDECIDED, f"{_pct(err)} > {_pct(bound)}, within {NOISE_BAND:.0f}x its "
                                  f"noise floor {_pct(floor)}: noise could make up the excess")
    why = f"; cause: {cause}" if cause else "; cause not measured"
    return Verdict(MISSED, f"{_pct(err)} > {_pct(bound)} beyond {NOISE_BAND:.0f}x its noise floor "
                           f"{_pct(floor)}{why}")


def interval_verdict(mean: float | None, half_width: float | None, bound: float, unit: str = "pp",
                     cause: str | None = None) -> Verdict | None:
    """A signed difference (mean +- 95 % half-width) against +-bound; None when not measured."""
    if mean is None:
        return None
    if half_width is None:
        return Verdict(UNDECIDED, f"{mean:+.1f} {unit}, but {ONE_ROUND}")
    lo, hi = mean - half_width, mean + half_width
    span = f"{mean:+.1f} +- {half_width:.1f} {unit} ([{lo:+.1f}, {hi:+.1f}])"
    if -bound <= lo and hi <= bound:
        return Verdict(MET, f"{span} inside +-{bound:g} {unit}")
    if lo > bound or hi < -bound:
        why = f"; cause: {cause}" if cause else "; cause not measured"
        return Verdict(MISSED, f"{span} wholly outside +-{bound:g} {unit}{why}")
    return Verdict(UNDECIDED, f"{span} straddles +-{bound:g} {unit}")


def ranking_verdict(pairs: Sequence[Mapping[str, Any]], tie: float) -> Verdict | None:
    """``pairs``: per pair (``a`` predicted above ``b``), ``mean`` and ``half_width`` of the
    measured ``rate_a / rate_b - 1`` over rounds (half_width None with one round). None without
    a pair (one scheduler)."""
    if not pairs:
        return None
    reversed_, open_ = [], []
    for p in pairs:
        m, hw = p["mean"], p["half_width"]
        spread = "" if hw is None else f" +- {100 * hw:.1f}"
        name = f"{p['a']} > {p['b']} ({100 * m:+.1f}%{spread})"
        if hw is None:
            open_.append(name)
        elif m + hw < -tie:
            reversed_.append(name)
        elif m - hw < -tie:
            open_.append(name)
    if reversed_:
        return Verdict(MISSED, "reversed beyond the noise: " + "; ".join(reversed_))
    if open_:
        one = all(p["half_width"] is None for p in pairs)
        return Verdict(UNDECIDED, ONE_ROUND if one else
                       f"within the noise (tie {100 * tie:.0f}%): " + "; ".join(open_))
    return Verdict(MET, f"every pair kept beyond the noise (tie {100 * tie:.0f}%)")


def agreement_verdict(share: float | None, live_share: float | None, bound: float,
                      first: str | None = None) -> Verdict | None:
    """A share of steps whose decisions agree (live against simulated) against ``bound``, beside
    the live runs' own agreement (``live_share``: the same work, round against round). Met at or
    above the bound. Below it: undecided where the live runs agree with one another no more
    often than with the simulation (their decisions at an abort's boundary are a race the
    rounds settle differently, which no deterministic simulation follows), else missed, naming
    the first mismatch; None when nothing was compared."""
    if share is None:
        return None
    if share >= bound:
        return Verdict(MET, f"{_pct(share)} >= {_pct(bound)} of the steps")
    if live_share is None:
        return Verdict(UNDECIDED, f"{_pct(share)} < {_pct(bound)}, but {ONE_ROUND}")
    if share >= live_share:
        return Verdict(UNDECIDED, f"{_pct(share)} < {_pct(bound)}, but the live rounds agree "
                                  f"with one another in only {_pct(live_share)} of the steps: "
                                  "the simulation agrees with them as often as they do among "
                                  "themselves")
    where = f"; first mismatch: {first}" if first else ""
    return Verdict(MISSED, f"{_pct(share)} < {_pct(bound)} and below the live rounds' own "
                           f"agreement {_pct(live_share)}{where}")


def combined(by: Mapping[str, Verdict | None]) -> Verdict | None:
    """The target's verdict over its schedulers: missed if one is, else undecided if one is, else
    met; None when none was measured. The reason lists the schedulers that decide it."""
    got = {k: v for k, v in by.items() if v is not None}
    if not got:
        return None
    for state in (MISSED, UNDECIDED):
        hit = {k: v for k, v in got.items() if v.state == state}
        if hit:
            return Verdict(state, "; ".join(f"{k}: {v.reason}" for k, v in hit.items()))
    return Verdict(MET, "; ".join(f"{k}: {v.reason}" for k, v in got.items()))


def summary_state(verdicts: Sequence[Verdict | None]) -> str:
    """One word for the summary line: missed > undecided > met; "not measured" when none was."""
    got = [v for v in verdicts if v is not None]
    if not got:
        return "not measured"
    for state in (MISSED, UNDECIDED):
        if any(v.state == state for v in got):
            return state
    return MET
