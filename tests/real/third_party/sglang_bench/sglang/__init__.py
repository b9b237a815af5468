"""STUB (not from SGLang): an empty ``sglang`` package so that the vendored benchmark client
(``sglang/benchmark/``) imports without the real, GPU-only package."""
