"""STUB (not from SGLang): only the name ``sglang.benchmark.serving`` imports; the mooncake
trace replay is not vendored."""


def get_mooncake_request_over_time(*args, **kwargs):
    raise NotImplementedError("the mooncake dataset is not vendored here")
