"""Which column holds the lengths (and the prompt id, and the step) when the user does not say.

Names are compared after normalisation (lower case, separators removed), so `response_length`,
`ResponseLength` and `response-length` are one name. Exact known names win; otherwise a single
column whose name contains a known stem (e.g. `mean_response_length_tokens_approx`) is taken.
"""

from __future__ import annotations

import re

from aprilsim.workload.fitting.errors import LengthDataError

LENGTH_NAMES: tuple[str, ...] = (
    "response_length",
    "response_len",
    "response_tokens",
    "completion_tokens",
    "completion_length",
    "output_length",
    "output_len",
    "output_tokens",
    "generated_tokens",
    "GeneratedTokens",
    "num_generated_tokens",
    "num_decode_tokens",
    "num_output_tokens",
    "decode_tokens",
    "gen_len",
    "generation_length",
    "response_length/mean",
    "length",
    "len",
)
LENGTH_STEMS: tuple[str, ...] = (
    "responselength",
    "responselen",
    "completiontokens",
    "outputlength",
    "outputlen",
    "generatedtokens",
    "decodetokens",
    "outputtokens",
)
GROUP_NAMES: tuple[str, ...] = ("prompt_id", "group_id", "prompt_idx", "group_index", "prompt_uid")
STEP_NAMES: tuple[str, ...] = ("step", "training_step", "global_step", "rollout_step", "train_step")


def normalise(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def find_column(columns: list[str], wanted: str, what: str) -> str:
    """The column the user named (exact, then normalised match) or a one-line error."""
    if wanted in columns:
        return wanted
    hits = [c for c in columns if normalise(c) == normalise(wanted)]
    if len(hits) == 1:
        return hits[0]
    shown = ", ".join(columns[:20]) + (" ..." if len(columns) > 20 else "")
    raise LengthDataError(f"{what} column {wanted!r} not found; columns are: {shown}")


def detect_length_column(columns: list[str]) -> str:
    """Pick the length column among `columns` or raise with the list to choose from."""
    by_norm: dict[str, list[str]] = {}
    for c in columns:
        by_norm.setdefault(normalise(c), []).append(c)
    for name in LENGTH_NAMES:
        hits = by_norm.get(normalise(name), [])
        if len(hits) == 1:
            return hits[0]
    stem_hits = [c for c in columns if any(s in normalise(c) for s in LENGTH_STEMS)]
    if len(stem_hits) == 1:
        return stem_hits[0]
    shown = ", ".join(columns[:20]) + (" ..." if len(columns) > 20 else "")
    if len(stem_hits) > 1:
        raise LengthDataError(
            f"several columns could hold lengths ({', '.join(stem_hits)}); choose one with --column"
        )
    raise LengthDataError(f"no length column found among: {shown}; name it with --column")


def detect_optional(columns: list[str], names: tuple[str, ...]) -> str | None:
    """A group/step column with an exactly known name, if there is exactly one."""
    norm = {normalise(n) for n in names}
    hits = [c for c in columns if normalise(c) in norm]
    return hits[0] if len(hits) == 1 else None
