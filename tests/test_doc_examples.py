"""The Python examples in the docs and in docstrings run, and print what the docs say."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("page", ["docs/notebook.md"])
def test_doc_page_examples(page):
    pytest.importorskip("pandas")
    result = doctest.testfile(str(ROOT / page), module_relative=False,
                              optionflags=doctest.ELLIPSIS)
    assert result.attempted > 5 and result.failed == 0


def test_notebook_module_doctests():
    import aprilsim.notebook

    result = doctest.testmod(aprilsim.notebook)
    assert result.attempted > 0 and result.failed == 0
