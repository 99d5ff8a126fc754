"""Product docs name no issue numbers: the pages generated from the code (docstrings, comments,
proto comments, recorded benchmark text) may still cite one; this rewrites such citations out.
The project's history, issue by issue, is CHANGELOG.md."""

from __future__ import annotations

import re

_REF = r"[Ii]ssues? #?\d+(?:\s*items?\s+[\d\-–,]+(?<![,\s]))?(?:\s*(?:/|and)\s*#?\d+)*"
_RULES = (
    (re.compile(r"\s*\((?:see )?" + _REF + r"\)"), ""),                 # " (issue N)"
    (re.compile(r"\(" + _REF + r"\s*[,;:]\s*"), "("),                   # "(issue N, the thesis" → "(the thesis"
    (re.compile(r"[,;]\s*" + _REF + r"(?=\s*[),;:.])"), ""),            # "owner join, issue N)" → "owner join)"
    (re.compile(_REF + r"'s\s+"), "the "),                               # "issue N's last step" → "the last step"
    (re.compile(r"^(\s*)" + _REF + r"\s*:\s*", re.M), r"\1"),            # "Issue N: uniform …" → "uniform …"
    (re.compile(_REF), "earlier work"),                                  # anything else
)


def scrub(text: str) -> str:
    for pattern, repl in _RULES:
        text = pattern.sub(repl, text)
    return text
