"""MkDocs hooks: rendered pages (docstrings included) cite no issue numbers (see scrub.py), and the
Sphinx roles some docstrings use render as code."""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scrub import scrub

_ROLE = re.compile(r":(?:mod|class|func|meth|attr|data|exc|obj|py:\w+):(?=<code>)")


def on_page_content(html: str, **kwargs: object) -> str:
    """Issue numbers out; Sphinx roles left in docstrings (``:class:`X` ``) shown as plain code."""
    return scrub(_ROLE.sub("", html))
