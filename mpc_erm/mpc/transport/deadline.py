"""Deadlines that remember when their wait began, so a timeout reports the time actually waited.

A deadline is an absolute ``time.monotonic()`` value. :class:`Deadline` *is* that float (every
comparison and subtraction works unchanged), and also keeps ``start`` (when the wait it bounds
began), ``limit_s`` (how long it allows) and ``source`` (the setting that chose the limit, e.g.
``"deadline_s"``). One deadline often spans several calls (an all-reduce collects from every
peer against one deadline; a request's send and receive share one), so a timeout measured from
the start of the *call* that noticed it would understate the wait; :func:`waited` measures from
the deadline's own start when it has one.
"""

from __future__ import annotations

import time


class Deadline(float):
    """An absolute monotonic deadline that remembers its start, limit and the setting behind it."""

    start: float
    limit_s: float
    source: str

    def __new__(cls, limit_s: float, source: str = "", *, start: float | None = None) -> Deadline:
        begun = time.monotonic() if start is None else float(start)
        self = super().__new__(cls, begun + float(limit_s))
        self.start, self.limit_s, self.source = begun, float(limit_s), source
        return self


def seconds(x: float) -> str:
    """A limit as people write it: 100, 1.5, 0.2 (one decimal at most, no trailing zeros)."""
    return f"{x:.1f}".rstrip("0").rstrip(".")


def waited(deadline: float, since: float, now: float | None = None) -> tuple[float, float, str]:
    """(seconds waited, the limit in seconds, a text "98.2 s (limit 100 s: deadline_s)").

    ``since`` is when the calling wait began; it counts only if ``deadline`` is a plain float
    (its start is unknown): then the limit is what was left of the deadline at ``since``."""
    now = time.monotonic() if now is None else now
    if isinstance(deadline, Deadline):
        start, limit, source = deadline.start, deadline.limit_s, deadline.source
    else:
        start, limit, source = since, float(deadline) - since, ""
    spent = max(0.0, now - start)
    return spent, limit, f"{spent:.1f} s (limit {seconds(limit)} s{': ' + source if source else ''})"
