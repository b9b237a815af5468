"""What a launch script says about its setup beyond the flags: model, GPU, dataset.

slime's flags name a checkpoint and a prompt file, not a cost model or a length distribution. This
module reads the model from `--hf-checkpoint`, the GPU vendor from the script's environment lines
(`HIP_VISIBLE_DEVICES`, ROCm), the dataset from `--prompt-data`, and maps them to an engine preset,
a trainer estimate and a response-length model. Every length model here is an estimate, sourced in
docs/scenarios.md ("Per-dataset length models"); none is a fit to a public per-sample log, because
none of these runs has published one.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from aprilsim.engine.paper_presets import MODEL_KEYS

AMD_MARKERS = re.compile(r"HIP_VISIBLE_DEVICES|ROCR_VISIBLE_DEVICES|\brocm\b|MI300|MI325|MI250",
                         re.IGNORECASE)
SIGMA = 0.93  # the default scenario's spread (10 % truncated at 16k for a 5,000-token median)


@dataclass(frozen=True)
class LengthModel:
    """A lognormal response-length model and where its median comes from."""

    median: float
    source: str
    sigma: float = SIGMA

    def as_dict(self) -> dict[str, float | str]:
        return {"family": "lognormal", "mu": round(math.log(self.median), 3), "sigma": self.sigma}


_QWEN_DAPO = ("Qwen3-4B on DAPO-Math-17k: the default scenario's derivation (10 % truncated at "
              "16k, capped mean 0.4 of the cap)")
_NO_EVIDENCE = ("no per-sample length evidence for this model and dataset is published; median "
                "scaled from {base} by dataset difficulty, range considered {lo:,}-{hi:,}")
_R1_DSR = ("DeepSeek-R1-Distill-Qwen-1.5B on DeepScaleR: mean response 5,500 tokens at the start "
           "of DeepScaleR's 8k-cap RL stage (Agentica's DeepScaleR-1.5B-Preview report); with the "
           "default spread that is a median of 5,830 (36 % truncated at 8k, 13 % at 16k)")

LENGTHS: dict[tuple[str, str], LengthModel] = {
    ("qwen3-4b", "dapo-math-17k"): LengthModel(5000, _QWEN_DAPO),
    ("qwen3-4b", "deepscaler"): LengthModel(5800, _NO_EVIDENCE.format(
        base="DAPO-Math-17k (x1.16: AIME/AMC/Omni-MATH-heavy mix)", lo=5000, hi=7000)),
    ("qwen3-4b", "deepmath-103k"): LengthModel(7000, _NO_EVIDENCE.format(
        base="DAPO-Math-17k (x1.4: difficulty levels 5-9, arXiv 2504.11456)", lo=5800, hi=9000)),
    ("r1-distill-qwen-1.5b", "deepscaler"): LengthModel(5830, _R1_DSR),
    ("r1-distill-qwen-1.5b", "dapo-math-17k"): LengthModel(5030, _NO_EVIDENCE.format(
        base="R1-1.5B on DeepScaleR (x0.86, as for Qwen3-4B)", lo=4000, hi=5830)),
    ("r1-distill-qwen-1.5b", "deepmath-103k"): LengthModel(7040, _NO_EVIDENCE.format(
        base="R1-1.5B on DeepScaleR (x1.21, as for Qwen3-4B)", lo=5830, hi=9000)),
}

# colocated Megatron step per trained token, by model (8 GPUs): the default's 4B figure scaled by
# parameters (an estimate; `aprilsim calibrate` does not fit the trainer)
TRAINER_PER_TOKEN_S = {"qwen3-4b": 1.26e-5, "qwen3-8b": 2.5e-5, "r1-distill-qwen-1.5b": 5.6e-6}

DATASETS = {"dapo-math-17k": ("dapo-math", "dapo_math", "dapo-math-17k"),
            "deepscaler": ("deepscaler",), "deepmath-103k": ("deepmath",)}


def model_key(checkpoint: str | None) -> str | None:
    """`qwen3-4b`, `r1-distill-qwen-1.5b`... from an --hf-checkpoint path, or None."""
    if not checkpoint:
        return None
    base = checkpoint.rstrip("/").rsplit("/", 1)[-1].lower()
    for name, key in sorted(MODEL_KEYS.items(), key=lambda kv: -len(kv[0])):
        if base == name or base.startswith(name + "-") or base.startswith(name + "_"):
            return key
    return None


def gpu_vendor(script: str) -> str:
    """"amd" when the script sets ROCm's device variables or names an Instinct GPU, else
    "nvidia"."""
    return "amd" if AMD_MARKERS.search(script) else "nvidia"


def dataset_key(prompt_data: str | None) -> str | None:
    """`dapo-math-17k`, `deepscaler`, `deepmath-103k` from a --prompt-data path, or None."""
    if not prompt_data:
        return None
    low = prompt_data.lower()
    for key, needles in DATASETS.items():
        if any(n in low for n in needles):
            return key
    return None


def preset_name(model: str, gpu: str, tp: int) -> str:
    """The preset naming scheme: MODEL-GPU-tpN (GPU: h100 for NVIDIA, mi300x for AMD)."""
    return f"{model}-{'mi300x' if gpu == 'amd' else 'h100'}-tp{tp}"


DEFAULT_CAP = 16384  # the cap the default length model (and every LENGTHS median) is stated for
HEAVY_TRUNCATION = 0.25  # a share of responses at the cap that says the model does not fit it


def truncated_share(lengths: dict, cap: int) -> float | None:
    """The share of a lognormal length model's responses that reach `cap` (None: not lognormal)."""
    if lengths.get("family") != "lognormal":
        return None
    z = (math.log(cap) - float(lengths["mu"])) / float(lengths["sigma"])
    return 0.5 * math.erfc(z / math.sqrt(2))


def fit_to_cap(data: dict, notes: list[str], warnings: list[str], estimated: bool) -> None:
    """Say, or correct, what the length model does at the import's response cap.

    The default model (`estimated` False: no length evidence for this model and dataset) is
    stated for a 16k cap; under another cap its median scales with the cap, so the share of
    truncated responses stays the default's (10 %) instead of, at a 2,048 cap, 83 %. A
    per-dataset estimate is kept (it is evidence about the model) with a warning when most of
    its responses would reach the cap."""
    cap, lengths = int(data["max_response_len"]), data.get("lengths", {})
    share = truncated_share(lengths, cap)
    if share is None or cap == DEFAULT_CAP:
        return
    if not estimated:
        before, median = share, math.exp(float(lengths["mu"]))
        lengths["mu"] = round(float(lengths["mu"]) + math.log(cap / DEFAULT_CAP), 3)
        notes.append(f"lengths: the default model (median {median:,.0f} tokens at a "
                     f"{DEFAULT_CAP:,} cap) scaled to the {cap:,} cap: median "
                     f"{math.exp(float(lengths['mu'])):,.0f}, {truncated_share(lengths, cap):.0%} "
                     f"truncated ({before:.0%} unscaled); an assumption: fit your own "
                     "(`aprilsim fit`) and pass it with --lengths")
    elif share > HEAVY_TRUNCATION:
        warnings.append(f"lengths: {share:.0%} of responses reach the {cap:,} cap under the "
                        f"estimate (median {math.exp(float(lengths['mu'])):,.0f}, stated for a "
                        f"{DEFAULT_CAP:,} cap): a model trained at this cap answers shorter; fit "
                        "your own (`aprilsim fit`) and pass it with --lengths")
