"""STUB (not from SGLang): the one constant ``sglang.benchmark.serving`` imports from
``sglang/srt/disaggregation/utils.py`` (same value as in sglang 0.5.23)."""

FAKE_BOOTSTRAP_HOST = "2.2.2.2"
