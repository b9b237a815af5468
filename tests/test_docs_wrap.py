"""Issue 22: the docs site's code blocks wrap long lines (a stylesheet the site loads)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_site_loads_a_stylesheet_that_wraps_code_blocks():
    config = (ROOT / "mkdocs.yml").read_text()
    sheets = re.findall(r"^extra_css:\n((?:\s+- .+\n)+)", config, flags=re.M)
    assert sheets, "mkdocs.yml has no extra_css"
    paths = [ln.split("- ", 1)[1].split("#")[0].strip() for ln in sheets[0].splitlines()]
    css = "".join((ROOT / "docs" / p).read_text() for p in paths)
    rule = re.search(r"pre\s*>\s*code\s*\{([^}]*)\}", css)
    assert rule and "white-space: pre-wrap" in rule.group(1)
