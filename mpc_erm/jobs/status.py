"""The states of a job at one member (a party's or the dealer's daemon).

::

    prepared ──► queued ──► running ──► succeeded | failed | cancelled
       │            └──────────────────► failed | cancelled
       └───────────────────────────────► refused | failed | cancelled

``prepared``: admitted here (budget reserved) but not started until every member of the job has
prepared it too (the two-phase admission of :mod:`parties.agreement`); a member's refusal ends it
``refused`` everywhere, its reason ``"<CODE>: refused by <member>: <public reason>"``
(:func:`refusal_of` reads it), its reservation released. (The refusing member itself stores no
job: it answers the others from memory.)

The values are the strings stored in every daemon's job table and sent on the wire (``GetStatus``,
``Watch`` phases, ``job status --json``): a :class:`JobStatus` *is* that string (``StrEnum``), so
``JobStatus.QUEUED == "queued"`` and a stored or received string is found in :data:`TERMINAL`.
"""

from __future__ import annotations

import enum
import re
from typing import NamedTuple

__all__ = ["BUDGET_RELEASED", "BUDGET_SPENT", "LIVE", "TERMINAL", "JobStatus", "Refusal", "refusal_of"]


class JobStatus(str, enum.Enum):
    PREPARED = "prepared"  # admitted here (budget reserved), waiting for every other member to prepare it
    QUEUED = "queued"  # every member prepared it: waiting for a worker slot
    RUNNING = "running"  # its worker process runs
    SUCCEEDED = "succeeded"  # the result is in the member's job directory
    FAILED = "failed"
    CANCELLED = "cancelled"
    REFUSED = "refused"  # a member refused it before it started anywhere (the reason names the member)

    def __str__(self) -> str:  # the stored/wire value, also in f-strings and %-formatting
        return self.value

    __format__ = str.__format__

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


#: States a job never leaves.
TERMINAL: frozenset[JobStatus] = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED,
                                           JobStatus.REFUSED})
#: States of a job that has not ended (a daemon that restarts ends them).
LIVE: frozenset[JobStatus] = frozenset({JobStatus.PREPARED, JobStatus.QUEUED, JobStatus.RUNNING})

#: What a member appends (after "; ") to the reason of a job that ended without succeeding: how it
#: settled its own budget for the job.
BUDGET_RELEASED = "budget released (nothing was revealed)"
BUDGET_SPENT = "budget spent (the job had revealed)"

_REFUSAL = re.compile(r"(?P<code>[A-Z_]+): refused by (?P<member>[a-z0-9_-]+)(?:: (?P<reason>.*))?", re.DOTALL)


class Refusal(NamedTuple):
    """A refusal's one-line reason, read."""

    code: str  # a public code (parties.public_errors): POLICY, BUDGET, ...
    member: str  # who refused
    reason: str  # its public reason

    def __str__(self) -> str:
        """The refusal as the refusing member stated it (without another member's budget note)."""
        return f"{self.code}: refused by {self.member}" + (f": {self.reason}" if self.reason else "")


def refusal_of(reason: str | None) -> Refusal | None:
    """The refusal a job's reason states (``"<CODE>: refused by <member>: <public reason>"``, the
    form :mod:`parties.agreement` relays between members), or None for any other reason."""
    text = (reason or "").strip()
    for note in (BUDGET_RELEASED, BUDGET_SPENT):  # the recording member's own settlement, not the refusal's
        text = text.removesuffix(f"; {note}")
    m = _REFUSAL.fullmatch(text)
    return None if m is None else Refusal(m["code"], m["member"], m["reason"] or "")
