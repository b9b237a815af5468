"""STUB (not from SGLang): ``sglang/benchmark/datasets/__init__.py`` reduced to the random
datasets (the original also registers ShareGPT, MMMU, image, mooncake, ... datasets whose modules
are not vendored). ``get_dataset`` is the original function over this smaller mapping."""

from sglang.benchmark.datasets.common import BaseDataset, DatasetRow
from sglang.benchmark.datasets.random import RandomDataset

DATASET_MAPPING = {"random": RandomDataset, "random-ids": RandomDataset}


def get_dataset(args, tokenizer, model_id=None):
    dataset_name = args.dataset_name
    if dataset_name.startswith("random") and dataset_name not in DATASET_MAPPING:
        dataset_name = "random-ids"
    if dataset_name not in DATASET_MAPPING:
        raise ValueError(f"Unknown dataset: {args.dataset_name}")
    dataset = DATASET_MAPPING[dataset_name].from_args(args)
    return dataset.load(tokenizer=tokenizer, model_id=model_id)


__all__ = ["BaseDataset", "DATASET_MAPPING", "DatasetRow", "get_dataset"]
