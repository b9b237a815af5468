# ruff: noqa
# Vendored, unmodified below this header, from the PyPI wheel sglang==0.5.23
# (sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl), path sglang/benchmark/__init__.py.
# Copyright the SGLang Team; licensed under the Apache License, Version 2.0
# (http://www.apache.org/licenses/LICENSE-2.0). See tests/real/third_party/sglang_bench/README.md.
