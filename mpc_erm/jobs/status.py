"""The states of a job at one member (a party's or the dealer's daemon).

::

    prepared ──► queued ──► running ──► succeeded | failed | cancelled
       │            └──────────────────► failed | cancelled
       └───────────────────────────────► failed | cancelled

``prepared``: admitted here (budget reserved) but not started until every member of the job has
prepared it too (the two-phase admission of :mod:`parties.agreement`); a refusal anywhere ends
it failed, its reservation released.

The values are the strings stored in every daemon's job table and sent on the wire (``GetStatus``,
``Watch`` phases, ``job status --json``): a :class:`JobStatus` *is* that string (``StrEnum``), so
``JobStatus.QUEUED == "queued"`` and a stored or received string is found in :data:`TERMINAL`.
"""

from __future__ import annotations

import enum

__all__ = ["LIVE", "TERMINAL", "JobStatus"]


class JobStatus(str, enum.Enum):
    PREPARED = "prepared"  # admitted here (budget reserved), waiting for every other member to prepare it
    QUEUED = "queued"  # every member prepared it: waiting for a worker slot
    RUNNING = "running"  # its worker process runs
    SUCCEEDED = "succeeded"  # the result is in the member's job directory
    FAILED = "failed"
    CANCELLED = "cancelled"

    def __str__(self) -> str:  # the stored/wire value, also in f-strings and %-formatting
        return self.value

    __format__ = str.__format__

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


#: States a job never leaves.
TERMINAL: frozenset[JobStatus] = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})
#: States of a job that has not ended (a daemon that restarts ends them).
LIVE: frozenset[JobStatus] = frozenset({JobStatus.PREPARED, JobStatus.QUEUED, JobStatus.RUNNING})
